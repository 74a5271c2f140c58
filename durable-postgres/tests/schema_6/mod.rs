//! Turns a database of this release back into what schema 6 wrote: messages and
//! checkpoints named by the session's id text, no session key, the tracking table at
//! version 6. Shared by the upgrade tests.

use sqlx::postgres::PgPool;

/// The statements that undo schema 7, in order. Each table keeps its rows and their
/// bytes; only the column that names the session changes back.
const UNDO_7: [&str; 22] = [
    "DROP VIEW durable_transcript",
    "ALTER TABLE durable_messages ADD COLUMN session_id TEXT",
    "UPDATE durable_messages m SET session_id = s.id FROM durable_sessions s \
     WHERE s.num = m.session_num",
    "ALTER TABLE durable_messages DROP CONSTRAINT durable_messages_pkey",
    "ALTER TABLE durable_messages DROP COLUMN session_num",
    "ALTER TABLE durable_messages ALTER COLUMN session_id SET NOT NULL",
    "ALTER TABLE durable_messages ADD CONSTRAINT durable_messages_pkey \
     PRIMARY KEY (session_id, seq)",
    "ALTER TABLE durable_messages ADD FOREIGN KEY (session_id) \
     REFERENCES durable_sessions (id)",
    "ALTER TABLE durable_checkpoints ADD COLUMN session_id TEXT",
    "UPDATE durable_checkpoints k SET session_id = s.id FROM durable_sessions s \
     WHERE s.num = k.session_num",
    "ALTER TABLE durable_checkpoints DROP CONSTRAINT durable_checkpoints_pkey",
    "ALTER TABLE durable_checkpoints DROP COLUMN session_num",
    "ALTER TABLE durable_checkpoints ALTER COLUMN session_id SET NOT NULL",
    "ALTER TABLE durable_checkpoints ADD CONSTRAINT durable_checkpoints_pkey \
     PRIMARY KEY (session_id, version)",
    "ALTER TABLE durable_checkpoints ADD FOREIGN KEY (session_id) \
     REFERENCES durable_sessions (id)",
    "ALTER TABLE durable_sessions DROP COLUMN num",
    // Schema 6's view, as its migration wrote it.
    "CREATE VIEW durable_transcript AS \
     SELECT m.session_id, m.seq, m.format, m.seal, m.created_at, \
            CASE WHEN m.call_seq IS NULL THEN m.message \
                 ELSE COALESCE((SELECT r.result FROM durable_tool_calls r \
                                WHERE r.session_id = m.session_id AND r.seq = m.call_seq), '') \
            END AS message \
     FROM durable_messages m",
    "DELETE FROM durable_schema_migrations WHERE version >= 7",
    // What schema 6 could not have written: checked, not changed.
    "SELECT 1 FROM durable_messages WHERE session_id IS NULL",
    "SELECT 1 FROM durable_checkpoints WHERE session_id IS NULL",
    "SELECT 1 FROM information_schema.columns \
     WHERE table_name IN ('durable_messages', 'durable_checkpoints', 'durable_sessions') \
       AND column_name IN ('session_num', 'num')",
    "SELECT 1 FROM durable_schema_migrations WHERE version >= 7",
];

/// Undoes schema 8 ([`back_to_schema_7`](super::schema_7::back_to_schema_7)), then
/// schema 7 (see [`UNDO_7`]); panics if anything of them is left.
pub async fn back_to_schema_6(pool: &PgPool) {
    super::schema_7::back_to_schema_7(pool).await;
    let mut tx = pool.begin().await.expect("a transaction");
    for sql in UNDO_7 {
        let rows = sqlx::query(sql).fetch_all(&mut *tx).await.expect(sql);
        if sql.starts_with("SELECT") {
            assert!(rows.is_empty(), "left after undoing schema 7: {sql}");
        }
    }
    tx.commit().await.expect("commit");
}
