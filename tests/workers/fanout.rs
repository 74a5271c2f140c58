//! A coordinator fanning out to 20 child sessions across 4 worker-pool processes, the
//! workers SIGKILLed at random and restarted: the coordinator ends with exactly 20
//! children, each completed, each child's email sent once (the ledger), and the sum of
//! their results. Both sides run in the pool role `fanout` (`run_role` below).

use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::store::SessionStatus;
use durable::{
    CallError, CheckpointStore, ChildOutcome, ChildWait, Durable, DurableError, Message,
    ReplayClass, Resumed, Session, ShutdownSignal, StartOptions, ToolSpec, Verification,
};
use serde_json::{Value, json};

use crate::backend::Backend;
use crate::ledger::{Ledger, random_below};
use crate::proc::{Output, Worker};
use crate::worker::{APP_VERSION, MAX_RECOVERY_ATTEMPTS};

/// Children of the coordinator.
pub const CHILDREN: i64 = 20;
const WORKERS: usize = 4;
const TTL: Duration = Duration::from_secs(3);
/// Kills stop after this many, so that the run converges.
const MAX_KILLS: usize = 12;
const DEADLINE: Duration = Duration::from_secs(180);
/// The environment variable naming the coordinator (for the workers to stop once it ends).
pub const COORDINATOR: &str = "DURABLE_WORKERS_COORDINATOR";

/// Runs the case on `backend`.
pub async fn fanout(backend: Backend) {
    let started = Instant::now();
    let store = backend.store().await;
    let ledger = backend.ledger().await;
    let durable = Durable::builder(Arc::clone(&store))
        .owner("fanout-submitter")
        .app_version(APP_VERSION)
        .build();
    let coordinator = durable
        .submit(StartOptions::<Message>::new().with_state(json!({ "role": "coordinator" })))
        .await
        .expect("submit the coordinator");
    let logs = backend.log_dir();
    let mut generation = 0usize;
    let coordinator_env = coordinator.as_str().to_owned();
    let mut spawn = |slot: usize| {
        generation += 1;
        let owner = format!("{}-f{slot}-g{generation}", backend.name());
        let log = logs.path().join(format!("{owner}.log"));
        Worker::spawn(
            "fanout",
            &backend,
            &owner,
            TTL,
            &[(COORDINATOR, coordinator_env.as_str())],
            Output::Log(log),
        )
    };
    let mut slots: Vec<Option<Worker>> = (0..WORKERS).map(|s| Some(spawn(s))).collect();
    let mut kills = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(200 + random_below(400))).await;
        assert!(
            started.elapsed() < DEADLINE,
            "the fan-out did not finish in {DEADLINE:?}{}",
            slots
                .iter()
                .flatten()
                .map(Worker::log_text)
                .collect::<String>()
        );
        for worker in slots.iter_mut() {
            let Some(w) = worker else { continue };
            if let Some(status) = w.child.try_wait().expect("try_wait") {
                assert_eq!(status.code(), Some(0), "{} failed{}", w.owner, w.log_text());
                *worker = None;
            }
        }
        if slots.iter().all(Option::is_none) {
            break;
        }
        let done = store
            .session(&coordinator)
            .await
            .is_ok_and(|s| s.status.is_terminal());
        if !done && kills < MAX_KILLS {
            let live: Vec<usize> = (0..WORKERS).filter(|&s| slots[s].is_some()).collect();
            let slot = live[random_below(live.len() as u64) as usize];
            if let Some(mut w) = slots[slot].take() {
                w.kill();
                kills += 1;
            }
            slots[slot] = Some(spawn(slot));
        }
    }
    let record = store.session(&coordinator).await.expect("coordinator");
    assert_eq!(
        record.status,
        SessionStatus::Completed,
        "the coordinator ended as {:?} ({:?})",
        record.status,
        record.status_reason
    );
    let children = store.children(&coordinator).await.expect("children");
    assert_eq!(
        children.len(),
        usize::try_from(CHILDREN).expect("small"),
        "exactly {CHILDREN} children, never a second one for a start"
    );
    assert!(
        children
            .iter()
            .all(|c| c.session.status == SessionStatus::Completed),
        "every child completed: {:?}",
        children
            .iter()
            .map(|c| (&c.session.id, c.session.status))
            .collect::<Vec<_>>()
    );
    let duplicates = ledger
        .scalar(
            "SELECT count(*) FROM (SELECT effect_key FROM ledger_emails GROUP BY effect_key \
             HAVING count(*) > 1) AS d",
            &[],
        )
        .await
        .expect("duplicates");
    let emails = ledger
        .scalar("SELECT count(*) FROM ledger_emails", &[])
        .await
        .expect("emails");
    if duplicates != 0 {
        let rows = ledger
            .rows(
                "SELECT effect_key, call_id, owner, receipt FROM ledger_emails WHERE effect_key IN \
                 (SELECT effect_key FROM ledger_emails GROUP BY effect_key HAVING count(*) > 1) \
                 ORDER BY effect_key",
                &[],
            )
            .await
            .expect("the duplicated emails");
        let mut story = String::new();
        for row in &rows {
            story.push_str(&format!("\n  email {row:?}"));
        }
        for child in &children {
            let key = format!("fanout:{}", child.session.id);
            if rows.iter().any(|r| r[0] == key) {
                story.push_str(&format!("\n  child {:?}", child.session));
                for version in 0..4 {
                    if let Ok(c) = store
                        .load_checkpoint(&child.session.id, Some(version))
                        .await
                    {
                        story.push_str(&format!("\n  checkpoint {version}: {:?}", c.state));
                    }
                }
                for call in store.calls(&child.session.id, None).await.expect("journal") {
                    story.push_str(&format!(
                        "\n  call {} {:?} {:?} attempt {} fence {} issued {} finished {:?} {:?}",
                        call.id,
                        call.identity,
                        call.status,
                        call.attempt,
                        call.fence,
                        call.issued_at,
                        call.finished_at,
                        call.result
                    ));
                }
            }
        }
        let owners: Vec<&String> = rows.iter().map(|r| &r[2]).collect();
        for owner in owners {
            let path = logs.path().join(format!("{owner}.log"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            story.push_str(&format!("\n--- {owner}.log (tail)\n"));
            let lines: Vec<&str> = text.lines().collect();
            story.push_str(&lines[lines.len().saturating_sub(60)..].join("\n"));
        }
        panic!("a child's email was sent twice:{story}");
    }
    assert_eq!(emails, CHILDREN, "each child's email sent once");
    let last = store
        .load_checkpoint(&coordinator, None)
        .await
        .expect("last");
    assert_eq!(
        last.state["sum"],
        json!((0..CHILDREN).sum::<i64>()),
        "the coordinator read every child's result"
    );
    let starts = store
        .calls(&coordinator, None)
        .await
        .expect("journal")
        .iter()
        .filter(|c| c.identity.tool == durable::store::CHILD_SLOT)
        .count();
    println!(
        "fanout: backend={} children={} kills={kills} emails={emails} duplicates={duplicates} \
         child_starts_journaled={starts} ({:.1} s)",
        backend.name(),
        children.len(),
        started.elapsed().as_secs_f64()
    );
}

/// The worker side: a pool running the coordinator and its children until the
/// coordinator has ended; exits 0 then.
pub async fn run_role(store_url: &str, ledger_url: &str, owner: &str, ttl: Duration) -> i32 {
    let coordinator =
        durable::SessionId::new(std::env::var(COORDINATOR).expect("the coordinator's id"));
    let store: Arc<dyn CheckpointStore> = durable::connect(store_url).await.expect("store");
    let ledger = Ledger::open(ledger_url).await.expect("ledger");
    let durable = Durable::builder(Arc::clone(&store))
        .owner(owner)
        .app_version(APP_VERSION)
        .lease_ttl(ttl)
        .max_recovery_attempts(MAX_RECOVERY_ATTEMPTS)
        .child_recheck(Duration::from_secs(5))
        .build();
    let email = ToolSpec::new(
        "send_email",
        "Email the part's result.",
        ReplayClass::UnsafeOnReplay,
        json!({ "type": "object", "properties": { "part": { "type": "integer" } } }),
    )
    .with_verify();
    let owner = owner.to_owned();
    // Watched by a task of its own: the pool's shutdown future holds no connection.
    let (finished, mut watch) = tokio::sync::watch::channel(false);
    {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            while !store
                .session(&coordinator)
                .await
                .is_ok_and(|s| s.status.is_terminal())
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = finished.send(true);
        });
    }
    let done = async move {
        let _ = watch.wait_for(|done| *done).await;
    };
    let report = durable
        .worker(move |resumed: Resumed<Message>, _: ShutdownSignal| {
            let (email, ledger, owner) = (email.clone(), ledger.clone(), owner.clone());
            async move { handle(resumed.session, &email, &ledger, &owner).await }
        })
        .concurrency(4)
        .poll_interval(Duration::from_millis(100))
        .run_until(done)
        .await;
    println!("pool stopped {report:?}");
    0
}

async fn handle(
    mut session: Session<Message>,
    email: &ToolSpec,
    ledger: &Ledger,
    owner: &str,
) -> Result<(), DurableError> {
    if session.state()["role"] == "child" {
        let part = session.state()["part"].as_i64().unwrap_or_default();
        let effect = format!("fanout:{}", session.id());
        let (send, look) = (ledger.clone(), ledger.clone());
        let (effect_send, owner) = (effect.clone(), owner.to_owned());
        let sent = session
            .journal()
            .tool(email, json!({ "part": part }))
            .run_verified(
                move |ctx| {
                    let (ledger, effect, owner) =
                        (send.clone(), effect_send.clone(), owner.clone());
                    async move {
                        ledger
                            .send_email(&effect, ctx.call_id().as_str(), 1, &owner)
                            .await
                            .map(|receipt| json!({ "receipt": receipt }))
                            .map_err(|e| e.to_string())
                    }
                },
                move |ctx| async move {
                    match look.email_of_call(ctx.call_id().as_str()).await {
                        Ok(Some(receipt)) => Verification::Happened(json!({ "receipt": receipt })),
                        Ok(None) => Verification::DidNotHappen,
                        Err(_) => Verification::Unknown,
                    }
                },
            )
            .await;
        match sent {
            Ok(_) => {}
            Err(CallError::Durable(e)) => return Err(e),
            Err(other) => {
                return Err(DurableError::Encode {
                    what: "the email".into(),
                    detail: other.to_string(),
                });
            }
        }
        session.set_state(json!({ "role": "child", "part": part, "answer": part }));
        session.complete().await?;
        return Ok(());
    }
    let mut children = Vec::new();
    for part in 0..CHILDREN {
        children.push(
            session
                .spawn_child(
                    StartOptions::<Message>::new()
                        .with_state(json!({ "role": "child", "part": part })),
                )
                .await?,
        );
    }
    match session.await_children(&children).await? {
        ChildWait::Released => Ok(()),
        ChildWait::Ready {
            mut session,
            outcomes,
        } => {
            let mut sum = 0;
            for outcome in &outcomes {
                match outcome {
                    ChildOutcome::Completed { state } => {
                        sum += state["answer"].as_i64().unwrap_or_default();
                    }
                    other => {
                        return Err(DurableError::Encode {
                            what: "a child's outcome".into(),
                            detail: format!("{other:?}"),
                        });
                    }
                }
            }
            let value: Value = json!({ "role": "coordinator", "sum": sum });
            session.set_state(value);
            session.complete().await?;
            Ok(())
        }
    }
}
