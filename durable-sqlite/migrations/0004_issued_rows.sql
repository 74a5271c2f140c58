-- durable schema, version 4: the session head counts its issued rows.
--
-- `issued_rows` is how many of the session's journal rows have status `issued` (in doubt
-- after a crash), sealed into the head with the other counts, so that a resume reads only
-- those rows (by the partial index of issued rows) and still sees a row set to or from
-- `issued` behind the store's back. NULL on a head written before this version: the
-- store counts and re-seals such heads once, when it opens the database, after checking
-- each under its old seal (see `keys::upgrade_heads`).
ALTER TABLE durable_sessions ADD COLUMN issued_rows INTEGER;

-- The heads still to count (only right after this migration, or a session that failed
-- its checks then): found at every open without scanning the sessions.
CREATE INDEX durable_sessions_uncounted ON durable_sessions (num) WHERE issued_rows IS NULL;
