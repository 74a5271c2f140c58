//! The README's first example, as a newcomer uses it: copied into a new crate of its own
//! (depending on `durable` and `tokio` only), built, killed in the middle of its work and
//! run again. No email goes out twice, none is lost. The README's worker loop is built
//! with it, as the crate's library.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use durable::store::CallStatus;
use durable::{SessionId, StoreError};

/// The first ```rust block after `marker` in the README.
fn example(readme: &str, marker: &str) -> String {
    let from = readme
        .find(marker)
        .unwrap_or_else(|| panic!("the README marks the example with {marker}"));
    let rest = &readme[from..];
    let start = rest
        .find("```rust\n")
        .expect("a ```rust block after the marker")
        + "```rust\n".len();
    let end = rest[start..].find("```").expect("the block ends");
    rest[start..start + end].to_owned()
}

/// The features the README's `cargo add tokio --features …` line asks for, as a TOML array:
/// the crate is built with exactly what a newcomer adds.
fn tokio_features(readme: &str) -> String {
    let line = readme
        .lines()
        .find(|l| l.starts_with("cargo add tokio --features "))
        .expect("the README says how to add tokio");
    let features = line["cargo add tokio --features ".len()..]
        .split_whitespace()
        .next()
        .expect("a feature list");
    let quoted: Vec<String> = features.split(',').map(|f| format!("{f:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// Builds the example as the binary of a new crate and returns its path.
fn build(root: &Path, crate_dir: &Path) -> PathBuf {
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    std::fs::create_dir_all(crate_dir.join("src")).expect("src");
    std::fs::write(
        crate_dir.join("src/main.rs"),
        example(&readme, "<!-- first-agent -->"),
    )
    .expect("main.rs");
    // The worker loop of "Resume, after a restart", as the crate's library.
    std::fs::write(
        crate_dir.join("src/lib.rs"),
        example(&readme, "<!-- resume-example -->") + "\npub mod children;\npub mod signals;\n",
    )
    .expect("lib.rs");
    // The coordinator of "Child sessions and cancellation", as a module of it.
    std::fs::write(
        crate_dir.join("src/children.rs"),
        example(&readme, "<!-- children-example -->"),
    )
    .expect("children.rs");
    // The agent of "Signals: steering a running session", as another.
    std::fs::write(
        crate_dir.join("src/signals.rs"),
        example(&readme, "<!-- signals-example -->"),
    )
    .expect("signals.rs");
    let manifest = format!(
        "[package]\nname = \"first-agent\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [dependencies]\ndurable = {{ path = {root:?} }}\n\
         tokio = {{ version = \"1\", features = {tokio_features} }}\n\
         serde_json = \"1\"\n\n\
         [workspace]\n",
        root = root.display().to_string(),
        tokio_features = tokio_features(&readme),
    );
    std::fs::write(crate_dir.join("Cargo.toml"), manifest).expect("Cargo.toml");
    // The workspace's lock file: the same dependency versions, offline, and the workspace's
    // compiled artifacts where the features agree.
    std::fs::copy(root.join("Cargo.lock"), crate_dir.join("Cargo.lock")).expect("Cargo.lock");
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "--offline", "--quiet", "--manifest-path"])
        .arg(crate_dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo");
    assert!(
        output.status.success(),
        "the README's examples do not build in a crate of their own:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    target.join("debug").join("first-agent")
}

fn start(binary: &Path, dir: &Path) -> Child {
    Command::new(binary)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agent")
}

fn outbox(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("outbox.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits until the journal holds `n` completed `send_email` calls.
async fn wait_for_recorded(dir: &Path, n: usize, child: &mut Child) {
    let url = format!("sqlite:{}", dir.join("agent.db").display());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "the agent exited before recording {n} emails"
        );
        assert!(
            Instant::now() < deadline,
            "{n} emails not recorded within 60 s"
        );
        if let Ok(store) = durable::connect_read_only(&url).await {
            match store.calls(&SessionId::new("onboard-ann"), None).await {
                Ok(calls) => {
                    let done = calls
                        .iter()
                        .filter(|c| {
                            c.identity.tool == "send_email" && c.status == CallStatus::Completed
                        })
                        .count();
                    if done >= n {
                        return;
                    }
                }
                Err(StoreError::SessionNotFound(_)) => {}
                Err(e) => panic!("reading the journal: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_example_builds_alone_and_survives_a_kill() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = tempfile::tempdir().expect("tempdir");
    let binary = build(root, &scratch.path().join("first-agent"));
    let run = scratch.path().join("run");
    std::fs::create_dir(&run).expect("run dir");

    // Kill it while "the model thinks" after the second email was sent and recorded, before
    // the checkpoint: the resumed run re-runs that turn.
    let mut first = start(&binary, &run);
    wait_for_recorded(&run, 2, &mut first).await;
    first.kill().expect("SIGKILL");
    first.wait().expect("reap");
    assert_eq!(
        outbox(&run).len(),
        2,
        "two emails went out before the kill: {:?}",
        outbox(&run)
    );

    let second = start(&binary, &run).wait_with_output().expect("second run");
    assert!(
        second.status.success(),
        "the resumed run failed:\n{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert!(
        stdout.contains("sent to ann@example.com: Your account is ready."),
        "the resumed run replays the recorded second email:\n{stdout}"
    );
    assert_eq!(
        outbox(&run),
        [
            "to ann@example.com: Welcome aboard!",
            "to ann@example.com: Your account is ready.",
            "to ann@example.com: How are we doing?",
        ],
        "every email exactly once"
    );

    // A third run finds the session completed and says so.
    let third = start(&binary, &run).wait_with_output().expect("third run");
    let stderr = String::from_utf8_lossy(&third.stderr);
    assert!(
        !third.status.success() && stderr.contains("NotResumable"),
        "a completed session is not run again, and the README says it fails with NotResumable:\n{stderr}"
    );
    assert_eq!(outbox(&run).len(), 3, "nothing sent by the third run");
}

/// The README's "Budgets" section shows code that compiles and runs: each of its
/// ```rust blocks is in `examples/budget.rs` (which CI builds and runs), line for line.
#[test]
fn the_budgets_section_is_the_example_that_runs() {
    let readme = include_str!("../README.md");
    let example: Vec<&str> = include_str!("../examples/budget.rs")
        .lines()
        .map(str::trim)
        .collect();
    let from = readme
        .find("## Budgets")
        .expect("the README has a Budgets section");
    let section = &readme[from..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut blocks = 0;
    let mut rest = section;
    while let Some(start) = rest.find("```rust\n") {
        let body = &rest[start + "```rust\n".len()..];
        let end = body.find("```").expect("the block ends");
        let lines: Vec<&str> = body[..end].lines().map(str::trim).collect();
        assert!(
            example.windows(lines.len()).any(|w| w == lines.as_slice()),
            "this README block is not in examples/budget.rs:\n{}",
            &body[..end]
        );
        blocks += 1;
        rest = &body[end..];
    }
    assert_eq!(blocks, 2, "the setup and the handler");
}
