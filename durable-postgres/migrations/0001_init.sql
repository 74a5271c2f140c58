-- The logical schema shared by every `durable` backend (see SCHEMA.md).
-- JSON is stored as TEXT, not JSONB: replay needs the exact bytes back (JSONB reorders keys).
-- Times are BIGINT milliseconds since the Unix epoch, read from the database clock.

CREATE TABLE durable_sessions (
    id                TEXT PRIMARY KEY,
    status            TEXT NOT NULL,
    app_version       TEXT NOT NULL,
    metadata          TEXT NOT NULL,
    lease_owner       TEXT,
    lease_expires_at  BIGINT,
    fence             BIGINT NOT NULL DEFAULT 0,
    recovery_attempts INTEGER NOT NULL DEFAULT 0,
    status_reason     TEXT,
    latest_version    BIGINT NOT NULL DEFAULT 0,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    format            INTEGER NOT NULL
);

-- Recovery scans: active sessions, oldest update first.
CREATE INDEX durable_sessions_status_updated ON durable_sessions (status, updated_at);

-- The transcript: an append-only log; seq starts at 1 per session.
CREATE TABLE durable_messages (
    session_id TEXT NOT NULL REFERENCES durable_sessions (id),
    seq        BIGINT NOT NULL,
    message    TEXT NOT NULL,
    format     INTEGER NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

-- Checkpoints are never updated: version v's transcript is the log up to last_seq.
CREATE TABLE durable_checkpoints (
    session_id    TEXT NOT NULL REFERENCES durable_sessions (id),
    version       BIGINT NOT NULL,
    last_seq      BIGINT NOT NULL,
    message_count BIGINT NOT NULL,
    plan          TEXT NOT NULL,
    budget        TEXT NOT NULL,
    state         TEXT NOT NULL,
    app_version   TEXT NOT NULL,
    format        INTEGER NOT NULL,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (session_id, version)
);

-- The journal. `seq` orders rows by insertion (one sequence for the whole table: only the
-- order is observable, and a sequence needs no lock where a per-session MAX(seq)+1 would).
CREATE TABLE durable_tool_calls (
    id              TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES durable_sessions (id),
    kind            TEXT NOT NULL,
    step            BIGINT NOT NULL,
    tool_name       TEXT NOT NULL,
    input_hash      TEXT NOT NULL,
    ordinal         BIGINT NOT NULL,
    replay_class    TEXT NOT NULL,
    status          TEXT NOT NULL,
    args            TEXT NOT NULL,
    idempotency_key TEXT,
    schema_hash     TEXT NOT NULL,
    result          TEXT,
    error           TEXT,
    spend           TEXT,
    mac             TEXT,
    attempt         INTEGER NOT NULL,
    fence           BIGINT NOT NULL,
    format          INTEGER NOT NULL,
    issued_at       BIGINT NOT NULL,
    finished_at     BIGINT,
    seq             BIGINT GENERATED ALWAYS AS IDENTITY,
    CONSTRAINT durable_tool_calls_identity
        UNIQUE (session_id, step, tool_name, input_hash, ordinal)
);

CREATE INDEX durable_tool_calls_idempotency
    ON durable_tool_calls (tool_name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX durable_tool_calls_status ON durable_tool_calls (status);
CREATE INDEX durable_tool_calls_session_seq ON durable_tool_calls (session_id, seq);

-- Retry history of LLM/API errors. `id` only orders rows.
CREATE TABLE durable_errors (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES durable_sessions (id),
    step       BIGINT NOT NULL,
    context    TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    message    TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX durable_errors_session ON durable_errors (session_id, id);

-- Audit of operator resolutions of in-doubt calls.
CREATE TABLE durable_resolutions (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    call_id     TEXT NOT NULL REFERENCES durable_tool_calls (id),
    session_id  TEXT NOT NULL REFERENCES durable_sessions (id),
    decision    TEXT NOT NULL CHECK (decision IN ('happened', 'did_not_happen')),
    result      TEXT,
    resolved_by TEXT NOT NULL,
    note        TEXT,
    format      INTEGER NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX durable_resolutions_session ON durable_resolutions (session_id, id);

-- Audit of app-version migrations; step_map is a JSON array of [old, new] pairs.
CREATE TABLE durable_migrations (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES durable_sessions (id),
    from_version TEXT NOT NULL,
    to_version   TEXT NOT NULL,
    step_map     TEXT NOT NULL,
    migrated_by  TEXT NOT NULL,
    format       INTEGER NOT NULL,
    created_at   BIGINT NOT NULL
);
CREATE INDEX durable_migrations_session ON durable_migrations (session_id, id);
