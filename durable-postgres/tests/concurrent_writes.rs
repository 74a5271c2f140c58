//! Many writers on one session at once, through the one-statement writes and the locking
//! transactions they fall back to: every write lands exactly once at its own position, the
//! head counts them all, checkpoints interleave without a spurious `Tampered`, and once
//! the lease moves on no old writer gets a row in.

use durable_core::store::{CheckpointLog, JournalStore, LeaseStore, SessionStore};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::replay::ReplayClass;
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, CallStatus, FinishCall, IssueOutcome, Lease, NewCall,
    NewCheckpoint, NewSession,
};
use durable_postgres::testing::test_database;
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::{Value, json};

const TTL: Duration = Duration::from_secs(600);

fn call(session: &SessionId, ordinal: i64) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step: 1,
            tool: "t".into(),
            input_hash: "h".into(),
            ordinal,
        },
        class: ReplayClass::UnsafeOnReplay,
        args: json!({"n": ordinal}),
        idempotency_key: None,
        schema_hash: "s".into(),
    }
}

fn done(n: i64) -> FinishCall {
    FinishCall {
        outcome: CallOutcome::Completed(json!(n)),
        spend: None,
    }
}

fn checkpoint(n: usize) -> NewCheckpoint {
    NewCheckpoint {
        messages: vec![json!({"turn": n})],
        plan: json!({}),
        budget: json!({}),
        state: json!(n),
        wake_at: None,
    }
}

async fn setup() -> (
    durable_postgres::testing::TestDatabase,
    Arc<PostgresStore>,
    Lease,
) {
    let db = test_database().await;
    let store = PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).max_connections(8))
        .await
        .expect("store");
    let (_, lease) = store
        .create_session(NewSession {
            id: SessionId::random(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: TTL,
            initial: NewCheckpoint {
                messages: vec![],
                plan: json!({}),
                budget: json!({}),
                state: Value::Null,
                wake_at: None,
            },
            queue: None,
        })
        .await
        .expect("create");
    (db, Arc::new(store), lease)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_and_checkpoints_of_one_session() {
    let (_db, store, lease) = setup().await;
    let id = lease.session.clone();
    const WRITERS: i64 = 6;
    const EACH: i64 = 20;
    const CHECKPOINTS: usize = 15;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (store, lease) = (Arc::clone(&store), lease.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let n = w * 1000 + i;
                if i % 2 == 0 {
                    match store
                        .record_call(lease.fence(), call(&lease.session, n), done(n))
                        .await
                    {
                        Ok(IssueOutcome::Inserted(r)) => {
                            assert_eq!(r.status, CallStatus::Completed)
                        }
                        other => panic!("record {n}: {other:?}"),
                    }
                } else {
                    let r = match store
                        .issue_call(lease.fence(), call(&lease.session, n))
                        .await
                    {
                        Ok(IssueOutcome::Inserted(r)) => r,
                        other => panic!("issue {n}: {other:?}"),
                    };
                    store
                        .finish_call(lease.fence(), &r.id, done(n), None)
                        .await
                        .unwrap_or_else(|e| panic!("finish {n}: {e:?}"));
                }
            }
        }));
    }
    {
        let (store, lease) = (Arc::clone(&store), lease.clone());
        tasks.push(tokio::spawn(async move {
            let mut version = 0;
            let mut written = 0;
            while written < CHECKPOINTS {
                match store
                    .save_checkpoint(lease.fence(), version, checkpoint(written))
                    .await
                {
                    Ok(meta) => {
                        version = meta.version;
                        written += 1;
                    }
                    Err(e) => panic!("checkpoint {written}: {e:?}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let calls = store.calls(&id, None).await.expect("whole journal");
    assert_eq!(calls.len() as i64, WRITERS * EACH);
    assert!(calls.iter().all(|c| c.status == CallStatus::Completed));
    assert_eq!(
        store.calls(&id, Some(1)).await.expect("step 1").len(),
        calls.len()
    );
    assert!(store.issued_calls(&id).await.expect("issued").is_empty());
    let cp = store
        .load_checkpoint(&id, None)
        .await
        .expect("latest checkpoint");
    assert_eq!(cp.meta.version, CHECKPOINTS as i64);
    assert_eq!(cp.messages.len(), CHECKPOINTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_old_writer_gets_a_row_in_after_the_lease_moves_on() {
    let (_db, store, lease) = setup().await;
    let id = lease.session.clone();
    let accepted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..4_i64 {
        let (store, lease, accepted) = (Arc::clone(&store), lease.clone(), Arc::clone(&accepted));
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let n = w * 100_000 + i;
                match store
                    .record_call(lease.fence(), call(&lease.session, n), done(n))
                    .await
                {
                    Ok(IssueOutcome::Inserted(_)) => {
                        accepted.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(StoreError::LeaseLost { .. }) => return,
                    other => panic!("record {n}: {other:?}"),
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.release_lease(&lease).await.expect("release");
    let taken = store
        .acquire_lease(&id, "other", TTL, 10)
        .await
        .expect("another worker takes the session");
    let at_takeover = store.calls(&id, None).await.expect("journal").len();
    for t in tasks {
        t.await.expect("task");
    }
    let calls = store.calls(&id, None).await.expect("journal");
    assert_eq!(
        calls.len(),
        accepted.load(Ordering::SeqCst),
        "every accepted write, once"
    );
    assert_eq!(calls.len(), at_takeover, "no row after the lease moved on");
    assert!(calls.iter().all(|c| c.fence == lease.fence));
    // The new holder writes on.
    store
        .record_call(taken.fence(), call(&id, -1), done(-1))
        .await
        .expect("the new holder writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_checkpoints_each_land_once() {
    let (_db, store, lease) = setup().await;
    let id = lease.session.clone();
    const EACH: usize = 12;
    let mut tasks = Vec::new();
    for w in 0..3 {
        let (store, lease) = (Arc::clone(&store), lease.clone());
        tasks.push(tokio::spawn(async move {
            let mut expected = 0;
            let mut written = 0;
            while written < EACH {
                // A writer that waited for another's checkpoint sees its session row but
                // not (in that statement) its new checkpoint: the head is read again.
                match store
                    .save_checkpoint(lease.fence(), expected, checkpoint(w * 100 + written))
                    .await
                {
                    Ok(meta) => {
                        expected = meta.version;
                        written += 1;
                    }
                    Err(StoreError::VersionConflict { actual, .. }) => expected = actual,
                    Err(e) => panic!("checkpoint: {e:?}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let cp = store.load_checkpoint(&id, None).await.expect("latest");
    assert_eq!(cp.meta.version, 3 * EACH as i64);
    assert_eq!(cp.messages.len(), 3 * EACH);
}

/// A writer that waited for the session row while another committed a checkpoint: its
/// locking statement sees the new session row but not the new checkpoint, so the head it
/// read fails its check and is read again. It must answer as if it had not waited: a
/// version conflict for a checkpoint, success for a journal write; never `Tampered`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writer_that_waited_for_a_checkpoint_sees_it() {
    let (db, store, lease) = setup().await;
    let id = lease.session.clone();
    let raw = sqlx::postgres::PgPool::connect(db.url())
        .await
        .expect("raw");
    // Every checkpoint insert holds its transaction (and the session row) a while.
    for sql in [
        "CREATE FUNCTION durable_test_slow() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.4); RETURN NULL; END $$",
        "CREATE TRIGGER durable_test_slow AFTER INSERT ON durable_checkpoints \
         FOR EACH ROW EXECUTE FUNCTION durable_test_slow()",
    ] {
        sqlx::query(sql).execute(&raw).await.expect(sql);
    }
    let first = {
        let (store, lease) = (Arc::clone(&store), lease.clone());
        tokio::spawn(async move { store.save_checkpoint(lease.fence(), 0, checkpoint(1)).await })
    };
    in_slow_trigger(&raw).await;
    let second = {
        let (store, lease) = (Arc::clone(&store), lease.clone());
        tokio::spawn(async move { store.save_checkpoint(lease.fence(), 0, checkpoint(2)).await })
    };
    let write = {
        let (store, lease) = (Arc::clone(&store), lease.clone());
        tokio::spawn(async move {
            store
                .record_call(lease.fence(), call(&lease.session, 1), done(1))
                .await
        })
    };
    assert_eq!(
        first
            .await
            .expect("first")
            .expect("first checkpoint")
            .version,
        1
    );
    match second.await.expect("second") {
        Err(StoreError::VersionConflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (0, 1)),
        other => panic!("expected a version conflict, got {other:?}"),
    }
    assert!(matches!(
        write.await.expect("write"),
        Ok(IssueOutcome::Inserted(_))
    ));
    // And a checkpoint that waited with the right version continues the chain.
    let third = {
        let (store, lease) = (Arc::clone(&store), lease.clone());
        tokio::spawn(async move { store.save_checkpoint(lease.fence(), 1, checkpoint(3)).await })
    };
    in_slow_trigger(&raw).await;
    let fourth = store.save_checkpoint(lease.fence(), 2, checkpoint(4)).await;
    assert_eq!(third.await.expect("third").expect("third").version, 2);
    assert_eq!(
        fourth.expect("fourth, after waiting for the third").version,
        3
    );
    let cp = store.load_checkpoint(&id, None).await.expect("latest");
    assert_eq!(cp.messages.len(), 3);
    assert_eq!(store.calls(&id, None).await.expect("journal").len(), 1);
}

/// Waits until a backend of this database sleeps in the slow trigger (holding its
/// transaction open).
async fn in_slow_trigger(raw: &sqlx::postgres::PgPool) {
    for _ in 0..400 {
        let sleeping: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event = 'PgSleep')",
        )
        .fetch_one(raw)
        .await
        .expect("pg_stat_activity");
        if sleeping {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no checkpoint reached the slow trigger within 10 s");
}
