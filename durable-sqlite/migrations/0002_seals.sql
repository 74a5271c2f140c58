-- durable schema, version 2: tamper evidence (see durable_core::integrity).
--
-- Every row that decides replay carries a seal, `<key id>:<hex HMAC-SHA256>`: journal
-- rows in `mac` (which held an outcome-only MAC before), messages, checkpoints and
-- resolutions in `seal`. The session row is the head: how many journal rows and
-- resolutions the session has, sealed in `head` together with its latest checkpoint.
-- Rows written before this version have no seal; the store seals them once, audited in
-- durable_integrity_log, when a writer first opens the upgraded database.

-- Store-wide settings: `store_key` (the store's own random sealing key, hex) and
-- `signing_key` (the id of the key every row is sealed with).
CREATE TABLE durable_meta (
    name  TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

-- Audit of every re-sealing: adopting unsealed rows, turning an application key on,
-- rotating keys.
CREATE TABLE durable_integrity_log (
    id         INTEGER PRIMARY KEY,
    event      TEXT    NOT NULL,
    from_key   TEXT,
    to_key     TEXT    NOT NULL,
    rows       INTEGER NOT NULL,
    detail     TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

ALTER TABLE durable_sessions ADD COLUMN journal_rows INTEGER NOT NULL DEFAULT 0;
ALTER TABLE durable_sessions ADD COLUMN resolutions INTEGER NOT NULL DEFAULT 0;
ALTER TABLE durable_sessions ADD COLUMN head TEXT;
ALTER TABLE durable_messages ADD COLUMN seal TEXT;
ALTER TABLE durable_checkpoints ADD COLUMN seal TEXT;
ALTER TABLE durable_resolutions ADD COLUMN position INTEGER NOT NULL DEFAULT 0;
ALTER TABLE durable_resolutions ADD COLUMN seal TEXT;

UPDATE durable_sessions SET
    journal_rows = (SELECT COALESCE(MAX(seq), 0) FROM durable_tool_calls c
                    WHERE c.session_id = durable_sessions.id),
    resolutions = (SELECT COUNT(*) FROM durable_resolutions r
                   WHERE r.session_id = durable_sessions.id);
UPDATE durable_resolutions SET position = (
    SELECT COUNT(*) FROM durable_resolutions o
    WHERE o.session_id = durable_resolutions.session_id AND o.id <= durable_resolutions.id);
-- Old outcome-only MACs are not seals: the adoption re-seals these rows.
UPDATE durable_tool_calls SET mac = NULL;
