//! Cases: a worker pool never hands out a session blocked on an operator.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;

use super::owner;
use super::runtime::{call, call_and_die, spec};
use crate::error::DurableError;
use crate::journal::CallError;
use crate::replay::ReplayClass;
use crate::runtime::{Durable, StartOptions};
use crate::store::{CheckpointStore, Resolution, SessionStatus};
use crate::transcript::Message;
use crate::worker::ShutdownSignal;

/// Runs a pool over `queue` for `window`; its handler resumes the call of `email` and
/// releases the session when it is refused as `ReplayUnsafe` (a blocked session), or
/// completes it. Returns how many times the pool handed the session out.
async fn pool_for(
    store: &Arc<dyn CheckpointStore>,
    queue: &str,
    window: Duration,
    effects: &Arc<AtomicUsize>,
) -> usize {
    let claims = Arc::new(AtomicUsize::new(0));
    let (counted, effects) = (Arc::clone(&claims), Arc::clone(effects));
    let durable = Durable::builder(Arc::clone(store))
        .owner(owner("pool"))
        .app_version("v1")
        .build();
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    durable
        .worker(move |resumed: crate::Resumed<Message>, _: ShutdownSignal| {
            counted.fetch_add(1, Ordering::SeqCst);
            let (email, effects) = (email.clone(), Arc::clone(&effects));
            async move {
                let session = resumed.session;
                match call(&session, &email, 1, None, &effects).await {
                    Err(CallError::Durable(DurableError::ReplayUnsafe { .. })) => {
                        session.release().await
                    }
                    Ok(_) => session.complete().await.map(|_| ()),
                    Err(e) => panic!("unexpected: {e:?}"),
                }
            }
        })
        .queues([queue])
        .poll_interval(Duration::from_millis(20))
        .run_until(tokio::time::sleep(window))
        .await;
    claims.load(Ordering::SeqCst)
}

/// A session whose unsafe call is in doubt is recovered once after its worker died (a
/// verify hook could settle it there); a handler that gets `ReplayUnsafe` and releases it
/// leaves it to an operator, and no pool claims it again (not in a loop) until the call
/// is resolved; then it is claimable again, and the resolution is what the call returns.
pub async fn worker_pool_skips_a_session_blocked_on_an_operator(store: Arc<dyn CheckpointStore>) {
    let queue = owner("blocked");
    let dead = Durable::builder(Arc::clone(&store))
        .owner(owner("dead"))
        .app_version("v1")
        .lease_ttl(Duration::from_millis(300))
        .build();
    let session = dead
        .start::<Message>(StartOptions::new().with_queue(queue.clone()))
        .await
        .expect("start");
    let id = session.id().clone();
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    call_and_die(&session, &email, 1, None, &effects).await;
    // The worker dies: its lease runs out.
    drop(session);
    tokio::time::sleep(Duration::from_millis(400)).await;

    let claims = pool_for(&store, &queue, Duration::from_millis(1_500), &effects).await;
    assert_eq!(
        claims, 1,
        "a pool handed out a session blocked on an operator {claims} times in 1.5 s"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the email was sent once");
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.status, SessionStatus::Active);
    assert_eq!(record.lease_owner, None, "released by the handler");

    // The operator resolves the call: the session is claimable again, and the pool
    // completes it with the recorded result.
    let in_doubt = store.in_doubt(Some(&id)).await.expect("in_doubt");
    assert_eq!(in_doubt.len(), 1);
    dead.resolve(
        &in_doubt[0].id,
        Resolution::Happened {
            result: json!({ "sent": true }),
        },
        "alice",
        None,
    )
    .await
    .expect("resolve");
    let claims = pool_for(&store, &queue, Duration::from_millis(1_000), &effects).await;
    assert_eq!(
        claims, 1,
        "resolved, the session is claimed once and completed"
    );
    assert_eq!(
        store.session(&id).await.expect("session").status,
        SessionStatus::Completed
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "never sent twice");
}
