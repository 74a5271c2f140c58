-- durable schema, version 4: the session head counts its issued rows.
--
-- `issued_rows` is how many of the session's journal rows have status `issued` (in doubt
-- after a crash), sealed into the head with the other counts, so that a resume reads only
-- those rows (from the partial index of issued rows, version 3) and still sees a row set
-- to or from `issued` behind the store's back. Every write that changes a row's status
-- changes it in the same transaction.
--
-- NULL on a head written before this version (sealed without the count). The store counts
-- and re-seals such heads once, when a writer opens the database, after checking each
-- under its old seal with every journal row's seal (see `keys::upgrade_heads`), so an
-- upgrade never seals over a status changed behind the store's back: a session that fails
-- those checks keeps its NULL, and the store refuses to read or write it. A column without
-- a default: adding it rewrites nothing.
ALTER TABLE durable_sessions ADD COLUMN issued_rows BIGINT;

-- The heads still to count (right after this migration, or a session that failed its
-- checks then): found at every writer's open without scanning the sessions.
CREATE INDEX durable_sessions_uncounted ON durable_sessions (created_at, id)
    WHERE issued_rows IS NULL;
