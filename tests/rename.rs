//! `#[durable_tool(crate = "...")]` in a crate that renames the dependency: the fixture
//! under `tests/rename/` must build with `cargo check` (rig's rename test).

use std::path::Path;
use std::process::Command;

#[test]
fn renamed_dependency_builds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture = root.join("tests/rename");
    // Resolve with the workspace's lock file, so the fixture builds the same dependency
    // versions as the workspace (offline, and sharing its compiled artifacts).
    std::fs::copy(root.join("Cargo.lock"), fixture.join("Cargo.lock")).expect("copy Cargo.lock");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), std::path::PathBuf::from);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["check", "--offline", "--quiet", "--manifest-path"])
        .arg(fixture.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target)
        .output()
        .expect("run cargo");
    assert!(
        output.status.success(),
        "the rename fixture does not build:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
