-- durable schema, version 9: worker pools, queues with fleet-wide limits, durable
-- sleep and the last renewal of a lease (SQLite's schema 7).
--
-- Constant defaults or none: PostgreSQL rewrites no row. Like the lease columns these
-- are scheduling state, outside the head's seal: editing one can make a session run
-- early, late or not at all, never replay an effect (the journal decides what a resumed
-- session may do).

-- The queue a session runs in: pools may claim from some queues only, and a queue may
-- have a fleet-wide limit (durable_queues).
ALTER TABLE durable_sessions ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';

-- When the session's sleep ends (ms, the database's clock): no claim takes it before.
-- Written by a checkpoint (NULL clears it).
ALTER TABLE durable_sessions ADD COLUMN wake_at BIGINT;

-- When the current lease was last taken or renewed (ms): what operators read to tell a
-- live worker from a dead one.
ALTER TABLE durable_sessions ADD COLUMN lease_renewed_at BIGINT;

-- Fleet-wide limits: at most max_running sessions of the queue leased at once. A claim
-- that would take a session of a limited queue locks the queue's row first, then counts
-- its running sessions: two claimers cannot both take its last place.
CREATE TABLE durable_queues (
    name        TEXT   PRIMARY KEY,
    max_running BIGINT NOT NULL CHECK (max_running >= 0),
    updated_at  BIGINT NOT NULL
);

-- Claims take the oldest active session first (by creation: a session handed over
-- mid-run goes before work submitted after it).
CREATE INDEX durable_sessions_claim ON durable_sessions (created_at, id) WHERE status = 'active';

-- Counting a queue's running sessions, and its sleepers, without a scan of the table.
CREATE INDEX durable_sessions_active_queue ON durable_sessions (queue, lease_expires_at)
    WHERE status = 'active';
CREATE INDEX durable_sessions_sleeping ON durable_sessions (wake_at)
    WHERE status = 'active' AND wake_at IS NOT NULL;
