//! A guard against regressions of the write path's server work that a noisy
//! machine cannot fool: nothing here is timed. After a warm-up, a burst of each operation
//! (a `pure` call, an `unsafe_on_replay` call, an agent turn: the model's reply journaled
//! and a checkpoint) runs on the store's one connection, and the server's own counters
//! say what it did:
//!
//! - `pg_prepared_statements` (PostgreSQL 14 and later): every statement of the burst is
//!   one of the connection's prepared statements, run on its generic plan, planned once:
//!   no custom plan is made during the burst (a `plan_cache_mode = force_custom_plan`,
//!   which an earlier release set on every connection opened before the first `ANALYZE`, re-plans
//!   every write: 400–600 µs of server CPU per `pure` call); and each operation runs the
//!   number of statements it is meant to (one round trip each);
//! - `pg_stat_user_tables`: every update of the session row during the calls is HOT (no new
//!   index entry: no index names a column such a write changes, in its key or its
//!   predicate; schema 10 took `issued_rows` out of one).
//!
//! `cargo test -p durable-postgres --features testing --test plan_guard -- --nocapture`
//! prints the counters.

use durable_core::store::{CheckpointLog, JournalStore, SessionStore};
use std::collections::HashMap;
use std::time::Duration;

use durable_core::ids::{CallId, SessionId};
use durable_core::replay::ReplayClass;
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, Fence, FinishCall, IssueOutcome, NewCall, NewCheckpoint,
    NewSession,
};
use durable_postgres::testing::test_database;
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnection, PgPool};

/// Operations of each kind in the measured burst.
const BURST: i64 = 20;

fn call(session: &SessionId, step: i64, kind: CallKind, tool: &str, ordinal: i64) -> NewCall {
    let (class, input_hash) = match kind {
        CallKind::Model => (ReplayClass::Pure, String::new()),
        CallKind::Tool if tool == "unsafe" => (ReplayClass::UnsafeOnReplay, "h".to_owned()),
        CallKind::Tool => (ReplayClass::Pure, "h".to_owned()),
    };
    NewCall {
        id: CallId::random(),
        kind,
        identity: CallIdentity {
            session: session.clone(),
            step,
            tool: tool.into(),
            input_hash,
            ordinal,
        },
        class,
        args: json!({"q": tool}),
        idempotency_key: None,
        schema_hash: "s".into(),
    }
}

fn done() -> FinishCall {
    FinishCall {
        outcome: CallOutcome::Completed(json!({"ok": true})),
        spend: None,
    }
}

fn checkpoint(turn: i64) -> NewCheckpoint {
    NewCheckpoint {
        messages: vec![
            json!({"role": "assistant", "text": format!("reply {turn}")}),
            json!({"role": "tool", "text": "result"}),
        ],
        plan: json!({}),
        budget: json!({}),
        state: Value::Null,
        wake_at: None,
    }
}

/// The operations measured, each run with a number unique to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Operation {
    /// A `pure` call: its row and outcome in one write (`record_call`).
    Pure,
    /// An `unsafe_on_replay` call: *issued* (`issue_call`), then its outcome
    /// (`finish_call`).
    Unsafe,
    /// An agent turn: the model's reply journaled (`record_call` of a `model` row), then
    /// a checkpoint with the reply and a tool result (`save_checkpoint`).
    Turn,
}

impl Operation {
    const ALL: [Operation; 3] = [Operation::Pure, Operation::Unsafe, Operation::Turn];

    /// The statements (and so round trips) one operation is meant to send.
    fn statements(self) -> i64 {
        match self {
            Operation::Pure => 2,
            Operation::Unsafe | Operation::Turn => 4,
        }
    }
}

/// A session, its lease, and its step and checkpoint version so far.
struct Agent {
    store: PostgresStore,
    session: SessionId,
    lease: durable_core::store::Lease,
    step: i64,
    version: i64,
}

impl Agent {
    fn fence(&self) -> Fence<'_> {
        self.lease.fence()
    }

    /// Runs `op` once. Every call is in the current step, at a new ordinal `n`.
    async fn run(&mut self, op: Operation, n: i64) {
        let fence = self.fence();
        match op {
            Operation::Pure => {
                self.store
                    .record_call(
                        fence,
                        call(&self.session, self.step, CallKind::Tool, "pure", n),
                        done(),
                    )
                    .await
                    .expect("a pure call");
            }
            Operation::Unsafe => {
                let issued = self
                    .store
                    .issue_call(
                        fence,
                        call(&self.session, self.step, CallKind::Tool, "unsafe", n),
                    )
                    .await
                    .expect("issue an unsafe call");
                let IssueOutcome::Inserted(row) = issued else {
                    panic!("the unsafe call {n} was journaled already");
                };
                self.store
                    .finish_call(fence, &row.id, done(), None)
                    .await
                    .expect("finish an unsafe call");
            }
            Operation::Turn => {
                self.store
                    .record_call(
                        fence,
                        call(&self.session, self.step, CallKind::Model, "@model", 0),
                        done(),
                    )
                    .await
                    .expect("journal the model's reply");
                let saved = self
                    .store
                    .save_checkpoint(fence, self.version, checkpoint(n))
                    .await
                    .expect("checkpoint");
                self.version = saved.version;
                // The next turn starts from the new checkpoint, as the runtime's do.
                self.step = saved.version;
            }
        }
    }
}

/// Plans made so far for each of the connection's prepared statements:
/// `statement → (generic plans, custom plans)`.
async fn plans(conn: &mut PgConnection) -> HashMap<String, (i64, i64)> {
    let rows: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
            // Unprepared (the unnamed statement is not listed): the guard's own statements stay
            // out of what it counts.
            .persistent(false)
            .fetch_all(&mut *conn)
            .await
            .expect("pg_prepared_statements");
    rows.into_iter()
        .map(|(sql, generic, custom)| (sql, (generic, custom)))
        .collect()
}

/// Updates and HOT updates of `durable_sessions` so far, as the statistics have them once
/// the store's backend has reported what it did.
async fn session_updates(admin: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
         WHERE relname = 'durable_sessions'",
    )
    .fetch_one(admin)
    .await
    .expect("pg_stat_user_tables")
}

/// Makes the store's backend report its table statistics now (it reports them at most
/// once a second on its own), then reads them, waiting until they show `at_least` updates.
async fn reported_updates(store: &PostgresStore, admin: &PgPool, at_least: i64) -> (i64, i64) {
    for _ in 0..50 {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .persistent(false)
            .execute(store.pool())
            .await
            .expect("flush the statistics");
        let counts = session_updates(admin).await;
        if counts.0 >= at_least {
            return counts;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    session_updates(admin).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_keeps_its_generic_plan_and_the_session_row_is_updated_hot() {
    let db = test_database().await;
    let admin = PgPool::connect(db.url()).await.expect("admin pool");
    let version: i64 = sqlx::query_scalar("SELECT current_setting('server_version_num')::bigint")
        .fetch_one(&admin)
        .await
        .expect("server version");
    assert!(
        version >= 140_000,
        "pg_prepared_statements counts plans from PostgreSQL 14 on; this server is {version}"
    );
    // One connection: every statement of the store runs on it, and its prepared
    // statements are the store's.
    let store = PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).max_connections(1))
        .await
        .expect("the store");
    let session = SessionId::random();
    let (_, lease) = store
        .create_session(NewSession {
            id: session.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: Duration::from_secs(600),
            initial: checkpoint(0),
            queue: None,
        })
        .await
        .expect("create a session");
    let mut agent = Agent {
        store: store.clone(),
        session,
        lease,
        step: 0,
        version: 0,
    };
    // Warm-up: each statement past PostgreSQL's five custom plans, where `auto` settles
    // on the generic plan.
    let mut n = 1;
    for _ in 0..8 {
        for op in Operation::ALL {
            agent.run(op, n).await;
            n += 1;
        }
    }
    {
        let mut conn = store
            .pool()
            .acquire()
            .await
            .expect("the store's connection");
        let mode: String = sqlx::query_scalar("SHOW plan_cache_mode")
            .persistent(false)
            .fetch_one(&mut *conn)
            .await
            .expect("plan_cache_mode");
        println!("plan_cache_mode on the store's connection: {mode}");
    }

    let mut failures = Vec::new();
    for op in Operation::ALL {
        let before_plans = {
            let mut conn = store
                .pool()
                .acquire()
                .await
                .expect("the store's connection");
            plans(&mut conn).await
        };
        let before_updates = reported_updates(&store, &admin, 0).await;
        for _ in 0..BURST {
            agent.run(op, n).await;
            n += 1;
        }
        let after_plans = {
            let mut conn = store
                .pool()
                .acquire()
                .await
                .expect("the store's connection");
            plans(&mut conn).await
        };
        let updates_per_op = match op {
            Operation::Pure => 1,
            Operation::Unsafe | Operation::Turn => 2,
        };
        let after_updates =
            reported_updates(&store, &admin, before_updates.0 + updates_per_op * BURST).await;

        // What each prepared statement did during the burst.
        let mut executions = 0;
        println!("{op:?} × {BURST}:");
        for (sql, (generic, custom)) in &after_plans {
            let (generic_0, custom_0) = before_plans.get(sql).copied().unwrap_or((0, 0));
            let (generic, custom) = (generic - generic_0, custom - custom_0);
            if generic == 0 && custom == 0 {
                continue;
            }
            let short: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
            let short: String = short.chars().take(100).collect();
            println!("    generic {generic:>3}, custom {custom:>3}: {short}");
            executions += generic + custom;
            if custom > 0 {
                failures.push(format!(
                    "{op:?}: a statement was planned afresh {custom} times in {BURST} operations \
                     (its generic plan {generic} times): {short}"
                ));
            }
        }
        if executions != op.statements() * BURST {
            failures.push(format!(
                "{op:?}: {executions} executions of prepared statements in {BURST} operations, \
                 expected {} each",
                op.statements()
            ));
        }
        let (updates, hot) = (
            after_updates.0 - before_updates.0,
            after_updates.1 - before_updates.1,
        );
        println!("    session row: {updates} updates, {hot} HOT");
        match op {
            Operation::Pure | Operation::Unsafe => {
                if updates < updates_per_op * BURST || hot != updates {
                    failures.push(format!(
                        "{op:?}: {hot} of {updates} updates of the session row were HOT \
                         (expected all {})",
                        updates_per_op * BURST
                    ));
                }
            }
            // A checkpoint changes `updated_at`, which the index of sessions by status
            // and last update names: its update is not HOT (the journaled reply's is).
            Operation::Turn => {
                if hot < BURST {
                    failures.push(format!(
                        "{op:?}: {hot} of {updates} updates of the session row were HOT \
                         (expected at least the {BURST} of the journaled replies)"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
