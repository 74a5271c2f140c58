-- durable schema, version 13: signals sent into a session.
--
-- One row per signal: its session, name, payload (JSON text), sender, the sender's
-- idempotency key, when it was sent, and, once the session read it, the key of the
-- journal call that consumed it and when. Outside the seals, like the approvals'
-- requests before a decision: what a session read is recorded, sealed, in its journal
-- row; a row edited here before it is read is a signal sent by whoever can write the
-- database. Purged with the session.
CREATE TABLE durable_signals (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id   TEXT    NOT NULL REFERENCES durable_sessions (id),
    name         TEXT    NOT NULL,
    payload      TEXT    NOT NULL,
    sent_by      TEXT    NOT NULL,
    send_key     TEXT,
    sent_at      INTEGER NOT NULL,
    consumed_by  TEXT,
    consumed_at  INTEGER
) STRICT;

-- A session's pending signals by name, oldest first (what a read takes).
CREATE INDEX durable_signals_pending ON durable_signals (session_id, name, id)
    WHERE consumed_by IS NULL;

-- A send retried under its key finds the first.
CREATE UNIQUE INDEX durable_signals_key ON durable_signals (session_id, send_key)
    WHERE send_key IS NOT NULL;

-- A read re-run under its consumer key finds what it consumed.
CREATE UNIQUE INDEX durable_signals_consumer ON durable_signals (session_id, consumed_by)
    WHERE consumed_by IS NOT NULL;
