-- durable schema, version 3: reads that do not grow with the session.
--
-- A journal row's `seq` is its position in its session's journal (version 2): unique per
-- session. The unique index lets a per-step read check its neighbours by position (a
-- step's rows are contiguous, because steps only move forward, so the completeness of
-- one step needs only the rows at either end of it), and lets the whole-journal check
-- count a session's rows from the index alone.
DROP INDEX durable_tool_calls_session_seq;
CREATE UNIQUE INDEX durable_tool_calls_position ON durable_tool_calls (session_id, seq);

-- The issued rows (in doubt after a crash), which a resume reads: few, whatever the
-- journal's length, and a `pure` call's row never enters this index. The store-wide
-- in-doubt listing and `purge` read it too, so the index of every row's status goes.
CREATE INDEX durable_tool_calls_issued ON durable_tool_calls (session_id, seq)
    WHERE status = 'issued';
DROP INDEX durable_tool_calls_status;
