-- durable schema, version 7: the session's integer key in the tables that grow with the
-- conversation (SQLite's store has had it from its first version).
--
-- Every message and checkpoint row named its session by the id text: a UUID is 37 bytes
-- stored, in the row and again in its primary key's index, several times per turn. They
-- now name it by `num`, the session's integer key: 8 bytes. The journal keeps the id, as
-- in SQLite: its rows are named by call id, and its identity and key indexes lead with
-- the session's id. Seals are unchanged: they cover the session's id, not its key.
--
-- The two tables are rebuilt, not altered: a dropped column keeps its bytes in every row
-- until the row is rewritten. The copy takes an exclusive lock on both tables while it
-- runs, so stop the workers before upgrading a large store (as for schema 4). The new
-- tables have no statistics until autovacuum analyzes them; until then the store's
-- connections plan each statement for the tables as they are (`plan_for_fresh_tables`).

ALTER TABLE durable_sessions ADD COLUMN num BIGINT GENERATED ALWAYS AS IDENTITY;
ALTER TABLE durable_sessions ADD CONSTRAINT durable_sessions_num UNIQUE (num);

DROP VIEW durable_transcript;

-- Fixed-width columns first: no alignment padding between them.
ALTER TABLE durable_messages RENAME TO durable_messages_6;
ALTER TABLE durable_messages_6 RENAME CONSTRAINT durable_messages_pkey
    TO durable_messages_6_pkey;
CREATE TABLE durable_messages (
    session_num BIGINT  NOT NULL REFERENCES durable_sessions (num),
    seq         BIGINT  NOT NULL,
    created_at  BIGINT  NOT NULL,
    call_seq    BIGINT,
    format      INTEGER NOT NULL,
    message     TEXT    NOT NULL,
    seal        TEXT,
    PRIMARY KEY (session_num, seq)
);
INSERT INTO durable_messages (session_num, seq, created_at, call_seq, format, message, seal)
SELECT s.num, m.seq, m.created_at, m.call_seq, m.format, m.message, m.seal
FROM durable_messages_6 m JOIN durable_sessions s ON s.id = m.session_id;
DROP TABLE durable_messages_6;

ALTER TABLE durable_checkpoints RENAME TO durable_checkpoints_6;
ALTER TABLE durable_checkpoints_6 RENAME CONSTRAINT durable_checkpoints_pkey
    TO durable_checkpoints_6_pkey;
CREATE TABLE durable_checkpoints (
    session_num   BIGINT  NOT NULL REFERENCES durable_sessions (num),
    version       BIGINT  NOT NULL,
    last_seq      BIGINT  NOT NULL,
    message_count BIGINT  NOT NULL,
    created_at    BIGINT  NOT NULL,
    format        INTEGER NOT NULL,
    plan          TEXT    NOT NULL,
    budget        TEXT    NOT NULL,
    state         TEXT    NOT NULL,
    app_version   TEXT    NOT NULL,
    seal          TEXT,
    PRIMARY KEY (session_num, version)
);
INSERT INTO durable_checkpoints (session_num, version, last_seq, message_count, created_at,
                                 format, plan, budget, state, app_version, seal)
SELECT s.num, k.version, k.last_seq, k.message_count, k.created_at, k.format, k.plan,
       k.budget, k.state, k.app_version, k.seal
FROM durable_checkpoints_6 k JOIN durable_sessions s ON s.id = k.session_id;
DROP TABLE durable_checkpoints_6;

COMMENT ON COLUMN durable_checkpoints.plan IS
    'JSON text, or @k: the same text as version k of the session';
COMMENT ON COLUMN durable_checkpoints.budget IS
    'JSON text, or @k: the same text as version k of the session';
COMMENT ON COLUMN durable_checkpoints.state IS
    'JSON text, or @k: the same text as version k of the session';

-- The transcript as written (schema 6), by the session's key: a referenced model reply
-- is read from the journal row at `call_seq` of the same session.
CREATE VIEW durable_transcript AS
SELECT m.session_num, m.seq, m.format, m.seal, m.created_at,
       CASE WHEN m.call_seq IS NULL THEN m.message
            ELSE COALESCE((SELECT r.result FROM durable_sessions s
                           JOIN durable_tool_calls r ON r.session_id = s.id
                                                    AND r.seq = m.call_seq
                           WHERE s.num = m.session_num), '')
       END AS message
FROM durable_messages m;

