//! Cases: a worker pool never hands out a session waiting for an operator, and still
//! hands out one whose in-doubt call a resume may settle.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::owner;
use super::runtime::{call_and_die, release_dead_lease, spec};
use durable_core::error::DurableError;
use durable_core::journal::CallError;
use durable_core::replay::ReplayClass;
use durable_core::runtime::{Durable, StartOptions};
use durable_core::store::{CallStatus, CheckpointStore, Resolution, SessionStatus};
use durable_core::transcript::Message;
use durable_core::worker::ShutdownSignal;
use durable_core::{Session, SessionId};
use durable_core::{ToolSpec, Verification};

/// What a pool's handler does with a call refused as `ReplayUnsafe`.
#[derive(Clone, Copy)]
enum OnRefusal {
    /// Releases the session (the README's advice).
    Release,
    /// Returns the error and drops the session: its lease runs out.
    GiveUp,
}

/// Runs one call of `email` in `session`, with a verify hook that answers `verdict`
/// when the email's hook is declared; counts executions in `effects`.
async fn send(
    session: &Session<Message>,
    email: &ToolSpec,
    verdict: Verification<Value>,
    effects: &Arc<AtomicUsize>,
) -> Result<Value, CallError<String>> {
    let effects = Arc::clone(effects);
    session
        .journal()
        .tool(email, json!({ "n": 1 }))
        .run_verified(
            move |_| {
                effects.fetch_add(1, Ordering::SeqCst);
                async { Ok::<Value, String>(json!({ "sent": "fresh" })) }
            },
            move |_| async move { verdict },
        )
        .await
}

/// How a pool runs.
struct Pool {
    /// What the email's verify hook answers (when the tool declares one).
    verdict: Verification<Value>,
    on_refusal: OnRefusal,
    /// The lease of each claim.
    ttl: Duration,
    /// How long the pool runs.
    window: Duration,
}

/// Runs a pool over `queue`; its handler sends the session's email and completes the
/// session, or, refused as `ReplayUnsafe`, does what `on_refusal` says. Returns how
/// many times the pool handed a session out.
async fn pool_for(
    store: &Arc<dyn CheckpointStore>,
    queue: &str,
    email: &ToolSpec,
    pool: Pool,
    effects: &Arc<AtomicUsize>,
) -> usize {
    let Pool {
        verdict,
        on_refusal,
        ttl,
        window,
    } = pool;
    let claims = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&claims);
    let (email, effects) = (email.clone(), Arc::clone(effects));
    let durable = Durable::builder(Arc::clone(store))
        .owner(owner("pool"))
        .app_version("v1")
        .lease_ttl(ttl)
        .build();
    durable
        .worker(
            move |resumed: durable_core::Resumed<Message>, _: ShutdownSignal| {
                counted.fetch_add(1, Ordering::SeqCst);
                let (email, effects, verdict) =
                    (email.clone(), Arc::clone(&effects), verdict.clone());
                async move {
                    let session = resumed.session;
                    match send(&session, &email, verdict, &effects).await {
                        Ok(_) => session.complete().await.map(|_| ()),
                        Err(CallError::Durable(refused @ DurableError::ReplayUnsafe { .. })) => {
                            match on_refusal {
                                OnRefusal::Release => session.release().await,
                                OnRefusal::GiveUp => Err(refused),
                            }
                        }
                        Err(e) => panic!("unexpected: {e:?}"),
                    }
                }
            },
        )
        .queues([queue])
        .poll_interval(Duration::from_millis(20))
        .run_until(tokio::time::sleep(window))
        .await;
    claims.load(Ordering::SeqCst)
}

/// A session in `queue` whose worker sent an email and died before recording it: the
/// row stays `issued`, and the lease is released (as its expiry would).
async fn email_in_doubt(
    store: &Arc<dyn CheckpointStore>,
    queue: &str,
    email: &ToolSpec,
    effects: &Arc<AtomicUsize>,
) -> SessionId {
    let dead = Durable::builder(Arc::clone(store))
        .owner(owner("dead"))
        .app_version("v1")
        .build();
    let session = dead
        .start::<Message>(StartOptions::new().with_queue(queue))
        .await
        .expect("start");
    let id = session.id().clone();
    call_and_die(&session, email, 1, None, effects).await;
    drop(session);
    release_dead_lease(store, &id).await;
    id
}

/// An operator resolves the session's one in-doubt call as *happened*.
async fn resolve(store: &Arc<dyn CheckpointStore>, id: &SessionId) {
    let operator = Durable::builder(Arc::clone(store))
        .owner(owner("operator"))
        .build();
    let in_doubt = store.in_doubt(Some(id)).await.expect("in_doubt");
    assert_eq!(in_doubt.len(), 1, "one call in doubt: {in_doubt:?}");
    operator
        .operator()
        .resolve(
            &in_doubt[0].id,
            Resolution::Happened {
                result: json!({ "sent": "resolved" }),
            },
            "alice",
            None,
        )
        .await
        .expect("resolve");
}

/// A session whose unsafe call is in doubt is claimed once (a resume may settle it); a
/// handler refused as `ReplayUnsafe` (no verify hook) releases it, and from then on no
/// pool claims it (not in a loop) until an operator resolves the call; then it is
/// claimed once more and completed with the resolution. Nothing is sent twice.
pub async fn worker_pool_skips_a_session_waiting_for_an_operator(store: Arc<dyn CheckpointStore>) {
    let queue = owner("blocked");
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    let id = email_in_doubt(&store, &queue, &email, &effects).await;

    let (ttl, window) = (Duration::from_secs(30), Duration::from_millis(1_500));
    let claims = pool_for(
        &store,
        &queue,
        &email,
        Pool {
            verdict: Verification::Unknown,
            on_refusal: OnRefusal::Release,
            ttl,
            window,
        },
        &effects,
    )
    .await;
    assert_eq!(
        claims, 1,
        "a pool handed out a session waiting for an operator {claims} times in 1.5 s"
    );
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.status, SessionStatus::Active);
    assert_eq!(record.lease_owner, None, "released by the handler");
    assert_eq!(store.in_doubt(Some(&id)).await.expect("in_doubt").len(), 1);

    resolve(&store, &id).await;
    let claims = pool_for(
        &store,
        &queue,
        &email,
        Pool {
            verdict: Verification::Unknown,
            on_refusal: OnRefusal::Release,
            ttl,
            window: Duration::from_millis(1_000),
        },
        &effects,
    )
    .await;
    assert_eq!(claims, 1, "resolved, the session is claimed once");
    assert_eq!(
        store.session(&id).await.expect("session").status,
        SessionStatus::Completed
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "never sent twice");
}

/// The same when the handler returns the refusal without releasing: the lease runs out,
/// and the session is still not claimed again (nor counted toward parking) until the
/// call is resolved.
pub async fn worker_pool_skips_a_refused_session_whose_lease_ran_out(
    store: Arc<dyn CheckpointStore>,
) {
    let queue = owner("gave-up");
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    let id = email_in_doubt(&store, &queue, &email, &effects).await;

    // Leases of 200 ms: without the mark, the pool would take the session over about
    // seven times in 1.5 s.
    let claims = pool_for(
        &store,
        &queue,
        &email,
        Pool {
            verdict: Verification::Unknown,
            on_refusal: OnRefusal::GiveUp,
            ttl: Duration::from_millis(200),
            window: Duration::from_millis(1_500),
        },
        &effects,
    )
    .await;
    assert_eq!(claims, 1, "claimed {claims} times in 1.5 s");
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.status, SessionStatus::Active, "not parked");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "never sent twice");
    let in_doubt = store.in_doubt(Some(&id)).await.expect("in_doubt");
    assert_eq!(in_doubt.len(), 1);
    assert_eq!(in_doubt[0].status, CallStatus::Issued);
}

/// A session released with an unsafe call in doubt that no resume has refused (its
/// worker gave it up after a store error, say) is claimed: the tool's verify hook
/// settles the call, and the session completes without sending again.
pub async fn worker_pool_claims_a_session_a_verify_hook_may_settle(
    store: Arc<dyn CheckpointStore>,
) {
    let queue = owner("verifiable");
    let email = spec("email", ReplayClass::UnsafeOnReplay).with_verify();
    let effects = Arc::new(AtomicUsize::new(0));
    let id = email_in_doubt(&store, &queue, &email, &effects).await;

    let claims = pool_for(
        &store,
        &queue,
        &email,
        Pool {
            verdict: Verification::Happened(json!({ "sent": "verified" })),
            on_refusal: OnRefusal::Release,
            ttl: Duration::from_secs(30),
            window: Duration::from_millis(1_000),
        },
        &effects,
    )
    .await;
    assert_eq!(claims, 1);
    assert_eq!(
        store.session(&id).await.expect("session").status,
        SessionStatus::Completed
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "never sent twice");
    let rows = store.calls(&id, None).await.expect("calls");
    assert_eq!(rows[0].result, Some(json!({ "sent": "verified" })));
}
