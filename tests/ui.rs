//! Compile-time rules of `#[durable_tool]` (trybuild): every rejected attribute, signature
//! and type, with its pinned message, and the shapes that must keep compiling.
//!
//! Runs only on the pinned toolchain (`rust-toolchain.toml`): compiler messages change
//! between releases. Regenerate snapshots with `TRYBUILD=overwrite` and review the diff.

/// The pinned messages of some cases list other types that implement a trait, and that
/// list depends on the crates in the build: the cases run with the facade's default
/// features (`scripts/test.sh` runs them so, before the workspace), and a build with an
/// integration feature (rmcp, rig, async-openai bring more implementations) skips them.
#[rustversion::stable(1.95)]
#[cfg(not(any(feature = "mcp", feature = "rig", feature = "openai")))]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}

/// `durable::postgres` exists only with the `postgres` feature: what a user who forgot
/// the feature reads. `scripts/test.sh` runs it with the default features; the
/// workspace run has every feature on.
#[rustversion::stable(1.95)]
#[cfg(not(feature = "postgres"))]
#[test]
fn feature_gates() {
    trybuild::TestCases::new().compile_fail("tests/ui/feature/*.rs");
}

/// Items that moved keep their old paths as deprecated aliases, whose warnings name the
/// new paths (CHANGELOG.md lists every move).
#[rustversion::stable(1.95)]
#[test]
fn moved_paths() {
    trybuild::TestCases::new().compile_fail("tests/ui/moved/*.rs");
}
