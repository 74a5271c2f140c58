-- durable schema, version 14: operators' raises of a session's budget ceilings.
--
-- One audit row per raise: which ceiling (`usd`, `tokens`, `model_calls`, `tool_calls`,
-- `wall_time`, `tool:<name>`), its new amount in the limit's unit, who, why, when
-- (database clock, ms). The journal reads a session's rows only when a ceiling would
-- refuse a call, and a raise never lowers a ceiling, so a row erased only costs a
-- refusal an operator raises again. Purged with the session.
CREATE TABLE durable_limit_raises (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id  TEXT   NOT NULL REFERENCES durable_sessions (id),
    limit_name  TEXT   NOT NULL,
    ceiling     BIGINT NOT NULL CHECK (ceiling >= 0),
    raised_by   TEXT   NOT NULL,
    note        TEXT,
    created_at  BIGINT NOT NULL
);
CREATE INDEX durable_limit_raises_session ON durable_limit_raises (session_id, id);
