-- durable schema, version 1 (logical schema: notes/SCHEMA.md, shared with Postgres).
--
-- Times are INTEGER milliseconds since the Unix epoch, read from the database clock.
-- JSON is stored as TEXT (exact bytes round-trip) next to `format`, the
-- `durable_core::store::FORMAT_VERSION` of the writer; readers refuse larger formats.
-- STRICT tables: SQLite enforces the declared column types.

-- `num` is the session's compact key in the two tables that grow with the conversation
-- (messages and checkpoints): an integer instead of the id text in every row.
CREATE TABLE durable_sessions (
    num               INTEGER PRIMARY KEY,
    id                TEXT    NOT NULL UNIQUE,
    status            TEXT    NOT NULL,
    app_version       TEXT    NOT NULL,
    metadata          TEXT    NOT NULL,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    fence             INTEGER NOT NULL DEFAULT 0,
    recovery_attempts INTEGER NOT NULL DEFAULT 0,
    status_reason     TEXT,
    latest_version    INTEGER NOT NULL DEFAULT 0,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    format            INTEGER NOT NULL
) STRICT;

-- claim_expired / list_expired / list_sessions scan by status, oldest update first.
CREATE INDEX durable_sessions_status_updated ON durable_sessions (status, updated_at);

-- The transcript: an append-only log, seq 1, 2, … per session.
CREATE TABLE durable_messages (
    session_num INTEGER NOT NULL REFERENCES durable_sessions (num),
    seq        INTEGER NOT NULL,
    message    TEXT    NOT NULL,
    format     INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (session_num, seq)
) STRICT, WITHOUT ROWID;

-- Versioned checkpoints, never updated in place. Version v's transcript is the log up
-- to and including last_seq. A plan/budget/state equal to the previous version's is
-- stored as `@k`, a reference to the version k that holds its text (JSON never starts
-- with `@`), so unchanged snapshots cost a few bytes per checkpoint.
CREATE TABLE durable_checkpoints (
    session_num   INTEGER NOT NULL REFERENCES durable_sessions (num),
    version       INTEGER NOT NULL,
    last_seq      INTEGER NOT NULL,
    message_count INTEGER NOT NULL,
    plan          TEXT    NOT NULL,
    budget        TEXT    NOT NULL,
    state         TEXT    NOT NULL,
    app_version   TEXT    NOT NULL,
    format        INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (session_num, version)
) STRICT, WITHOUT ROWID;

-- The journal. The UNIQUE identity is what makes issue_call an atomic insert-or-get.
CREATE TABLE durable_tool_calls (
    id              TEXT    NOT NULL PRIMARY KEY,
    session_id      TEXT    NOT NULL REFERENCES durable_sessions (id),
    kind            TEXT    NOT NULL,
    step            INTEGER NOT NULL,
    tool_name       TEXT    NOT NULL,
    input_hash      TEXT    NOT NULL,
    ordinal         INTEGER NOT NULL,
    replay_class    TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    args            TEXT    NOT NULL,
    idempotency_key TEXT,
    schema_hash     TEXT    NOT NULL,
    result          TEXT,
    error           TEXT,
    spend           TEXT,
    mac             TEXT,
    attempt         INTEGER NOT NULL,
    fence           INTEGER NOT NULL,
    format          INTEGER NOT NULL,
    issued_at       INTEGER NOT NULL,
    finished_at     INTEGER,
    seq             INTEGER NOT NULL,
    UNIQUE (session_id, step, tool_name, input_hash, ordinal)
) STRICT;

CREATE INDEX durable_tool_calls_key
    ON durable_tool_calls (tool_name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX durable_tool_calls_status ON durable_tool_calls (status);
CREATE INDEX durable_tool_calls_session_seq ON durable_tool_calls (session_id, seq);

-- Retry history of LLM/API errors. `id` (the rowid) keeps insertion order.
CREATE TABLE durable_errors (
    id         INTEGER PRIMARY KEY,
    session_id TEXT    NOT NULL REFERENCES durable_sessions (id),
    step       INTEGER NOT NULL,
    context    TEXT    NOT NULL,
    attempt    INTEGER NOT NULL,
    message    TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

CREATE INDEX durable_errors_session ON durable_errors (session_id, id);

-- Audit of operator resolutions of in-doubt calls.
CREATE TABLE durable_resolutions (
    id          INTEGER PRIMARY KEY,
    call_id     TEXT    NOT NULL REFERENCES durable_tool_calls (id),
    session_id  TEXT    NOT NULL REFERENCES durable_sessions (id),
    decision    TEXT    NOT NULL,
    result      TEXT,
    resolved_by TEXT    NOT NULL,
    note        TEXT,
    format      INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;

CREATE INDEX durable_resolutions_session ON durable_resolutions (session_id, id);

-- Audit of app-version migrations; step_map is a JSON array of [old, new] pairs.
CREATE TABLE durable_migrations (
    id           INTEGER PRIMARY KEY,
    session_id   TEXT    NOT NULL REFERENCES durable_sessions (id),
    from_version TEXT    NOT NULL,
    to_version   TEXT    NOT NULL,
    step_map     TEXT    NOT NULL,
    migrated_by  TEXT    NOT NULL,
    format       INTEGER NOT NULL,
    created_at   INTEGER NOT NULL
) STRICT;

CREATE INDEX durable_migrations_session ON durable_migrations (session_id, id);
