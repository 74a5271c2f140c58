-- durable schema, version 6: approvals (a person decides on a call before it runs).
--
-- A call that needs approval is journaled with status `requested` and its `approval`:
-- the JSON of `durable_core::store::Approval` (who asked, the model's reasoning, the
-- deadline, the tool's argument schema and, once taken, the decision with any edited
-- arguments). The row's seal covers it (only when present: rows without one keep their
-- seals). A column without a default: adding it rewrites nothing.
ALTER TABLE durable_tool_calls ADD COLUMN approval TEXT;

-- The approvals inbox reads the requested rows only.
CREATE INDEX durable_tool_calls_requested ON durable_tool_calls (session_id, seq)
    WHERE status = 'requested';

-- The head's count of the session's approval log, sealed into the head when not 0 (so
-- heads of sessions without approvals keep their seals).
ALTER TABLE durable_sessions ADD COLUMN approvals INTEGER NOT NULL DEFAULT 0;

-- The approval log: every request and decision, and the issue of an approved call,
-- sealed at its position (1, 2, … per session) and counted by the head, as resolutions
-- are. Append-only, it says where each call stands: a decision or an issue checks the
-- row against its call's last event, so an older sealed version of the row put back
-- (to run an approved call again, or to approve a denied one) is refused.
CREATE TABLE durable_approvals (
    id          INTEGER PRIMARY KEY,
    call_id     TEXT    NOT NULL REFERENCES durable_tool_calls (id),
    session_id  TEXT    NOT NULL REFERENCES durable_sessions (id),
    position    INTEGER NOT NULL,
    event       TEXT    NOT NULL
                CHECK (event IN ('requested', 'approved', 'denied', 'expired', 'issued')),
    actor       TEXT    NOT NULL,
    note        TEXT,
    args_before TEXT,
    args_after  TEXT,
    format      INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    seal        TEXT,
    UNIQUE (session_id, position)
) STRICT;

-- The call's audit rows: found without scanning the log (a purge deletes a session's
-- journal rows, each checked against this table's foreign key).
CREATE INDEX durable_approvals_call ON durable_approvals (call_id);
