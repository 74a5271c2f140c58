//! The operator surface against a hostile store, on every backend: text the store holds
//! (written by a model, an agent, or whoever can write the database) reaches the
//! terminal escaped and clipped, and whole in `--json`.

use std::sync::Arc;
use std::time::Duration;

use durable::{Block, CheckpointStore, Durable, Message, SessionId, StartOptions};
use serde_json::{Value, json};

use super::{Run, read_order, run};

/// Retitles the terminal, turns it red, clears the screen through a C1 CSI, returns the
/// cursor over what came before, and reverses the rest.
pub const EVIL: &str =
    "\x1b]0;pwned\x07 \x1b[1;31mred\x1b[0m \u{9b}2J hidden\rshown \u{202e}desrever \x08\x7f";

/// The visible form of [`EVIL`]'s first sequence.
pub const EVIL_SHOWN: &str = "\\e]0;pwned\\u{7}";

/// Bytes and characters that must never reach a terminal from the store.
#[track_caller]
pub fn assert_terminal_safe(what: &str, text: &str) {
    for (i, c) in text.char_indices() {
        let bad = (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        assert!(
            !bad,
            "{what}: raw {c:?} at byte {i}: {:?}",
            &text[i.saturating_sub(40)..(i + 40).min(text.len())]
        );
    }
}

/// Asserts both streams of a run are terminal-safe.
#[track_caller]
pub fn assert_run_safe(what: &str, out: &Run) {
    assert_terminal_safe(&format!("{what} (stdout)"), &out.stdout);
    assert_terminal_safe(&format!("{what} (stderr)"), &out.stderr);
}

/// A failed session whose transcript, tool call, tool result, metadata and status
/// reason all carry [`EVIL`].
pub async fn populate_hostile(store: &Arc<dyn CheckpointStore>) -> SessionId {
    let worker = Durable::builder(Arc::clone(store))
        .owner("worker-evil")
        .app_version("shop/1")
        .renew_leases(false)
        .lease_ttl(Duration::from_secs(600))
        .build();
    let id = SessionId::new("s-evil");
    let mut session = worker
        .start(
            StartOptions::new()
                .with_id(id.clone())
                .with_metadata(json!({"customer": EVIL}))
                .with_messages(vec![Message::user(EVIL)]),
        )
        .await
        .expect("start s-evil");
    let turn: Message = session
        .model(|| async {
            Ok::<_, String>(Message::assistant(vec![
                Block::text(EVIL),
                Block::tool_call("c1", "read_order", json!({"order_id": EVIL})),
            ]))
        })
        .await
        .expect("model");
    session.push(turn);
    let result: Value = session
        .journal()
        .tool(&read_order(), json!({"order_id": EVIL}))
        .run(|_ctx| async { Ok::<_, String>(json!({"order": EVIL})) })
        .await
        .expect("read_order");
    session.push(Message::tool_result("c1", result, false));
    session.checkpoint().await.expect("checkpoint");
    session.fail(EVIL).await.expect("fail");
    id
}

pub async fn hostile_text(store: &Arc<dyn CheckpointStore>, db: &str) {
    let id = populate_hostile(store).await;

    let show = run(db, &["show", id.as_str()]);
    let text = show.ok();
    assert_run_safe("show", &show);
    assert!(
        text.contains(EVIL_SHOWN),
        "the text is shown, escaped:\n{text}"
    );
    assert!(text.contains("\\u{9b}2J"), "{text}");
    assert!(text.contains("\\u{202e}desrever"), "{text}");

    for args in [
        vec!["sessions"],
        vec!["calls", id.as_str()],
        vec!["in-doubt"],
        vec!["export", id.as_str(), "--out", "/nonexistent/\x1b]0;x\x07"],
    ] {
        let out = run(db, &args);
        assert_run_safe(&args.join(" "), &out);
    }
    let sessions = run(db, &["sessions"]);
    assert!(
        sessions.ok().contains("failed (\\e]0;pwned"),
        "{}",
        sessions.stdout
    );

    // JSON keeps every value whole and exact, its escapes standing for the controls.
    let json = run(db, &["show", id.as_str(), "--json"]);
    assert_run_safe("show --json", &json);
    let value = json.json();
    assert_eq!(value["session"]["status_reason"], EVIL);
    assert_eq!(value["session"]["metadata"]["customer"], EVIL);
    let tail = value["transcript_tail"].to_string();
    assert!(tail.contains(&Value::from(EVIL).to_string()), "{tail}");
    let listed = run(db, &["sessions", "--json"]).json();
    assert_eq!(listed[0]["status_reason"], EVIL, "{listed}");
    let calls = run(db, &["calls", id.as_str(), "--json"]).json();
    assert!(
        calls
            .as_array()
            .expect("array")
            .iter()
            .any(|c| c["result"]["order"] == EVIL),
        "{calls}"
    );
}
