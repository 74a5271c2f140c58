//! The plans of an agent turn's reads on a fresh database that was never analyzed
//! (issue 11). A turn's statements are prepared by sqlx on the store's connections; a
//! generic plan made while the tables were nearly empty looked rows up by `session_id`
//! alone and filtered the rest, so a turn walked the session's whole journal until
//! autovacuum's first ANALYZE replanned it. Not a timed test: each statement is run six
//! times while the tables are small (where PostgreSQL's default `plan_cache_mode` would
//! switch to its generic plan), the session then grows to a few thousand rows, and the
//! plan of the prepared statement (`EXPLAIN (ANALYZE) EXECUTE`) must look every row up by
//! an index, with nothing filtered out (a bounded resume's window and a range of earlier
//! messages: an index range scan of 20 of the session's 6,000 messages). Once the tables
//! are analyzed, a new connection keeps the default, and the generic plans made from the
//! statistics pass the same check.

use std::time::Duration;

use durable_core::ids::SessionId;
use durable_core::store::{CheckpointStore, NewCheckpoint, NewSession};
use serde_json::{Value, json};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

use crate::checkpoints::fast::SAVE_READ;
use crate::checkpoints::reads::{RANGE_READ, WINDOW_READ};
use crate::journal::fast::INSERT_READ;
use crate::journal::reads::STEP_READ;
use crate::testing::test_database;

/// The tables that grow with a session.
const GROWING: [&str; 3] = [
    "durable_tool_calls",
    "durable_messages",
    "durable_checkpoints",
];

/// Journal rows (one per step), checkpoints, and twice as many messages.
const ROWS: i64 = 3000;

/// Runs `sql` (one of the turn's reads) as the store does: prepared, with binds.
async fn run(conn: &mut PgConnection, sql: &'static str, session: &str, step: i64) {
    let query = sqlx::query(sql).bind(session);
    let query = if sql == STEP_READ {
        query.bind(step)
    } else if sql == INSERT_READ {
        query.bind(step).bind("model").bind("h").bind(0_i64)
    } else if sql == WINDOW_READ {
        // The latest checkpoint's last 20 messages.
        query.bind(None::<i64>).bind(20_i64)
    } else if sql == RANGE_READ {
        query.bind(1000_i64).bind(1019_i64)
    } else {
        query
    };
    query.fetch_all(conn).await.expect("run a turn's read");
}

/// The arguments of `sql` as SQL literals (for `EXECUTE`).
fn literals(sql: &str, session: &str, step: i64) -> String {
    if sql == STEP_READ {
        format!("'{session}', {step}")
    } else if sql == INSERT_READ {
        format!("'{session}', {step}, 'model', 'h', 0")
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
    assert_eq!(mode, "force_custom_plan", "the store's connections");
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
        assert_indexed(&mut conn, sql, session, false).await;
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
    // `auto` switches a statement to its generic plan only when that plan is estimated
    // no dearer than the custom ones (the window and range reads, through the view
    // `durable_transcript`, keep custom plans): the generic plan is forced here so that
    // every read's is checked, whichever PostgreSQL would choose.
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .expect("force generic plans");
    for sql in reads {
        for step in 1..=6 {
            run(&mut conn, sql, session, ROWS + step).await;
        }
        assert_indexed(&mut conn, sql, session, true).await;
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
        let name: String =
            sqlx::query_scalar("SELECT name FROM pg_prepared_statements WHERE statement = $1")
                .bind(sql)
                .fetch_one(&mut *conn)
                .await
                .expect("the store's prepared statement");
        let plan: Value = sqlx::query_scalar(AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({})",
            literals(sql, newer, 1)
        )))
        .fetch_one(&mut *conn)
        .await
        .expect("explain");
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

/// Asserts that the store's prepared statement `sql` on `conn` (with a generic plan or
/// without one, as `generic`) reads every growing table by an index, filtering nothing
/// out, at a new step after the session's last.
async fn assert_indexed(conn: &mut PgConnection, sql: &str, session: &str, generic: bool) {
    let (name, generic_plans): (String, i64) = sqlx::query_as(
        "SELECT name, generic_plans FROM pg_prepared_statements WHERE statement = $1",
    )
    .bind(sql)
    .fetch_one(&mut *conn)
    .await
    .expect("the store's prepared statement");
    assert_eq!(generic_plans > 0, generic, "generic plans of {sql}");
    let step = ROWS + 1;
    let plan: Value = sqlx::query_scalar(AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({})",
        literals(sql, session, step)
    )))
    .fetch_one(&mut *conn)
    .await
    .expect("explain the prepared statement");
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
