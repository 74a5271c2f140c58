//! `durable budget` and `show`'s spend against the ceilings, on a session its harness
//! parked at a ceiling: shown, raised (audited), active again.

use std::sync::Arc;

use durable::store::SessionStatus;
use durable::{Budget, CallError, CheckpointStore, Durable, DurableError, Message, StartOptions};
use serde_json::json;

use super::run;

/// A session that asked the model once, was refused the second time (its model-call
/// ceiling is 1) and was parked for the ceiling.
async fn parked_at_its_ceiling(store: &Arc<dyn CheckpointStore>) -> durable::SessionId {
    let durable = Durable::builder(Arc::clone(store))
        .owner("budget-worker")
        .build();
    let session = durable
        .start::<Message>(
            StartOptions::new().with_budget(
                Budget::unlimited()
                    .with_limit_model_calls(1)
                    .with_limit_tool("send_email", 2),
            ),
        )
        .await
        .expect("start");
    let ask = || async {
        session
            .journal()
            .model_with_spend(
                || async { Ok::<_, String>(json!({"text": "hi"})) },
                |_| durable::Spend::new(0.0125, 1000, 200).ok(),
            )
            .await
    };
    ask().await.expect("first reply");
    let refusal = match ask().await {
        Err(CallError::Durable(DurableError::BudgetExceeded(refusal))) => refusal,
        other => panic!("refused expected: {other:?}"),
    };
    let id = session.id().clone();
    session.park_for_budget(&refusal).await.expect("park");
    id
}

pub async fn budget(store: &Arc<dyn CheckpointStore>, db: &str) {
    let id = parked_at_its_ceiling(store).await;
    let sid = id.as_str();

    let shown = run(db, &["--json", "show", sid]).json();
    let spend = &shown["spend"];
    assert_eq!(spend["model_calls"], 1, "{spend}");
    assert_eq!(spend["spent_nano_usd"], 12_500_000);
    assert_eq!(
        spend["ceilings"],
        json!([
            {"limit": "model_calls", "spent": 1, "ceiling": 1, "reached": true},
            {"limit": "tool:send_email", "spent": 0, "ceiling": 2, "reached": false},
        ])
    );
    let text = run(db, &["show", sid]);
    let text = text.ok();
    assert!(
        text.contains("model_calls") && text.contains("REACHED"),
        "{text}"
    );
    assert!(text.contains("$0.0125"), "{text}");
    let text = run(db, &["budget", "show", sid]);
    assert!(text.ok().contains("REACHED"), "{}", text.stdout);

    // Refused before anything is written.
    run(db, &["budget", "raise", sid, "dollars", "5"]).fails(5, "unknown limit `dollars`");
    run(db, &["budget", "raise", sid, "wall_time", "soon"]).fails(5, "a duration");
    run(db, &["budget", "raise", "no-such-session", "usd", "5"]).fails(3, "not found");
    assert!(store.limit_raises(&id).await.expect("raises").is_empty());

    let raised = run(
        db,
        &[
            "--json",
            "budget",
            "raise",
            sid,
            "model_calls",
            "3",
            "--note",
            "customer approved",
            "--by",
            "alice",
        ],
    )
    .json();
    assert_eq!(raised["limit"], "model_calls");
    assert_eq!(raised["ceiling"], 3);
    assert_eq!(raised["by"], "alice");
    assert_eq!(raised["status"], "active");
    assert_eq!(
        store.session(&id).await.expect("session").status,
        SessionStatus::Active,
        "the session parked at its ceiling goes on"
    );
    let audit = store.limit_raises(&id).await.expect("raises");
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].note.as_deref(), Some("customer approved"));

    let text = run(db, &["budget", "raise", sid, "usd", "2.50"]);
    let text = text.ok();
    assert!(
        text.contains("raised the usd ceiling") && text.contains("$2.50"),
        "{text}"
    );
    let standing = run(db, &["--json", "budget", "show", sid]).json();
    assert_eq!(
        standing["ceilings"][0],
        json!({"limit": "model_calls", "spent": 1, "ceiling": 3, "reached": false})
    );
    assert_eq!(standing["raises"].as_array().map(Vec::len), Some(2));
}
