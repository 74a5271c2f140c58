-- durable schema, version 10: the session row's updates stay HOT (issue 26).
--
-- Every journal write and checkpoint updates the session's row (its head: the counts and
-- their seal). PostgreSQL updates a row in place on its page, without a new entry in any
-- of the table's indexes (a heap-only tuple), only when no index names a column whose
-- value changes, in its key or in its predicate. The partial index of heads still to
-- count (version 4) named `issued_rows` in its predicate, which every unsafe call changes
-- twice (+1 when issued, -1 when finished): each such update wrote a new entry into every
-- index of the table, and left as many dead ones for VACUUM.
--
-- The heads still to count move to a narrow table of their own: found at every writer's
-- open without scanning the sessions, as before, and deleted once counted (a session
-- that fails its checks stays listed, and refused, as before). No row is rewritten.
CREATE TABLE durable_uncounted_heads (
    session_id TEXT PRIMARY KEY REFERENCES durable_sessions (id) ON DELETE CASCADE
);
INSERT INTO durable_uncounted_heads (session_id)
SELECT id FROM durable_sessions WHERE issued_rows IS NULL;
DROP INDEX durable_sessions_uncounted;
