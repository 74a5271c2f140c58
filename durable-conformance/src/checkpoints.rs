//! Cases: checkpoints (compare-and-set, transcripts, JSON fidelity).

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    CLOCK_SLACK_MS, LONG_TTL, checkpoint, create, create_with, expect_err, message, new_session,
    now, owner, read, session_id,
};
use durable_core::error::StoreError;
use durable_core::store::{Checkpoint, CheckpointStore, NewCheckpoint, SessionStatus};

/// A loaded checkpoint's messages, each stored text parsed into a `Value` (to compare
/// with the values written).
pub(super) fn values(checkpoint: &Checkpoint) -> Vec<Value> {
    checkpoint
        .message_values()
        .unwrap_or_else(|e| panic!("the stored messages are not JSON: {e}"))
}

/// Loads `version` (`None` = latest), panicking with context.
pub(super) async fn load(
    store: &dyn CheckpointStore,
    id: &durable_core::ids::SessionId,
    version: Option<i64>,
) -> Checkpoint {
    store
        .load_checkpoint(id, version)
        .await
        .unwrap_or_else(|e| panic!("load_checkpoint(`{id}`, {version:?}) failed: {e:?}"))
}

/// Version 0, written by `create_session`, holds the initial plan, budget, state and
/// messages.
pub async fn checkpoint_initial_is_version_zero(store: Arc<dyn CheckpointStore>) {
    let new = new_session(&owner("w"), LONG_TTL);
    let before = now(&*store).await;
    let (session, _) = create_with(&*store, new.clone()).await;
    for version in [None, Some(0)] {
        let cp = load(&*store, &session.id, version).await;
        assert_eq!(cp.meta.session, session.id, "checkpoint session");
        assert_eq!(cp.meta.version, 0, "the initial checkpoint is version 0");
        assert_eq!(values(&cp), new.initial.messages, "initial messages");
        assert_eq!(cp.plan, new.initial.plan, "initial plan");
        assert_eq!(cp.budget, new.initial.budget, "initial budget");
        assert_eq!(cp.state, new.initial.state, "initial state");
        assert_eq!(cp.meta.message_count, 2, "initial message_count");
        assert!(
            cp.meta.last_seq > 0,
            "last_seq of a non-empty transcript must be > 0"
        );
        assert_eq!(cp.meta.app_version, "v1", "checkpoint app_version");
        assert!(
            cp.meta.created_at >= before - CLOCK_SLACK_MS,
            "checkpoint created_at"
        );
    }
    // An empty initial transcript has last_seq 0.
    let mut empty = new_session(&owner("w"), LONG_TTL);
    empty.initial = checkpoint("empty", vec![]);
    let (session, _) = create_with(&*store, empty).await;
    let cp = load(&*store, &session.id, Some(0)).await;
    assert!(cp.messages.is_empty(), "empty initial transcript");
    assert_eq!(
        (cp.meta.last_seq, cp.meta.message_count),
        (0, 0),
        "empty transcript last_seq/message_count"
    );
}

/// A save with the wrong expected version fails with `VersionConflict` naming both
/// versions, and writes nothing.
pub async fn checkpoint_cas_conflict_writes_nothing(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let meta = store
        .save_checkpoint(lease.fence(), 0, checkpoint("one", vec![message(2)]))
        .await
        .expect("save_checkpoint(expected 0)");
    assert_eq!(meta.version, 1, "the first save writes version 1");
    assert_eq!(
        meta.message_count, 3,
        "message_count after appending one message"
    );
    let listed = store
        .list_checkpoints(&session.id)
        .await
        .expect("list_checkpoints");
    let before = load(&*store, &session.id, None).await;
    let record = read(&*store, &session.id).await;
    assert_eq!(record.latest_version, 1, "latest_version after a save");

    for wrong in [0, 2, 7, -1] {
        let (expected, actual) = expect_err!(
            store
                .save_checkpoint(lease.fence(), wrong, checkpoint("bad", vec![message(50), message(51)]))
                .await,
            StoreError::VersionConflict { session: s, expected, actual } => {
                assert_eq!(s, session.id, "VersionConflict names another session");
                (expected, actual)
            },
            "save_checkpoint(expected {wrong}) when the latest is 1"
        );
        assert_eq!(
            (expected, actual),
            (wrong, 1),
            "VersionConflict {{expected, actual}}"
        );
    }
    assert_eq!(
        store.list_checkpoints(&session.id).await.expect("list"),
        listed,
        "a conflict wrote a checkpoint"
    );
    assert_eq!(
        load(&*store, &session.id, None).await,
        before,
        "a conflict changed the latest checkpoint"
    );
    let next = store
        .save_checkpoint(lease.fence(), 1, checkpoint("two", vec![message(3)]))
        .await
        .expect("save_checkpoint(expected 1)");
    assert_eq!(next.version, 2, "version after the conflicts");
    let cp = load(&*store, &session.id, None).await;
    assert_eq!(
        values(&cp),
        vec![message(0), message(1), message(2), message(3)],
        "messages of a refused save leaked into the log"
    );
}

/// The final checkpoint and the session's completion are one write: after it, the
/// checkpoint is the latest, the session `completed` and its lease gone (a straggler of
/// the holder writes nothing more); a refused one (wrong version, stale lease) writes
/// neither, and the session goes on as before.
pub async fn checkpoint_completion_is_one_write(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let (expected, actual) = expect_err!(
        store
            .complete_with_checkpoint(lease.fence(), 3, checkpoint("final", vec![message(2)]))
            .await,
        StoreError::VersionConflict { expected, actual, .. } => (expected, actual),
        "complete_with_checkpoint(expected 3) when the latest is 0"
    );
    assert_eq!(
        (expected, actual),
        (3, 0),
        "VersionConflict {{expected, actual}}"
    );
    let record = read(&*store, &session.id).await;
    assert_eq!(
        (record.status, record.latest_version),
        (SessionStatus::Active, 0),
        "a refused completion wrote its checkpoint or its status"
    );
    store
        .renew_lease(&lease, LONG_TTL)
        .await
        .expect("a refused completion left the lease to its holder");

    let meta = store
        .complete_with_checkpoint(lease.fence(), 0, checkpoint("final", vec![message(2)]))
        .await
        .expect("complete_with_checkpoint(expected 0)");
    assert_eq!(meta.version, 1, "the final checkpoint is version 1");
    let record = read(&*store, &session.id).await;
    assert_eq!(record.status, SessionStatus::Completed, "completed with it");
    assert_eq!(record.latest_version, 1, "latest_version");
    assert!(record.fence > lease.fence, "the token moved on");
    let cp = load(&*store, &session.id, None).await;
    assert_eq!(
        cp.state,
        json!({"state": "final"}),
        "the final checkpoint's state"
    );
    assert_eq!(
        values(&cp),
        vec![message(0), message(1), message(2)],
        "the final checkpoint's transcript"
    );
    expect_err!(
        store
            .save_checkpoint(lease.fence(), 1, checkpoint("after", vec![]))
            .await,
        StoreError::LeaseLost { .. } => (),
        "a checkpoint under the completed session's old lease"
    );
    expect_err!(
        store
            .complete_with_checkpoint(lease.fence(), 1, checkpoint("again", vec![]))
            .await,
        StoreError::LeaseLost { .. } => (),
        "a second completion under the old lease"
    );
    assert_eq!(
        read(&*store, &session.id).await.latest_version,
        1,
        "a write under the old lease landed"
    );
}

/// Concurrent writers with the same expected version: exactly one wins each round, and
/// free-running writers never fork the history.
pub async fn checkpoint_concurrent_writers_never_fork(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let lease = Arc::new(lease);
    let mut latest = 0;
    for round in 0..3 {
        let mut tasks = Vec::new();
        for writer in 0..50 {
            let store = Arc::clone(&store);
            let lease = Arc::clone(&lease);
            tasks.push(tokio::spawn(async move {
                let msg = json!({"round": round, "writer": writer});
                let result = store
                    .save_checkpoint(lease.fence(), latest, checkpoint("race", vec![msg.clone()]))
                    .await;
                (msg, result)
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            match task.await.expect("writer panicked") {
                (msg, Ok(meta)) => winners.push((msg, meta)),
                (
                    _,
                    Err(StoreError::VersionConflict {
                        expected, actual, ..
                    }),
                ) => {
                    assert_eq!(
                        (expected, actual),
                        (latest, latest + 1),
                        "VersionConflict of a losing writer"
                    );
                }
                (_, Err(other)) => panic!(
                    "concurrent save_checkpoint: expected Ok or VersionConflict, got {other:?}"
                ),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: exactly one of 50 writers expecting {latest} must win"
        );
        let (msg, meta) = &winners[0];
        assert_eq!(meta.version, latest + 1, "winner's version");
        latest += 1;
        let cp = load(&*store, &session.id, None).await;
        assert_eq!(
            values(&cp).last(),
            Some(msg),
            "the winner's message must end the transcript"
        );
        assert_eq!(
            cp.messages.len() as i64,
            2 + latest,
            "one message per version: losers appended messages"
        );
    }

    // Free-running writers: read latest, try to save, retry on conflict.
    let mut tasks = Vec::new();
    for writer in 0..6 {
        let store = Arc::clone(&store);
        let lease = Arc::clone(&lease);
        let id = session.id.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            let mut n = 0;
            while mine.len() < 5 {
                let latest = store.session(&id).await.expect("session").latest_version;
                let msg = json!({"writer": writer, "n": n});
                n += 1;
                match store
                    .save_checkpoint(lease.fence(), latest, checkpoint("free", vec![msg.clone()]))
                    .await
                {
                    Ok(meta) => mine.push((meta.version, msg)),
                    Err(StoreError::VersionConflict { .. }) => {}
                    Err(other) => panic!("free-running save_checkpoint: {other:?}"),
                }
            }
            mine
        }));
    }
    let mut wins = Vec::new();
    for task in tasks {
        wins.extend(task.await.expect("writer panicked"));
    }
    wins.sort_by_key(|(v, _)| *v);
    let versions: Vec<i64> = wins.iter().map(|(v, _)| *v).collect();
    let expected: Vec<i64> = (latest + 1..=latest + 30).collect();
    assert_eq!(
        versions, expected,
        "successful saves must get unique, contiguous versions"
    );
    let listed = store
        .list_checkpoints(&session.id)
        .await
        .expect("list_checkpoints");
    let listed_versions: Vec<i64> = listed.iter().map(|m| m.version).collect();
    assert_eq!(
        listed_versions,
        (0..=latest + 30).collect::<Vec<_>>(),
        "list_checkpoints versions"
    );
    let cp = load(&*store, &session.id, None).await;
    let tail: Vec<Value> = values(&cp)[(2 + latest) as usize..].to_vec();
    let winners: Vec<Value> = wins.into_iter().map(|(_, m)| m).collect();
    assert_eq!(
        tail, winners,
        "the transcript must hold exactly the winners' messages, in version order"
    );
    for meta in &listed {
        assert_eq!(
            meta.message_count,
            2 + meta.version,
            "message_count of version {}",
            meta.version
        );
    }
}

/// Every old version loads with exactly its own transcript, including versions that
/// appended several messages or none.
pub async fn checkpoint_old_versions_keep_their_transcript(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let batches: Vec<Vec<Value>> = vec![
        vec![message(2), message(3), message(4)],
        vec![],
        vec![message(5)],
        vec![],
        vec![message(6), message(7)],
    ];
    let mut transcript = vec![message(0), message(1)];
    let mut expected = vec![(
        transcript.clone(),
        json!({"plan": "initial", "steps": ["initial", "done"]}),
    )];
    let mut last_seq = load(&*store, &session.id, Some(0)).await.meta.last_seq;
    for (i, batch) in batches.into_iter().enumerate() {
        let tag = format!("v{}", i + 1);
        let grew = !batch.is_empty();
        transcript.extend(batch.clone());
        let meta = store
            .save_checkpoint(lease.fence(), i as i64, checkpoint(&tag, batch))
            .await
            .expect("save_checkpoint");
        assert_eq!(
            meta.message_count,
            transcript.len() as i64,
            "message_count of version {}",
            meta.version
        );
        if grew {
            assert!(
                meta.last_seq > last_seq,
                "last_seq must grow when messages are appended"
            );
        } else {
            assert_eq!(
                meta.last_seq, last_seq,
                "last_seq must not move when no message is appended"
            );
        }
        last_seq = meta.last_seq;
        expected.push((
            transcript.clone(),
            json!({"plan": tag, "steps": [tag, "done"]}),
        ));
    }
    for (version, (messages, plan)) in expected.iter().enumerate() {
        let cp = load(&*store, &session.id, Some(version as i64)).await;
        assert_eq!(cp.meta.version, version as i64, "loaded version");
        assert_eq!(&values(&cp), messages, "transcript of version {version}");
        assert_eq!(&cp.plan, plan, "plan of version {version}");
    }
}

/// Messages, plans, budgets and state round-trip exactly: unicode, escapes, nesting,
/// big integers, floats and key order.
pub async fn checkpoint_json_round_trips_exactly(store: Arc<dyn CheckpointStore>) {
    let mut deep = json!("bottom");
    for i in 0..60 {
        deep = if i % 2 == 0 {
            json!([deep])
        } else {
            json!({"d": deep})
        };
    }
    let messages = vec![
        json!({"z": 1, "a": 2, "m": {"y": [3, 2, 1], "b": null}}),
        json!({"text": "héllo wörld — 日本語 🦀 e\u{301} \u{202e}rtl", "ctrl": "tab\t nl\n cr\r nul\u{0} bell\u{7}"}),
        json!({"quotes": "\"double\" 'single' \\back\\slash /slash", "html": "<script>&amp;</script>"}),
        json!({"floats": [0.1, 1.5, -2.25, 1e300, 5e-324, 1.0000000000000002, 123456.789]}),
        json!({"ints": [0, -1, i64::MIN, i64::MAX, u64::MAX, 9007199254740993_u64]}),
        json!({"empty_obj": {}, "empty_arr": [], "empty_str": "", "bools": [true, false]}),
        deep,
        json!("a bare string message"),
        json!(42),
        json!(null),
        json!({"big": "x".repeat(300_000)}),
    ];
    let plan = json!({"steps": [{"id": "β", "done": false, "w": 0.3}], "ünïcode": "✓"});
    let budget = json!({"usd": 12.345678901234567, "tokens": u64::MAX});
    let state = json!({"nested": {"k": [1, {"v": "🦀"}]}});
    let mut new = new_session(&owner("w"), LONG_TTL);
    new.metadata = json!({"meta": "日本", "n": 1.25});
    new.initial = NewCheckpoint {
        messages: messages[..3].to_vec(),
        plan: plan.clone(),
        budget: budget.clone(),
        state: state.clone(),
        wake_at: None,
    };
    let (session, lease) = create_with(&*store, new.clone()).await;
    assert_eq!(
        read(&*store, &session.id).await.metadata,
        new.metadata,
        "metadata round-trip"
    );
    store
        .save_checkpoint(
            lease.fence(),
            0,
            NewCheckpoint {
                messages: messages[3..].to_vec(),
                plan: plan.clone(),
                budget: budget.clone(),
                state: state.clone(),
                wake_at: None,
            },
        )
        .await
        .expect("save_checkpoint");
    let cp = load(&*store, &session.id, None).await;
    assert_eq!(cp.messages.len(), messages.len(), "message count");
    for (i, (got, want)) in values(&cp).iter().zip(&messages).enumerate() {
        assert!(got == want, "message {i} changed in the round-trip");
        // With serde_json's `preserve_order` the serialization shows the stored key order.
        assert_eq!(
            serde_json::to_string(got).expect("serialize"),
            serde_json::to_string(want).expect("serialize"),
            "message {i} does not serialize identically after the round-trip"
        );
    }
    for (what, got, want) in [
        ("plan", &cp.plan, &plan),
        ("budget", &cp.budget, &budget),
        ("state", &cp.state, &state),
    ] {
        assert_eq!(got, want, "{what} round-trip");
        assert_eq!(
            serde_json::to_string(got).expect("serialize"),
            serde_json::to_string(want).expect("serialize"),
            "{what} does not serialize identically after the round-trip"
        );
    }
    let v0 = load(&*store, &session.id, Some(0)).await;
    assert_eq!(
        values(&v0),
        messages[..3].to_vec(),
        "version 0 after the round-trip"
    );
}

/// `list_checkpoints` lists every version oldest first with its counts.
pub async fn checkpoint_list_is_oldest_first(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let mut metas = vec![load(&*store, &session.id, Some(0)).await.meta];
    for i in 0..4 {
        metas.push(
            store
                .save_checkpoint(
                    lease.fence(),
                    i,
                    checkpoint("x", vec![message(10 + i as usize); (i % 2) as usize + 1]),
                )
                .await
                .expect("save_checkpoint"),
        );
    }
    let listed = store
        .list_checkpoints(&session.id)
        .await
        .expect("list_checkpoints");
    assert_eq!(
        listed, metas,
        "list_checkpoints must equal the metas save_checkpoint returned, oldest first"
    );
    for (meta, expected) in listed.iter().zip([2, 3, 5, 6, 8]) {
        assert_eq!(
            meta.message_count, expected,
            "message_count of version {}",
            meta.version
        );
        assert_eq!(meta.session, session.id, "meta session");
        let cp = load(&*store, &session.id, Some(meta.version)).await;
        assert_eq!(
            &cp.meta, meta,
            "load_checkpoint meta of version {}",
            meta.version
        );
    }
    for pair in listed.windows(2) {
        assert!(
            pair[1].last_seq > pair[0].last_seq,
            "last_seq must grow with appended messages"
        );
        assert!(
            pair[1].created_at >= pair[0].created_at,
            "created_at must not go back"
        );
    }
    let other = store.list_checkpoints(&session_id()).await;
    if let Ok(list) = other {
        assert!(
            list.is_empty(),
            "list_checkpoints of a missing session listed {list:?}"
        );
    }
}

/// Loading a version that does not exist is `VersionNotFound`.
pub async fn checkpoint_missing_version_is_not_found(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    store
        .save_checkpoint(lease.fence(), 0, checkpoint("one", vec![]))
        .await
        .expect("save_checkpoint");
    for missing in [2, 100, -1] {
        let (s, v) = expect_err!(
            store.load_checkpoint(&session.id, Some(missing)).await,
            StoreError::VersionNotFound { session, version } => (session, version),
            "load_checkpoint(version {missing}) with versions 0..=1 stored"
        );
        assert_eq!(
            (s, v),
            (session.id.clone(), missing),
            "VersionNotFound fields"
        );
    }
    expect_err!(
        store.load_checkpoint(&session_id(), None).await,
        StoreError::SessionNotFound(_) | StoreError::VersionNotFound { .. },
        "load_checkpoint of a missing session"
    );
}

/// 100 checkpoints adding one message each: every version's transcript is its prefix.
pub async fn checkpoint_storage_is_linear(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    for v in 0..100 {
        let meta = store
            .save_checkpoint(
                lease.fence(),
                v,
                checkpoint("lin", vec![message(2 + v as usize)]),
            )
            .await
            .expect("save_checkpoint");
        assert_eq!(meta.version, v + 1, "version");
    }
    let all: Vec<Value> = (0..102).map(message).collect();
    let latest = load(&*store, &session.id, None).await;
    assert_eq!(values(&latest), all, "latest transcript after 100 saves");
    let listed = store
        .list_checkpoints(&session.id)
        .await
        .expect("list_checkpoints");
    assert_eq!(listed.len(), 101, "checkpoints listed");
    let mut seqs = HashSet::new();
    for meta in &listed {
        assert_eq!(
            meta.message_count,
            2 + meta.version,
            "message_count of version {}",
            meta.version
        );
        assert!(
            seqs.insert(meta.last_seq),
            "two versions share last_seq {}",
            meta.last_seq
        );
    }
    for v in [0, 1, 2, 37, 50, 99, 100] {
        let cp = load(&*store, &session.id, Some(v)).await;
        assert_eq!(
            values(&cp),
            all[..(2 + v) as usize].to_vec(),
            "transcript of version {v}"
        );
    }
}
