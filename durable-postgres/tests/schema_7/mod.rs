//! Turns a database of this release back into what schema 7 wrote: no approvals (no
//! `approval` column on journal rows, no count of them in the heads, no approval log),
//! no worker-pool columns, no list of heads to count, the tracking table at version 7. Shared by the upgrade tests.

use sqlx::postgres::PgPool;

/// The statements that undo schema 8, in order. Only a database without approvals can
/// go back: a head that counts some is sealed with the count, which schema 7 never wrote.
const UNDO_8: [&str; 9] = [
    // What schema 7 could not have held: checked, not changed.
    "SELECT 1 FROM durable_approvals",
    "SELECT 1 FROM durable_sessions WHERE approvals <> 0",
    "SELECT 1 FROM durable_tool_calls WHERE approval IS NOT NULL",
    "DROP TABLE durable_approvals",
    "DROP INDEX durable_tool_calls_requested",
    "ALTER TABLE durable_tool_calls DROP COLUMN approval",
    "ALTER TABLE durable_sessions DROP COLUMN approvals",
    "DELETE FROM durable_schema_migrations WHERE version >= 8",
    "SELECT 1 FROM information_schema.columns \
     WHERE table_name IN ('durable_tool_calls', 'durable_sessions') \
       AND column_name IN ('approval', 'approvals')",
];

/// The statements that undo schema 9 (worker pools): its columns, table and indexes
/// hold scheduling state only, dropped with whatever they hold.
const UNDO_9: [&str; 8] = [
    "DROP INDEX durable_sessions_claim",
    "DROP INDEX durable_sessions_sleeping",
    "DROP INDEX durable_sessions_active_queue",
    "DROP TABLE durable_queues",
    "ALTER TABLE durable_sessions DROP COLUMN lease_renewed_at",
    "ALTER TABLE durable_sessions DROP COLUMN wake_at",
    "ALTER TABLE durable_sessions DROP COLUMN queue",
    "DELETE FROM durable_schema_migrations WHERE version >= 9",
];

/// The statements that undo schema 10 (the heads still to count listed in a table of
/// their own): the partial index of version 4 back.
const UNDO_10: [&str; 3] = [
    "CREATE INDEX durable_sessions_uncounted ON durable_sessions (created_at, id) \
     WHERE issued_rows IS NULL",
    "DROP TABLE durable_uncounted_heads",
    "DELETE FROM durable_schema_migrations WHERE version >= 10",
];

/// The statements that undo schema 11 (whether a lease's holder ran the session):
/// scheduling state, dropped with whatever it holds.
const UNDO_11: [&str; 2] = [
    "ALTER TABLE durable_sessions DROP COLUMN lease_ran",
    "DELETE FROM durable_schema_migrations WHERE version >= 11",
];

/// The statements that undo schema 12 (an in-doubt row waiting for an operator):
/// scheduling state, dropped with whatever it holds.
const UNDO_12: [&str; 2] = [
    "ALTER TABLE durable_tool_calls DROP COLUMN operator_needed_at",
    "DELETE FROM durable_schema_migrations WHERE version >= 12",
];

/// The statements that undo schema 16 (signals): a table, dropped with whatever it
/// holds.
const UNDO_16: [&str; 2] = [
    "DROP TABLE durable_signals",
    "DELETE FROM durable_schema_migrations WHERE version >= 16",
];

/// The statements that undo schema 15 (child sessions, waits, cancellation requests):
/// bookkeeping columns, dropped with whatever they hold.
const UNDO_15: [&str; 8] = [
    "DROP INDEX durable_sessions_parent",
    "ALTER TABLE durable_sessions DROP COLUMN parent_id",
    "ALTER TABLE durable_sessions DROP COLUMN waiting_for",
    "ALTER TABLE durable_sessions DROP COLUMN waiting_until",
    "ALTER TABLE durable_sessions DROP COLUMN cancel_by",
    "ALTER TABLE durable_sessions DROP COLUMN cancel_reason",
    "ALTER TABLE durable_sessions DROP COLUMN cancel_requested_at",
    "DELETE FROM durable_schema_migrations WHERE version >= 15",
];

/// The statements that undo schema 13 (rate limits, claim priorities, tenants):
/// scheduling state, dropped with whatever it holds.
const UNDO_13: [&str; 9] = [
    "DROP INDEX durable_sessions_active_tenant",
    "DROP TABLE durable_tenants",
    "ALTER TABLE durable_sessions DROP COLUMN tenant",
    "DROP INDEX durable_sessions_claim_rank",
    "ALTER TABLE durable_sessions DROP COLUMN claim_rank",
    "ALTER TABLE durable_sessions DROP COLUMN priority",
    "DROP TABLE durable_limit_waiters",
    "DROP TABLE durable_limits",
    "DELETE FROM durable_schema_migrations WHERE version >= 13",
];

/// The statements that undo schema 14 (operators' raises of budget ceilings): an audit
/// table, dropped with whatever it holds.
const UNDO_14: [&str; 2] = [
    "DROP TABLE durable_limit_raises",
    "DELETE FROM durable_schema_migrations WHERE version >= 14",
];

/// Undoes schemas 16, 15, 14, 13, 12, 11, 10, 9 and 8 (see [`UNDO_16`], [`UNDO_15`], [`UNDO_14`], [`UNDO_13`], [`UNDO_12`], [`UNDO_11`],
/// [`UNDO_10`], [`UNDO_9`], [`UNDO_8`]);
/// panics if the database holds approvals, or if anything of schema 8 is left.
pub async fn back_to_schema_7(pool: &PgPool) {
    let mut tx = pool.begin().await.expect("a transaction");
    for sql in UNDO_16
        .into_iter()
        .chain(UNDO_15)
        .chain(UNDO_14)
        .chain(UNDO_13)
        .chain(UNDO_12)
        .chain(UNDO_11)
        .chain(UNDO_10)
        .chain(UNDO_9)
        .chain(UNDO_8)
    {
        let rows = sqlx::query(sql).fetch_all(&mut *tx).await.expect(sql);
        if sql.starts_with("SELECT") {
            assert!(
                rows.is_empty(),
                "schema 8 holds what schema 7 cannot: {sql}"
            );
        }
    }
    tx.commit().await.expect("commit");
}
