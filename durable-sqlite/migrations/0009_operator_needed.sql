-- durable schema, version 9: an in-doubt journal row only an operator can settle.
--
-- Set (database clock, ms) when a resume refused the `issued` row as replay-unsafe: its
-- verify hook could not tell whether the effect happened, or it has none, or it cannot
-- run again. A claim leaves out a session with such a row until the row leaves `issued`
-- (an operator's resolution) or is issued again (which clears it), so a worker pool does
-- not hand the session out in a loop. Scheduling state, outside the row's seal: erasing
-- it only lets one more claim take the session, to be refused again. NULL on every row
-- written before this version: nothing to rewrite.
ALTER TABLE durable_tool_calls ADD COLUMN operator_needed_at INTEGER;
