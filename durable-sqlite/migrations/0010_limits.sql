-- durable schema, version 10: fleet-wide rate limits, claim priorities and tenant limits.
--
-- One row per named limit: its definition and its buckets (GCRA theoretical arrival
-- times, the latest start given, a provider's 429 hold, counters), each a JSON text
-- the core reads and writes (`durable_core::limiter`). Every acquire updates the row
-- inside one write transaction, which serialises the fleet's reservations: starts are
-- given first come, first served. A waiter that may come back for its place (a session
-- released while it waits) keeps its reservation in `durable_limit_waiters` until it
-- takes it. Scheduling state, unsealed, as queue limits are.
CREATE TABLE durable_limits (
    name TEXT PRIMARY KEY NOT NULL,
    definition TEXT NOT NULL,
    state TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE durable_limit_waiters (
    limit_name TEXT NOT NULL,
    waiter TEXT NOT NULL,
    start_us INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (limit_name, waiter)
);

CREATE INDEX durable_limit_waiters_by_start ON durable_limit_waiters (limit_name, start_us);

-- Claim priorities: a session's priority, and its claim rank `created_at − priority ×
-- aging` (ms), set by the submitter; claims take the lowest rank first. NULL (every
-- session written before this version, and one never given a priority) ranks at its
-- `created_at`, as claims ordered before. Scheduling state, outside the seals.
ALTER TABLE durable_sessions ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;

ALTER TABLE durable_sessions ADD COLUMN claim_rank INTEGER;

CREATE INDEX durable_sessions_claim_rank ON durable_sessions (coalesce(claim_rank, created_at))
    WHERE status = 'active';

-- Tenants: the tenant a session counts against (set by its submitter), and each
-- tenant's fleet-wide limit of sessions leased at once, enforced by claims as a queue's
-- limit is.
ALTER TABLE durable_sessions ADD COLUMN tenant TEXT;

CREATE TABLE durable_tenants (
    name        TEXT    PRIMARY KEY,
    max_running INTEGER NOT NULL CHECK (max_running >= 0),
    updated_at  INTEGER NOT NULL
) STRICT;

CREATE INDEX durable_sessions_active_tenant ON durable_sessions (tenant, lease_expires_at)
    WHERE status = 'active' AND tenant IS NOT NULL;
