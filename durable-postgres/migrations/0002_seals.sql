-- durable schema, version 2: tamper evidence (see durable_core::integrity).
--
-- Every row that decides replay carries a seal, `<key id>:<hex HMAC-SHA256>`: journal
-- rows in `mac` (which held an outcome-only MAC before), messages, checkpoints and
-- resolutions in `seal`. The session row is the head: how many journal rows and
-- resolutions the session has, sealed in `head` together with its latest checkpoint.
-- Rows written before this version have no seal; the store seals them once, audited in
-- durable_integrity_log, when a writer first connects to the upgraded database.

-- Store-wide settings: `store_key` (the store's own random sealing key, hex) and
-- `signing_key` (the id of the key every row is sealed with).
CREATE TABLE durable_meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Audit of every re-sealing: adopting unsealed rows, turning an application key on,
-- rotating keys.
CREATE TABLE durable_integrity_log (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event      TEXT   NOT NULL,
    from_key   TEXT,
    to_key     TEXT   NOT NULL,
    rows       BIGINT NOT NULL,
    detail     TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);

ALTER TABLE durable_sessions ADD COLUMN journal_rows BIGINT NOT NULL DEFAULT 0;
ALTER TABLE durable_sessions ADD COLUMN resolutions BIGINT NOT NULL DEFAULT 0;
ALTER TABLE durable_sessions ADD COLUMN head TEXT;
ALTER TABLE durable_messages ADD COLUMN seal TEXT;
ALTER TABLE durable_checkpoints ADD COLUMN seal TEXT;
ALTER TABLE durable_resolutions ADD COLUMN position BIGINT NOT NULL DEFAULT 0;
ALTER TABLE durable_resolutions ADD COLUMN seal TEXT;

-- A journal row's `seq` becomes its position in its session's journal (1, 2, …), as in
-- every backend: the seal covers it and the head counts it, so a deleted row leaves a
-- gap. Writers number rows under the session row's lock. Insertion order is kept.
ALTER TABLE durable_tool_calls ALTER COLUMN seq DROP IDENTITY;
UPDATE durable_tool_calls c SET seq = r.position
FROM (SELECT id, row_number() OVER (PARTITION BY session_id ORDER BY seq) AS position
      FROM durable_tool_calls) r
WHERE c.id = r.id;

UPDATE durable_sessions s SET
    journal_rows = (SELECT COALESCE(max(c.seq), 0) FROM durable_tool_calls c
                    WHERE c.session_id = s.id),
    resolutions = (SELECT count(*) FROM durable_resolutions r WHERE r.session_id = s.id);
UPDATE durable_resolutions r SET position = o.position
FROM (SELECT id, row_number() OVER (PARTITION BY session_id ORDER BY id) AS position
      FROM durable_resolutions) o
WHERE r.id = o.id;
-- Old outcome-only MACs are not seals: the adoption re-seals these rows.
UPDATE durable_tool_calls SET mac = NULL;
