-- durable schema, version 12: child sessions, waiting for them, and cancellation.
--
-- Columns with no default: adding them rewrites nothing, and every session written
-- before this version has no parent, waits for nothing and was asked nothing. Like the
-- lease columns they are outside the head's seal: scheduling and bookkeeping state.
-- Editing one can make a session wake early or late, or show another parent; never
-- replay an effect (a child's id is derived from its start's sealed journal row, and
-- the journal decides what a resumed session may do).

-- The session that started this one as its child.
ALTER TABLE durable_sessions ADD COLUMN parent_id TEXT;

-- What the session waits for with its lease given up ('children'), and until when at
-- the latest (ms, the database's clock): no claim takes it before, unless what it waits
-- for happens first, which clears both.
ALTER TABLE durable_sessions ADD COLUMN waiting_for TEXT;
ALTER TABLE durable_sessions ADD COLUMN waiting_until INTEGER;

-- A cancellation asked while a worker held the session: who, why, when. The worker
-- stops at its next safe point; whoever takes the session next ends it.
ALTER TABLE durable_sessions ADD COLUMN cancel_by TEXT;
ALTER TABLE durable_sessions ADD COLUMN cancel_reason TEXT;
ALTER TABLE durable_sessions ADD COLUMN cancel_requested_at INTEGER;

-- A parent's children, without a scan of the table.
CREATE INDEX durable_sessions_parent ON durable_sessions (parent_id, created_at)
    WHERE parent_id IS NOT NULL;
