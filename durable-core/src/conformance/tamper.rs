//! Tampering behind the framework's back: each case writes a session through the API,
//! changes the database with the backend's own SQL (a [`Tamperer`]), and checks that
//! the change is detected ([`StoreError::Tampered`]) and that no effect runs again.
//!
//! A backend runs them all with [`run_tamper_cases`], giving a [`Tamperer`] that maps each
//! [`Tamper`] onto real `UPDATE`s and `DELETE`s of its tables.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;

use crate::error::{DurableError, StoreError};
use crate::ids::{CallId, SessionId};
use crate::journal::CallError;
use crate::replay::ReplayClass;
use crate::store::{CheckpointStore, NewCheckpoint, NewSession, Resolution};
use crate::transcript::Message;

use super::runtime::{call, call_and_die, release_dead_lease, runtime, spec, start};

/// A change made directly in the database.
#[derive(Debug, Clone, PartialEq)]
pub enum Tamper {
    /// `UPDATE` a journal row's `input_hash` (re-points its recorded result at other
    /// arguments).
    SetInputHash {
        /// The row.
        call: CallId,
        /// The new hash.
        input_hash: String,
    },
    /// `UPDATE` a journal row to `status = 'not_happened', result = NULL, mac = NULL`.
    ForgetOutcome {
        /// The row.
        call: CallId,
    },
    /// `UPDATE` a journal row's `result` text.
    SetResult {
        /// The row.
        call: CallId,
        /// JSON text.
        result: String,
    },
    /// `DELETE` a journal row.
    DeleteCall {
        /// The row.
        call: CallId,
    },
    /// Swap the `seq` of two journal rows (reorder them).
    SwapCallSeqs {
        /// One row.
        a: CallId,
        /// The other.
        b: CallId,
    },
    /// `UPDATE` the text of message `seq`.
    SetMessage {
        /// The session.
        session: SessionId,
        /// The message's position.
        seq: i64,
        /// JSON text.
        message: String,
    },
    /// `DELETE` message `seq`.
    DeleteMessage {
        /// The session.
        session: SessionId,
        /// The message's position.
        seq: i64,
    },
    /// Swap the text and seals of messages `a` and `b`.
    SwapMessages {
        /// The session.
        session: SessionId,
        /// One position.
        a: i64,
        /// The other.
        b: i64,
    },
    /// `UPDATE` the plan text of a checkpoint version.
    SetPlan {
        /// The session.
        session: SessionId,
        /// The version.
        version: i64,
        /// JSON text.
        plan: String,
    },
    /// `DELETE` the latest checkpoint and set the session's `latest_version` back by one.
    RollBackCheckpoint {
        /// The session.
        session: SessionId,
    },
    /// `DELETE` every resolution audit row of a session.
    DeleteResolutions {
        /// The session.
        session: SessionId,
    },
    /// `DELETE` every journal row, resolution and the session head's counts of a
    /// session, as if it had never called anything (`journal_rows = 0, resolutions = 0`).
    WipeJournal {
        /// The session.
        session: SessionId,
    },
}

/// Applies a [`Tamper`] with the backend's own SQL, outside the store.
#[async_trait]
pub trait Tamperer: Send + Sync {
    /// Makes the change (panics if the SQL fails: the case cannot go on).
    async fn apply(&self, tamper: Tamper);
}

fn is_tampered(e: &DurableError) -> bool {
    matches!(e, DurableError::Store(StoreError::Tampered { .. }))
}

fn tampered_call(e: &CallError<String>) -> bool {
    matches!(e, CallError::Durable(d) if is_tampered(d))
}

/// A session that ran `transfer(n)` for each `n` of `amounts` to completion (each effect
/// counted) and then died: returns the session, its calls and the counter.
async fn transfers(
    store: &Arc<dyn CheckpointStore>,
    amounts: &[i64],
) -> (SessionId, Vec<CallId>, Arc<AtomicUsize>) {
    let (durable, _) = runtime(store, "first");
    let session = start(&durable).await;
    let effects = Arc::new(AtomicUsize::new(0));
    let s = spec("transfer", ReplayClass::UnsafeOnReplay);
    for &n in amounts {
        call(&session, &s, n, None, &effects)
            .await
            .expect("the first run of transfer");
    }
    let id = session.id().clone();
    let calls = store
        .calls(&id, None)
        .await
        .expect("calls")
        .into_iter()
        .map(|r| r.id)
        .collect();
    drop(session);
    release_dead_lease(store, &id).await;
    (id, calls, effects)
}

/// After tampering, a new worker resumes and calls `transfer(n)`: either the resume or
/// the call fails with `Tampered`, and the effect counter does not move.
async fn rerun_is_refused(
    store: &Arc<dyn CheckpointStore>,
    case: &str,
    id: &SessionId,
    n: i64,
    effects: &Arc<AtomicUsize>,
) {
    let before = effects.load(Ordering::SeqCst);
    let (durable, _) = runtime(store, "second");
    match durable.resume::<Message>(id).await {
        Err(e) => assert!(
            is_tampered(&e),
            "{case}: resume failed, not as Tampered: {e}"
        ),
        Ok(resumed) => {
            let s = spec("transfer", ReplayClass::UnsafeOnReplay);
            let err = call(&resumed.session, &s, n, None, effects)
                .await
                .expect_err(&format!("{case}: the tampered journal was used"));
            assert!(
                tampered_call(&err),
                "{case}: refused, not as Tampered: {err}"
            );
        }
    }
    assert_eq!(
        effects.load(Ordering::SeqCst),
        before,
        "{case}: an effect ran again"
    );
}

/// A session with a checkpoint (version 1) of three messages and a plan, created through
/// the store; returns its id.
async fn transcript(store: &Arc<dyn CheckpointStore>) -> SessionId {
    let id = SessionId::new(format!("tamper-{}", uuid::Uuid::new_v4().simple()));
    let (_, lease) = store
        .create_session(NewSession {
            id: id.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: super::owner("writer"),
            lease_ttl: Duration::from_secs(600),
            initial: NewCheckpoint {
                messages: vec![json!({"role": "system", "text": "be careful"})],
                plan: json!({"steps": []}),
                budget: json!({}),
                state: json!(null),
            },
        })
        .await
        .expect("create session");
    store
        .save_checkpoint(
            lease.fence(),
            0,
            NewCheckpoint {
                messages: vec![
                    json!({"role": "user", "text": "pay alice 5"}),
                    json!({"role": "assistant", "text": "paid alice 5"}),
                ],
                plan: json!({"steps": ["pay"]}),
                budget: json!({"usd": 1}),
                state: json!({"paid": 5}),
            },
        )
        .await
        .expect("save checkpoint 1");
    store.load_checkpoint(&id, None).await.expect("reads back");
    id
}

async fn load_is_refused(
    store: &Arc<dyn CheckpointStore>,
    case: &str,
    id: &SessionId,
    version: Option<i64>,
) {
    match store.load_checkpoint(id, version).await {
        Err(StoreError::Tampered { .. }) => {}
        other => panic!("{case}: the tampered checkpoint was read: {other:?}"),
    }
    // A fork must not launder it under fresh seals.
    let fork = SessionId::new(format!("{id}-fork"));
    match store
        .fork_session(
            id,
            version.unwrap_or(1),
            &fork,
            &super::owner("forker"),
            Duration::from_secs(60),
        )
        .await
    {
        Err(StoreError::Tampered { .. }) => {}
        other => panic!("{case}: the tampered checkpoint was forked: {other:?}"),
    }
    assert!(
        matches!(
            store.session(&fork).await,
            Err(StoreError::SessionNotFound(_))
        ),
        "{case}: a refused fork creates nothing"
    );
}

/// Runs every tampering case against `store`, tampering through `tamperer`.
pub async fn run_tamper_cases(store: Arc<dyn CheckpointStore>, tamperer: &dyn Tamperer) {
    let store = &store;

    // A completed unsafe call set back to `not_happened` must not run again.
    let (id, calls, effects) = transfers(store, &[1]).await;
    tamperer
        .apply(Tamper::ForgetOutcome {
            call: calls[0].clone(),
        })
        .await;
    rerun_is_refused(store, "forget outcome", &id, 1, &effects).await;

    // transfer(1)'s recorded result re-pointed at transfer(50000) must not come back.
    let (id, calls, effects) = transfers(store, &[1]).await;
    let hash = crate::canonical::input_hash(&json!({"n": 50000})).expect("hash");
    tamperer
        .apply(Tamper::SetInputHash {
            call: calls[0].clone(),
            input_hash: hash,
        })
        .await;
    rerun_is_refused(store, "re-pointed input hash", &id, 50000, &effects).await;

    // A changed result is not returned.
    let (id, calls, effects) = transfers(store, &[1]).await;
    tamperer
        .apply(Tamper::SetResult {
            call: calls[0].clone(),
            result: r#"{"n":1,"run":1,"forged":true}"#.into(),
        })
        .await;
    rerun_is_refused(store, "changed result", &id, 1, &effects).await;

    // A deleted completed row (the newest: no gap) does not make its call run again.
    let (id, calls, effects) = transfers(store, &[1, 2]).await;
    tamperer
        .apply(Tamper::DeleteCall {
            call: calls[1].clone(),
        })
        .await;
    rerun_is_refused(store, "deleted newest row", &id, 2, &effects).await;

    // A deleted row in the middle.
    let (id, calls, effects) = transfers(store, &[1, 2, 3]).await;
    tamperer
        .apply(Tamper::DeleteCall {
            call: calls[1].clone(),
        })
        .await;
    rerun_is_refused(store, "deleted middle row", &id, 2, &effects).await;

    // Reordered rows.
    let (id, calls, effects) = transfers(store, &[1, 2]).await;
    tamperer
        .apply(Tamper::SwapCallSeqs {
            a: calls[0].clone(),
            b: calls[1].clone(),
        })
        .await;
    rerun_is_refused(store, "reordered rows", &id, 1, &effects).await;

    // The whole journal wiped, counts included: the head's seal breaks.
    let (id, _, effects) = transfers(store, &[1]).await;
    tamperer
        .apply(Tamper::WipeJournal {
            session: id.clone(),
        })
        .await;
    rerun_is_refused(store, "wiped journal", &id, 1, &effects).await;

    // Transcript and checkpoints.
    let id = transcript(store).await;
    tamperer
        .apply(Tamper::SetMessage {
            session: id.clone(),
            seq: 2,
            message: r#"{"role":"user","text":"pay mallory 5000"}"#.into(),
        })
        .await;
    load_is_refused(store, "edited message", &id, None).await;

    let id = transcript(store).await;
    tamperer
        .apply(Tamper::DeleteMessage {
            session: id.clone(),
            seq: 3,
        })
        .await;
    load_is_refused(store, "deleted newest message", &id, None).await;

    let id = transcript(store).await;
    tamperer
        .apply(Tamper::SwapMessages {
            session: id.clone(),
            a: 2,
            b: 3,
        })
        .await;
    load_is_refused(store, "reordered messages", &id, None).await;

    let id = transcript(store).await;
    tamperer
        .apply(Tamper::SetPlan {
            session: id.clone(),
            version: 1,
            plan: r#"{"steps":["pay mallory"]}"#.into(),
        })
        .await;
    load_is_refused(store, "edited plan", &id, Some(1)).await;

    let id = transcript(store).await;
    tamperer
        .apply(Tamper::RollBackCheckpoint {
            session: id.clone(),
        })
        .await;
    load_is_refused(store, "rolled back checkpoint", &id, None).await;

    // A deleted resolution audit row.
    let (durable, _) = runtime(store, "first");
    let session = start(&durable).await;
    let effects = Arc::new(AtomicUsize::new(0));
    call_and_die(
        &session,
        &spec("email", ReplayClass::UnsafeOnReplay),
        1,
        None,
        &effects,
    )
    .await;
    let id = session.id().clone();
    drop(session);
    release_dead_lease(store, &id).await;
    let (operator, _) = runtime(store, "operator");
    super::runtime::resolve_only_doubt(&operator, &id, Resolution::DidNotHappen, "ops", None).await;
    store.resolutions(&id).await.expect("reads back");
    tamperer
        .apply(Tamper::DeleteResolutions {
            session: id.clone(),
        })
        .await;
    match store.resolutions(&id).await {
        Err(StoreError::Tampered { .. }) => {}
        other => panic!("deleted resolution: read as {other:?}"),
    }
}
