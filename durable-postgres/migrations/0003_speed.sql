-- durable schema, version 3: reads that do not grow with the session.
--
-- A journal row's `seq` is its position in its session's journal (version 2): unique per
-- session. The unique index lets a per-step read check its neighbours by position (a
-- step's rows are contiguous, so completeness of one step needs only the rows at either
-- end), and lets the whole-journal check count the session's rows from the index alone.
DROP INDEX durable_tool_calls_session_seq;
ALTER TABLE durable_tool_calls
    ADD CONSTRAINT durable_tool_calls_position UNIQUE (session_id, seq);

-- The issued rows (in doubt after a crash), which a resume reads: small, whatever the
-- journal's length. The store-wide in-doubt listing scans it too, so the index of every
-- row's status is no longer needed.
CREATE INDEX durable_tool_calls_issued ON durable_tool_calls (session_id, seq)
    WHERE status = 'issued';
DROP INDEX durable_tool_calls_status;
