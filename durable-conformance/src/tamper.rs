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

use durable_core::error::{DurableError, StoreError};
use durable_core::ids::{CallId, SessionId};
use durable_core::journal::CallError;
use durable_core::replay::ReplayClass;
use durable_core::store::{
    CallOutcome, CallStatus, CheckpointStore, CheckpointStoreExt, FinishCall, NewCheckpoint,
    NewSession, Resolution, ResolveCall,
};
use durable_core::transcript::Message;

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
    /// `UPDATE` a journal row's `step` (moves it out of the step it was recorded in; its
    /// seal is left as it was).
    MoveCall {
        /// The row.
        call: CallId,
        /// The step it is moved to.
        step: i64,
    },
    /// `UPDATE` a journal row's `status` (its seal is left as it was).
    SetStatus {
        /// The row.
        call: CallId,
        /// The new status (`issued`, `completed`, …).
        status: String,
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
                wake_at: None,
            },
            queue: None,
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
                wake_at: None,
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
    let hash = durable_core::canonical::input_hash(&json!({"n": 50000})).expect("hash");
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

    // The last row moved to an earlier step, its seal untouched: the step it was recorded
    // in reads without it, and the row after the step's rows is of an earlier step, which
    // steps that only move forward cannot produce. The step read must see it before the
    // step is replayed.
    let (id, calls, effects) = transfers(store, &[1, 2]).await;
    tamperer
        .apply(Tamper::MoveCall {
            call: calls[1].clone(),
            step: -1,
        })
        .await;
    rerun_is_refused(store, "row moved to another step", &id, 2, &effects).await;

    // An in-doubt unsafe call shown as completed, its seal untouched: a resume that reads
    // only the issued rows finds one fewer than the session head counts.
    let (durable, _) = runtime(store, "first");
    let session = start(&durable).await;
    let effects = Arc::new(AtomicUsize::new(0));
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    call_and_die(&session, &email, 7, None, &effects).await;
    let id = session.id().clone();
    let doubt = store.issued_calls(&id).await.expect("the in-doubt row");
    drop(session);
    release_dead_lease(store, &id).await;
    tamperer
        .apply(Tamper::SetStatus {
            call: doubt[0].id.clone(),
            status: "completed".into(),
        })
        .await;
    let before = effects.load(Ordering::SeqCst);
    let (durable, _) = runtime(store, "second");
    match durable.resume::<Message>(&id).await {
        Err(e) => assert!(
            is_tampered(&e),
            "in-doubt row shown as completed: resume failed, not as Tampered: {e}"
        ),
        Ok(_) => panic!("in-doubt row shown as completed: the resume did not see it"),
    }
    assert_eq!(
        effects.load(Ordering::SeqCst),
        before,
        "the email ran again"
    );

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

    rows_moved_out_of_the_current_step(store, tamperer).await;
    step_reads_detect_deleted_rows(store, tamperer).await;
    page_walks_detect_deleted_rows(store, tamperer).await;
    issued_reads_follow_every_status_change(store, tamperer).await;
    super::window::window_reads_detect_changed_messages(store, tamperer).await;
}

/// Journal layouts (rows per step, steps 1, 2, …), some generated from a fixed seed.
fn step_layouts() -> Vec<Vec<usize>> {
    let mut layouts = vec![vec![1], vec![3], vec![2, 0, 3, 1], vec![0, 1, 0, 0, 2]];
    // A small LCG, so the layouts are the same on every run and every backend.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..4 {
        let steps = 2 + (x % 4) as usize;
        let mut layout = Vec::with_capacity(steps);
        for _ in 0..steps {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            layout.push(((x >> 33) % 4) as usize);
        }
        if layout.iter().all(|&n| n == 0) {
            layout[0] = 1;
        }
        layouts.push(layout);
    }
    layouts
}

/// A session whose journal has `layout[i]` rows in step `i + 1`, written through the
/// store; returns it and each row's (id, step).
async fn session_with_layout(
    store: &Arc<dyn CheckpointStore>,
    layout: &[usize],
) -> (SessionId, Vec<(CallId, i64)>) {
    let (session, lease) = super::create(&**store, &super::owner("steps")).await;
    let mut rows = Vec::new();
    for (i, &n) in layout.iter().enumerate() {
        let step = i as i64 + 1;
        for ordinal in 0..n {
            let call = super::tool_call(&session.id, step, "t", "h", ordinal as i64);
            let row = super::journal::insert(&**store, lease.fence(), call).await;
            rows.push((row.id, step));
        }
    }
    (session.id, rows)
}

/// A journal read page by page (`calls_page`, as `durable calls` and `durable verify`
/// walk it) is checked complete: whichever row is deleted, the walk fails with
/// `Tampered` (at the page of the gap, or at the last page), never lists a short journal.
async fn page_walks_detect_deleted_rows(store: &Arc<dyn CheckpointStore>, tamperer: &dyn Tamperer) {
    async fn walk(store: &Arc<dyn CheckpointStore>, id: &SessionId) -> Result<usize, StoreError> {
        let (mut after, mut seen) = (0, 0);
        loop {
            let page = store.calls_page(id, after, 3).await?.len();
            seen += page;
            after += page as i64;
            if page < 3 {
                return Ok(seen);
            }
        }
    }
    let (id, _) = session_with_layout(store, &[4, 3]).await;
    assert_eq!(walk(store, &id).await.expect("an untouched journal"), 7);
    for victim in 0..7 {
        let (id, rows) = session_with_layout(store, &[4, 3]).await;
        tamperer
            .apply(Tamper::DeleteCall {
                call: rows[victim].0.clone(),
            })
            .await;
        match walk(store, &id).await {
            Err(StoreError::Tampered { .. }) => {}
            other => panic!("row {victim} of 7 deleted, the page walk gave {other:?}"),
        }
    }
}

/// One step's rows are read without the rest of the journal, yet a deleted
/// row of that step is still detected: at its start, its end, inside it, or the whole
/// step, for every row of a set of generated layouts (steps with and without rows).
async fn step_reads_detect_deleted_rows(store: &Arc<dyn CheckpointStore>, tamperer: &dyn Tamperer) {
    for layout in step_layouts() {
        let steps = layout.len() as i64;
        // Untouched, every step (and the one after the last) reads clean.
        let (id, rows) = session_with_layout(store, &layout).await;
        for step in 1..=steps + 1 {
            let got = store.calls(&id, Some(step)).await.unwrap_or_else(|e| {
                panic!("layout {layout:?}: step {step} of an untouched journal: {e}")
            });
            let want = rows.iter().filter(|(_, s)| *s == step).count();
            assert_eq!(got.len(), want, "layout {layout:?}: rows of step {step}");
        }
        // Each row deleted in turn.
        for victim in 0..rows.len() {
            let (id, rows) = session_with_layout(store, &layout).await;
            let (call, step) = rows[victim].clone();
            tamperer
                .apply(Tamper::DeleteCall { call: call.clone() })
                .await;
            match store.calls(&id, Some(step)).await {
                Err(StoreError::Tampered { .. }) => {}
                other => panic!(
                    "layout {layout:?}: row {victim} (step {step}) deleted, the step read as {other:?}"
                ),
            }
        }
        // The issued rows (all of them here: `insert` issues) read as the whole
        // journal; one deleted is detected, whichever step it was in.
        let (id, rows) = session_with_layout(store, &layout).await;
        let issued = store.issued_calls(&id).await.expect("issued_calls");
        assert_eq!(
            issued.iter().map(|r| &r.id).collect::<Vec<_>>(),
            rows.iter().map(|(c, _)| c).collect::<Vec<_>>(),
            "layout {layout:?}: issued_calls"
        );
        if let Some((call, step)) = rows.first() {
            tamperer
                .apply(Tamper::DeleteCall { call: call.clone() })
                .await;
            match store.issued_calls(&id).await {
                Err(StoreError::Tampered { .. }) => {}
                other => panic!(
                    "layout {layout:?}: the issued row of step {step} deleted, issued_calls read {other:?}"
                ),
            }
        }
        // Each step with rows deleted whole.
        for (i, &n) in layout.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let step = i as i64 + 1;
            let (id, rows) = session_with_layout(store, &layout).await;
            for (call, _) in rows.iter().filter(|(_, s)| *s == step) {
                tamperer
                    .apply(Tamper::DeleteCall { call: call.clone() })
                    .await;
            }
            match store.calls(&id, Some(step)).await {
                Err(StoreError::Tampered { .. }) => {}
                other => {
                    panic!("layout {layout:?}: step {step} deleted whole, it read as {other:?}")
                }
            }
        }
    }
}

/// The journal statuses a row can be given behind the store's back.
const STATUSES: [&str; 5] = ["issued", "completed", "failed", "not_happened", "resolved"];

/// A seeded random program over one session's journal: issue a row, finish an issued row
/// (completed or failed), resolve one (happened or did not happen), re-issue a row that
/// did not happen. Returns the session and its rows' ids, in issue order. After every
/// operation, `issued_calls` must equal the issued rows of the whole journal: the head's
/// count of issued rows follows every way a status changes.
async fn status_program(
    store: &Arc<dyn CheckpointStore>,
    seed: u64,
    ops: usize,
) -> (SessionId, Vec<CallId>) {
    let owner = super::owner("status");
    let (session, mut lease) = super::create(&**store, &owner).await;
    let mut x = seed;
    let mut next = move |n: usize| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((x >> 33) as usize) % n.max(1)
    };
    let mut ids: Vec<CallId> = Vec::new();
    for op in 0..ops {
        let rows = store.calls(&session.id, None).await.expect("calls");
        let with = |status: CallStatus| -> Vec<CallId> {
            rows.iter()
                .filter(|r| r.status == status)
                .map(|r| r.id.clone())
                .collect()
        };
        let (issued, not_happened) = (with(CallStatus::Issued), with(CallStatus::NotHappened));
        let choice = next(5);
        if choice == 0 || issued.is_empty() && not_happened.is_empty() {
            let call = super::tool_call(&session.id, 1, "t", &format!("h{op}"), op as i64);
            ids.push(
                super::journal::insert(&**store, lease.fence(), call)
                    .await
                    .id,
            );
        } else if choice <= 2 && !issued.is_empty() {
            let victim = &issued[next(issued.len())];
            let outcome = if choice == 1 {
                CallOutcome::Completed(json!({ "op": op }))
            } else {
                CallOutcome::Failed(json!({ "error": op }))
            };
            let finish = FinishCall {
                outcome,
                spend: None,
            };
            store
                .finish_call(lease.fence(), victim, finish, None)
                .await
                .expect("finish an issued row");
        } else if choice == 3 && !issued.is_empty() {
            let victim = issued[next(issued.len())].clone();
            let resolution = if next(2) == 0 {
                Resolution::Happened {
                    result: json!({ "op": op }),
                }
            } else {
                Resolution::DidNotHappen
            };
            // An operator resolves a call only once its worker's lease is gone.
            store.release_lease(&lease).await.expect("release");
            store
                .resolve_call(ResolveCall {
                    call: victim,
                    resolution,
                    by: "ops".into(),
                    note: None,
                })
                .await
                .expect("resolve an issued row");
            lease = store
                .acquire_lease(&session.id, &owner, super::LONG_TTL, super::MAX_ATTEMPTS)
                .await
                .expect("the worker takes the session back");
        } else if !not_happened.is_empty() {
            let victim = &not_happened[next(not_happened.len())];
            store
                .reissue_call(lease.fence(), victim)
                .await
                .expect("re-issue a row that did not happen");
        } else {
            continue;
        }
        let whole = store.calls(&session.id, None).await.expect("calls");
        let want: Vec<_> = whole
            .iter()
            .filter(|r| r.status == CallStatus::Issued)
            .map(|r| &r.id)
            .collect();
        let got = store
            .issued_calls(&session.id)
            .await
            .unwrap_or_else(|e| panic!("seed {seed:#x}, op {op}: issued_calls failed: {e}"));
        assert_eq!(
            got.iter().map(|r| &r.id).collect::<Vec<_>>(),
            want,
            "seed {seed:#x}, op {op}: issued_calls against the whole journal"
        );
    }
    (session.id, ids)
}

/// Every row of seeded random journals given every other status behind the store's back
/// (seal untouched): a change to or from `issued` makes `issued_calls` (what a resume
/// reads) fail with `Tampered`, and any change makes the whole journal's read fail.
async fn issued_reads_follow_every_status_change(
    store: &Arc<dyn CheckpointStore>,
    tamperer: &dyn Tamperer,
) {
    const OPS: usize = 12;
    for seed in [0x5eed_0001_u64, 0x5eed_0002, 0x5eed_0003] {
        let (id, ids) = status_program(store, seed, OPS).await;
        let rows = store.calls(&id, None).await.expect("calls");
        for (i, row) in rows.iter().enumerate() {
            for status in STATUSES {
                if status == row.status.as_str() {
                    continue;
                }
                // The same program again (same seed): a fresh session to tamper with.
                let (id, ids_again) = status_program(store, seed, OPS).await;
                assert_eq!(
                    ids_again.len(),
                    ids.len(),
                    "seed {seed:#x}: the program is deterministic"
                );
                let call = store.calls(&id, None).await.expect("calls")[i].id.clone();
                tamperer
                    .apply(Tamper::SetStatus {
                        call,
                        status: status.into(),
                    })
                    .await;
                let from = row.status.as_str();
                let case = format!("seed {seed:#x}: row {i} set from {from} to {status}");
                if from == "issued" || status == "issued" {
                    match store.issued_calls(&id).await {
                        Err(StoreError::Tampered { .. }) => {}
                        other => panic!("{case}: issued_calls read {other:?}"),
                    }
                }
                match store.calls(&id, None).await {
                    Err(StoreError::Tampered { .. }) => {}
                    other => panic!("{case}: the whole journal read {other:?}"),
                }
            }
        }
    }
}

/// Every row of the current step (of one, two and three rows) moved to an earlier and to
/// a later step behind the store's back, seal untouched: re-running its call fails with
/// `Tampered` and runs no effect. (Review finding: on SQLite the step's first or only row
/// moved to an earlier step read as a step without it, and its call ran again; the last
/// row moved to a later step was refused as `StepClosed`, which blames the harness.)
async fn rows_moved_out_of_the_current_step(
    store: &Arc<dyn CheckpointStore>,
    tamperer: &dyn Tamperer,
) {
    for amounts in [&[1_i64][..], &[1, 2], &[1, 2, 3]] {
        for victim in 0..amounts.len() {
            for step in [-1, 1] {
                let (id, calls, effects) = transfers(store, amounts).await;
                tamperer
                    .apply(Tamper::MoveCall {
                        call: calls[victim].clone(),
                        step,
                    })
                    .await;
                let case = format!(
                    "row {victim} of a step of {} moved to step {step}",
                    amounts.len()
                );
                rerun_is_refused(store, &case, &id, amounts[victim], &effects).await;
            }
        }
    }
}
