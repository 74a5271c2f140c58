//! Compile-time rules of `#[durable_tool]` (trybuild): every rejected attribute, signature
//! and type, with its pinned message, and the shapes that must keep compiling.
//!
//! Runs only on the pinned toolchain (`rust-toolchain.toml`): compiler messages change
//! between releases. Regenerate snapshots with `TRYBUILD=overwrite` and review the diff.

#[rustversion::stable(1.95)]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}

/// `durable::postgres` exists only with the `postgres` feature: what a user who forgot
/// the feature reads. CI runs it alone with the feature off (`cargo test -p durable
/// --test ui feature_gates`); the workspace run has every feature on.
#[rustversion::stable(1.95)]
#[cfg(not(feature = "postgres"))]
#[test]
fn feature_gates() {
    trybuild::TestCases::new().compile_fail("tests/ui/feature/*.rs");
}
