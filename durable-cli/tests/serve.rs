//! `durable serve`: the built binary serves the console over a real SQLite store, prints
//! its URL and generated token, answers only with that token, refuses a non-loopback
//! bind without `--allow-remote`, and serves read-only when asked.

mod cli_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use cli_support::{durable_env, populate};
use durable::CheckpointStore;
use durable::sqlite::SqliteStore;

/// A `durable serve` process, killed on drop.
struct Served {
    child: Child,
    /// Kept open: the server may still print.
    _stdout: std::io::Lines<BufReader<std::process::ChildStdout>>,
    url: String,
    token: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn serve(db: &str, extra: &[&str]) -> Served {
    let bind = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_durable"))
        .args(["--db", db, "serve", "--bind", &bind])
        .args(extra)
        .env_remove("DURABLE_CONSOLE_TOKEN")
        .env_remove("DURABLE_MAC_KEY")
        .env_remove("DURABLE_PREVIOUS_MAC_KEYS")
        .env("USER", "test-operator")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start durable serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let url = lines.next().and_then(Result::ok).unwrap_or_default();
    let token = lines.next().and_then(Result::ok).unwrap_or_default();
    let url = url
        .strip_prefix("durable console: ")
        .unwrap_or_else(|| panic!("first line: {url:?}"))
        .trim_end_matches('/')
        .to_owned();
    let token = token
        .strip_prefix("token: ")
        .and_then(|t| t.split(' ').next())
        .unwrap_or_else(|| panic!("second line: {token:?}"))
        .to_owned();
    assert_eq!(url, format!("http://{bind}"));
    assert_eq!(token.len(), 64, "32 random bytes, hex: {token}");
    Served {
        child,
        _stdout: lines,
        url,
        token,
    }
}

/// `GET path` over HTTP/1.1; the status code and the body.
fn get(url: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let host = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).expect("connect");
    let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"
    )
    .expect("send");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read");
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, reply)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_prints_its_url_and_token_and_needs_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let store: Arc<dyn CheckpointStore> =
        Arc::new(SqliteStore::open(&path).await.expect("open store"));
    populate(&store).await;
    let db = path.to_str().expect("utf-8 path");

    let served = serve(db, &[]);
    let (status, _) = get(&served.url, "/", None);
    assert_eq!(status, 303, "to the login form");
    let (status, _) = get(&served.url, "/", Some("wrong"));
    assert_eq!(status, 401);
    let (status, page) = get(&served.url, "/", Some(&served.token));
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("s-doubt") && page.contains("s-done"),
        "{page}"
    );
    let (status, page) = get(&served.url, "/in-doubt", Some(&served.token));
    assert_eq!(status, 200);
    assert!(
        page.contains("send_email") && !page.contains("tok-live-123"),
        "{page}"
    );
    assert!(!page.contains("Read-only"), "{page}");
    drop(served);

    let read_only = serve(db, &["--read-only"]);
    let (_, page) = get(&read_only.url, "/in-doubt", Some(&read_only.token));
    assert!(
        page.contains("Read-only: </strong>started with --read-only"),
        "{page}"
    );
}

#[test]
fn serve_refuses_a_remote_bind_unless_allowed() {
    let out = durable_env(
        &["--db", "/no/such.db", "serve", "--bind", "0.0.0.0:7878"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is not a loopback address") && stderr.contains("--allow-remote"),
        "{stderr}"
    );
    let out = durable_env(&["serve", "--help"], &[]);
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--bind <ADDR>",
        "[default: 127.0.0.1:7878]",
        "--allow-remote",
        "DURABLE_CONSOLE_TOKEN",
    ] {
        assert!(help.contains(needle), "{needle:?} in\n{help}");
    }
}

/// A store sealed with an application key refuses to open, even read-only, without that
/// key (durable-core's `Keyring::readable`): `serve` says so in one line, as `resolve`
/// does, and serves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_store_needs_its_key() {
    use durable::integrity::Keyring;
    use durable::sqlite::SqliteStoreOptions;

    let key = "console-test-key-0123456789";
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("signed.db");
    let ring = Keyring::with_app_key(key.as_bytes().to_vec()).expect("key");
    let store = SqliteStore::connect_with(SqliteStoreOptions::file(&path).keyring(ring))
        .await
        .expect("create a signed store");
    store.close().await;
    let db = path.to_str().expect("utf-8 path");

    let out = durable_env(&["--db", db, "serve", "--bind", "127.0.0.1:1"], &[]);
    assert_eq!(out.status.code(), Some(6));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: key `app-") && stderr.contains("DURABLE_MAC_KEY"),
        "{stderr}"
    );
}
