-- durable schema, version 8: whether the current lease's holder has started running the
-- session (its first model or tool call under the lease, `mark_running`).
--
-- Only the take-over of a lease so marked counts a recovery toward parking the session
-- (`recovery_attempts`): a worker killed while it held the session without running it
-- (an idle lease) is not counted against the session. Scheduling state, outside the
-- head's seal like the other lease columns. A constant default: adding it rewrites
-- nothing; a lease held across the upgrade counts as not running.
ALTER TABLE durable_sessions ADD COLUMN lease_ran INTEGER NOT NULL DEFAULT 0;
