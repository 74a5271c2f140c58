//! The plans of an agent turn's statements on a fresh database that was never analyzed
//! (generic plans made on empty tables). A turn's statements are prepared by sqlx on the store's
//! connections, and PostgreSQL's default `plan_cache_mode` (`auto`) switches each to its
//! generic plan at the sixth execution, planned once. A generic plan made while the
//! tables were nearly empty once looked rows up by `session_id` alone and filtered the
//! rest, so a turn walked the session's whole journal until autovacuum's first ANALYZE
//! replanned it; the fix then (`plan_cache_mode = force_custom_plan` on every connection
//! opened before that ANALYZE) re-planned every write instead, hundreds of µs of server
//! CPU per call. Now each statement is written so that its generic plan looks rows up by
//! whole keys, and only the reads whose best plan depends on a session's size (the window
//! and range reads) go unprepared. Not a timed test: each statement runs while the tables
//! are small, the session then grows to a few thousand rows, and the plan the store's
//! connection uses must look every row up by an index, with nothing filtered out
//! (`EXPLAIN (ANALYZE) EXECUTE` of a prepared statement on its generic plan; `EXPLAIN
//! (ANALYZE)` of an unprepared read, planned for its parameters as the store's unnamed
//! statement is); the writes' generic plans are checked by the keys their index scans
//! use. Once the tables are analyzed, the generic plans made from the statistics pass
//! the same checks.

use durable_core::store::{CheckpointLog, JournalStore, SessionStore};
use std::time::Duration;

use durable_core::ids::SessionId;
use durable_core::store::{NewCheckpoint, NewSession};
use serde_json::{Value, json};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

use crate::checkpoints::reads::{RANGE_READ, WINDOW_READ};
use crate::checkpoints::single_statement::SAVE_READ;
use crate::journal::reads::STEP_READ;
use crate::journal::single_statement::INSERT_READ;
use crate::testing::test_database;

/// The tables that grow with a session.
const GROWING: [&str; 3] = [
    "durable_tool_calls",
    "durable_messages",
    "durable_checkpoints",
];

/// The reads the store sends unprepared (planned for their parameters every time).
const UNPREPARED: [&str; 3] = [STEP_READ, WINDOW_READ, RANGE_READ];

/// Journal rows (one per step), checkpoints, and twice as many messages.
const ROWS: i64 = 3000;

/// Runs `sql` (one of the turn's reads) as the store does: prepared, with binds (the
/// size-sensitive reads unprepared).
async fn run(conn: &mut PgConnection, sql: &'static str, session: &str, step: i64) {
    // As the store sends them: the size-sensitive reads unprepared.
    let query = bind(sqlx::query(sql), sql, session, step).persistent(!UNPREPARED.contains(&sql));
    query.fetch_all(conn).await.expect("run a turn's read");
}

/// `query` with the arguments of the read `sql` bound.
fn bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    sql: &str,
    session: &str,
    step: i64,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let query = query.bind(session.to_owned());
    if sql == STEP_READ {
        query.bind(step)
    } else if sql == WINDOW_READ {
        // The latest checkpoint's last 20 messages.
        query.bind(None::<i64>).bind(20_i64)
    } else if sql == RANGE_READ {
        query.bind(1000_i64).bind(1019_i64)
    } else {
        query
    }
}

/// The arguments of `sql` as SQL literals (for `EXECUTE`).
fn literals(sql: &str, session: &str, step: i64) -> String {
    if sql == STEP_READ {
        format!("'{session}', {step}")
    } else if sql == WINDOW_READ {
        format!("'{session}', NULL, 20")
    } else if sql == RANGE_READ {
        format!("'{session}', 1000, 1019")
    } else {
        format!("'{session}'")
    }
}

/// Every scan of a growing table in `plan` (a node of `EXPLAIN (FORMAT JSON)`), as
/// `(node type, relation, index condition, rows removed by its filter)`.
fn scans(plan: &Value, out: &mut Vec<(String, String, String, i64)>) {
    if let Some(relation) = plan["Relation Name"].as_str()
        && GROWING.contains(&relation)
    {
        out.push((
            plan["Node Type"].as_str().unwrap_or_default().to_owned(),
            relation.to_owned(),
            plan["Index Cond"].as_str().unwrap_or_default().to_owned(),
            plan["Rows Removed by Filter"].as_i64().unwrap_or(0),
        ));
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        scans(child, out);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_reads_use_their_indexes_before_any_analyze() {
    let db = test_database().await;
    let store = db.store().await.expect("connect the store");
    let id = new_session(&store).await;
    let session = id.as_str();
    let mut conn = store.pool().acquire().await.expect("a store connection");
    let mode: String = sqlx::query_scalar("SHOW plan_cache_mode")
        .fetch_one(&mut *conn)
        .await
        .expect("plan_cache_mode");
    assert_eq!(
        mode, "auto",
        "the store's connections keep PostgreSQL's default, analyzed or not"
    );
    for table in GROWING {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = off)"
        )))
        .execute(&mut *conn)
        .await
        .expect("no autovacuum during the test");
    }
    let reads = [STEP_READ, INSERT_READ, SAVE_READ, WINDOW_READ, RANGE_READ];
    // Six executions while the tables are nearly empty: where the default plan cache
    // mode makes (and keeps) its generic plan.
    for sql in reads {
        for step in 1..=6 {
            run(&mut conn, sql, session, step).await;
        }
    }
    // The session grows to ROWS turns (the rows need no valid seals: only plans are
    // looked at; every other message refers to a model row, as a stored reply does), and
    // nothing is analyzed.
    grow(&mut conn, session, ROWS).await;
    let analyzed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_user_tables \
         WHERE relname LIKE 'durable%' AND (last_analyze IS NOT NULL \
           OR last_autoanalyze IS NOT NULL)",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("pg_stat_user_tables");
    assert_eq!(analyzed, 0, "no table may have been analyzed");
    for sql in reads {
        // The prepared reads on the generic plan made while the tables were small.
        assert_indexed(&mut conn, sql, session, !UNPREPARED.contains(&sql)).await;
    }
    drop(conn);
    // Once the tables are analyzed, a new connection keeps PostgreSQL's default, and the
    // generic plans it makes from the statistics use the same indexes.
    sqlx::raw_sql(
        "ANALYZE durable_sessions, durable_tool_calls, durable_messages, durable_checkpoints",
    )
    .execute(store.pool())
    .await
    .expect("analyze");
    let store = db.store().await.expect("connect again");
    let mut conn = store.pool().acquire().await.expect("a store connection");
    let mode: String = sqlx::query_scalar("SHOW plan_cache_mode")
        .fetch_one(&mut *conn)
        .await
        .expect("plan_cache_mode");
    assert_eq!(
        mode, "auto",
        "the store's connections once the tables are analyzed"
    );
    for sql in reads {
        for step in 1..=6 {
            run(&mut conn, sql, session, ROWS + step).await;
        }
        assert_indexed(&mut conn, sql, session, !UNPREPARED.contains(&sql)).await;
    }
}

/// A new empty session, leased to a worker for the test's length.
async fn new_session(store: &crate::PostgresStore) -> SessionId {
    let id = SessionId::random();
    store
        .create_session(NewSession {
            id: id.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: Duration::from_secs(600),
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
        .expect("create a session");
    id
}

/// Grows `session` to `rows` turns: a journal row, a checkpoint and two messages each
/// (the rows need no valid seals: only plans are looked at; every other message refers
/// to a model row, as a stored reply does).
async fn grow(conn: &mut PgConnection, session: &str, rows: i64) {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
           ordinal, replay_class, status, args, schema_hash, attempt, fence, format, \
           issued_at, seq) \
         SELECT '{session}-' || n, '{session}', 'model', n, 'model', 'h', 0, 'pure', \
           'completed', '{{}}', 's', 1, 1, 1, 0, n FROM generate_series(1, {rows}) n; \
         INSERT INTO durable_messages (session_num, seq, message, format, created_at, \
           call_seq) \
         SELECT (SELECT num FROM durable_sessions WHERE id = '{session}'), n, CASE WHEN n % 2 = 1 THEN '' \
           ELSE '{{\"text\":\"a message\"}}' END, 1, 0, \
           CASE WHEN n % 2 = 1 THEN (n + 1) / 2 END \
         FROM generate_series(1, 2 * {rows}) n; \
         INSERT INTO durable_checkpoints (session_num, version, last_seq, message_count, plan, \
           budget, state, app_version, format, created_at) \
         SELECT (SELECT num FROM durable_sessions WHERE id = '{session}'), n, 2 * n, 2 * n, '{{}}', '{{}}', 'null', 'v1', 1, 0 \
         FROM generate_series(1, {rows}) n; \
         UPDATE durable_sessions SET journal_rows = {rows}, latest_version = {rows} \
         WHERE id = '{session}'"
    )))
    .execute(conn)
    .await
    .expect("grow the session");
}

/// Rows removed by join filters anywhere in `plan`: a lookup that matched part of a key
/// in an index and the rest row by row.
fn join_filtered(plan: &Value) -> i64 {
    plan["Rows Removed by Join Filter"].as_i64().unwrap_or(0)
        + plan["Plans"]
            .as_array()
            .into_iter()
            .flatten()
            .map(join_filtered)
            .sum::<i64>()
}

/// A session created after the tables were analyzed is estimated at a row or so. The
/// window and range reads must still look its checkpoints and messages up by their whole
/// keys: as plain joins, the window read matched the version in a join filter, every
/// checkpoint of such a session against every other (270 ms at 1,000 turns in a bench).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_newer_than_the_statistics_is_read_by_whole_keys() {
    let db = test_database().await;
    let store = db.store().await.expect("connect the store");
    let ids = [new_session(&store).await, new_session(&store).await];
    let mut conn = store.pool().acquire().await.expect("a connection");
    for table in GROWING {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = off)"
        )))
        .execute(&mut *conn)
        .await
        .expect("no autovacuum during the test");
    }
    // The first session is in the statistics; the second grows after them.
    grow(&mut conn, ids[0].as_str(), ROWS).await;
    sqlx::raw_sql(
        "ANALYZE durable_sessions, durable_tool_calls, durable_messages, durable_checkpoints",
    )
    .execute(&mut *conn)
    .await
    .expect("analyze");
    let newer = ids[1].as_str();
    grow(&mut conn, newer, 1000).await;
    drop(conn);
    let store = db.store().await.expect("connect again");
    let mut conn = store.pool().acquire().await.expect("a store connection");
    for sql in [WINDOW_READ, RANGE_READ] {
        run(&mut conn, sql, newer, 1).await;
        // Planned for its parameters, as the store's unnamed statement is.
        let explain = AssertSqlSafe(format!("EXPLAIN (ANALYZE, FORMAT JSON) {sql}"));
        let row = bind(sqlx::query(explain), sql, newer, 1)
            .persistent(false)
            .fetch_one(&mut *conn)
            .await
            .expect("explain");
        let plan: Value = sqlx::Row::get(&row, 0);
        let removed = join_filtered(&plan[0]["Plan"]);
        assert_eq!(
            removed, 0,
            "{sql}: rows removed by join filters; plan {plan:#}"
        );
        let mut found = Vec::new();
        scans(&plan[0]["Plan"], &mut found);
        for (node, relation, cond, removed) in &found {
            assert!(
                node.starts_with("Index") && !cond.is_empty() && *removed == 0,
                "{sql}: {node} of {relation} on {cond:?} filtered out {removed} rows; plan {plan:#}"
            );
        }
    }
}

/// Asserts that the read `sql` as the store runs it on `conn` reads every growing table
/// by an index, filtering nothing out, at a new step after the session's last: `prepared`,
/// the connection's prepared statement on its generic plan (made when the statement was
/// first run, whatever the tables held then); otherwise an unprepared statement, not among
/// the connection's prepared ones, planned for its parameters.
async fn assert_indexed(conn: &mut PgConnection, sql: &str, session: &str, prepared: bool) {
    let step = ROWS + 1;
    let statement: Option<(String, i64)> = sqlx::query_as(
        "SELECT name, generic_plans FROM pg_prepared_statements WHERE statement = $1",
    )
    .bind(sql)
    .persistent(false)
    .fetch_optional(&mut *conn)
    .await
    .expect("pg_prepared_statements");
    let plan: Value = if prepared {
        let (name, generic_plans) = statement.expect("the store's prepared statement");
        assert!(generic_plans > 0, "{sql} runs on its generic plan");
        sqlx::query_scalar(AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({})",
            literals(sql, session, step)
        )))
        .fetch_one(&mut *conn)
        .await
        .expect("explain the prepared statement")
    } else {
        assert!(statement.is_none(), "{sql} is not prepared");
        let explain = AssertSqlSafe(format!("EXPLAIN (ANALYZE, FORMAT JSON) {sql}"));
        let query = bind(sqlx::query(explain), sql, session, step).persistent(false);
        let row = query
            .fetch_one(&mut *conn)
            .await
            .expect("explain the unprepared read");
        sqlx::Row::get(&row, 0)
    };
    let mut found = Vec::new();
    scans(&plan[0]["Plan"], &mut found);
    assert!(!found.is_empty(), "{sql} reads a growing table");
    for (node, relation, cond, removed) in &found {
        assert!(
            node.starts_with("Index") && !cond.is_empty() && *removed == 0,
            "{sql}: {node} of {relation} on {cond:?} filtered out {removed} rows; plan {plan:#}"
        );
    }
}

/// Whether index condition `cond` on `relation` names a whole key: a journal row by its
/// id, or a session's rows by a position, step or version as well as the session.
fn whole_key(relation: &str, cond: &str) -> bool {
    match relation {
        "durable_tool_calls" => {
            cond.starts_with("(id = ")
                || (cond.contains("session_id") && (cond.contains("step") || cond.contains("seq")))
        }
        "durable_messages" => cond.contains("session_num") && cond.contains("seq"),
        "durable_checkpoints" => cond.contains("session_num") && cond.contains("version"),
        _ => false,
    }
}

/// The statements of a `pure` call, an `unsafe_on_replay` call and an agent turn (the
/// model's reply journaled, a checkpoint) run on their generic plans, and once the
/// statistics see a large journal (autovacuum analyzes a table after 50 rows, then after
/// every 10 % of growth, and the cached plans are made again) each of those plans looks
/// every row of a growing table up by a whole key. `EXPLAIN EXECUTE` of each of the
/// store's prepared statements on its one connection (a generic plan does not depend on
/// the arguments).
///
/// A generic plan is the plan for the tables as the statistics last saw them: made on
/// nearly empty tables, one may find the journal's identity (the write's `NOT EXISTS`)
/// by the session alone, or read a few checkpoints by a sequential scan, until autovacuum
/// analyzes the table again (10 % more rows). A custom plan was no wiser on those
/// statistics; it cost a planning per execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writes_generic_plans_look_rows_up_by_whole_keys() {
    use durable_core::ids::CallId;
    use durable_core::replay::ReplayClass;
    use durable_core::store::{
        CallIdentity, CallKind, CallOutcome, FinishCall, IssueOutcome, NewCall,
    };

    let db = test_database().await;
    let store = crate::PostgresStore::connect_with(
        crate::PostgresStoreOptions::new(db.url()).max_connections(1),
    )
    .await
    .expect("the store");
    for table in GROWING {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = off)"
        )))
        .execute(store.pool())
        .await
        .expect("no autovacuum during the test");
    }
    let session = SessionId::random();
    let (_, lease) = store
        .create_session(NewSession {
            id: session.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: Duration::from_secs(600),
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
        .expect("create a session");
    let fence = lease.fence();
    let call = |step: i64, kind: CallKind, tool: &str, ordinal: i64| NewCall {
        id: CallId::random(),
        kind,
        identity: CallIdentity {
            session: session.clone(),
            step,
            tool: tool.into(),
            input_hash: if kind == CallKind::Model {
                String::new()
            } else {
                "h".into()
            },
            ordinal,
        },
        class: if tool == "unsafe" {
            ReplayClass::UnsafeOnReplay
        } else {
            ReplayClass::Pure
        },
        args: json!({}),
        idempotency_key: None,
        schema_hash: "s".into(),
    };
    let done = || FinishCall {
        outcome: CallOutcome::Completed(json!(1)),
        spend: None,
    };
    let mut version = 0;
    for n in 1..=16 {
        if n == 9 {
            // Another session grows to thousands of rows, and autovacuum's ANALYZE (after
            // 50 rows, then after every 10 % of growth) sees them: the cached plans are
            // made again, from the statistics.
            let other = new_session(&store).await;
            let mut conn = store.pool().acquire().await.expect("a connection");
            grow(&mut conn, other.as_str(), ROWS).await;
            sqlx::raw_sql(
                "ANALYZE durable_sessions, durable_tool_calls, durable_messages, \
                 durable_checkpoints",
            )
            .execute(&mut *conn)
            .await
            .expect("analyze");
        }
        let step = version;
        store
            .record_call(fence, call(step, CallKind::Tool, "pure", n), done())
            .await
            .expect("a pure call");
        let IssueOutcome::Inserted(issued) = store
            .issue_call(fence, call(step, CallKind::Tool, "unsafe", n))
            .await
            .expect("issue")
        else {
            panic!("issued twice");
        };
        store
            .finish_call(fence, &issued.id, done(), None)
            .await
            .expect("finish");
        store
            .record_call(fence, call(step, CallKind::Model, "@model", 0), done())
            .await
            .expect("the model's reply");
        let saved = store
            .save_checkpoint(
                fence,
                version,
                NewCheckpoint {
                    messages: vec![json!({"text": "reply"}), json!({"text": "result"})],
                    plan: json!({}),
                    budget: json!({}),
                    state: Value::Null,
                    wake_at: None,
                },
            )
            .await
            .expect("checkpoint");
        version = saved.version;
    }
    let mut conn = store
        .pool()
        .acquire()
        .await
        .expect("the store's connection");
    let statements: Vec<(String, String, i64, i64)> = sqlx::query_as(
        "SELECT name, statement, generic_plans, \
           COALESCE(array_length(parameter_types, 1), 0)::bigint \
         FROM pg_prepared_statements WHERE generic_plans > 0 OR custom_plans >= 8",
    )
    .persistent(false)
    .fetch_all(&mut *conn)
    .await
    .expect("pg_prepared_statements");
    let mut checked = 0;
    for (name, sql, generic_plans, parameters) in &statements {
        assert!(
            *generic_plans > 0,
            "{sql}: planned afresh at every execution"
        );
        let nulls = match usize::try_from(*parameters).unwrap_or(0) {
            0 => String::new(),
            n => format!("({})", vec!["NULL"; n].join(", ")),
        };
        let plan: Value = sqlx::query_scalar(AssertSqlSafe(format!(
            "EXPLAIN (FORMAT JSON) EXECUTE {name}{nulls}"
        )))
        .persistent(false)
        .fetch_one(&mut *conn)
        .await
        .expect("explain the generic plan");
        let mut found = Vec::new();
        scans(&plan[0]["Plan"], &mut found);
        for (node, relation, cond, _) in &found {
            if node == "ModifyTable" {
                continue;
            }
            assert!(
                node.starts_with("Index") && whole_key(relation, cond),
                "{sql}: {node} of {relation} on {cond:?}; plan {plan:#}"
            );
        }
        checked += 1;
    }
    // The read and the write of each: `record_call`, `issue_call`, `finish_call` and
    // `save_checkpoint` (the step read, once a step, is checked above).
    assert!(
        checked >= 7,
        "only {checked} statements ran on their generic plans"
    );
}
