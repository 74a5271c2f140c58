-- durable schema, version 8: approvals, a person decides on a call before it runs
-- (SQLite's schema 6).
--
-- A call that needs approval is journaled with status `requested` and its `approval`:
-- the JSON text of `durable_core::store::Approval` (who asked, the model's reasoning, the
-- deadline, the tool's argument schema and, once taken, the decision with any edited
-- arguments). The row's seal covers it, and only when present, so rows without one keep
-- the seals they were written with. A column without a default: adding it rewrites
-- nothing.
ALTER TABLE durable_tool_calls ADD COLUMN approval TEXT;

-- The requested rows alone: the approvals inbox reads this index, so its cost follows
-- the calls awaiting a decision, not the journals.
CREATE INDEX durable_tool_calls_requested ON durable_tool_calls (session_id, seq)
    WHERE status = 'requested';

-- The head's count of the session's approval log, sealed into the head when not 0, so
-- heads of sessions without approvals keep their seals. A constant default: PostgreSQL
-- stores it once in the catalog and rewrites no row.
ALTER TABLE durable_sessions ADD COLUMN approvals BIGINT NOT NULL DEFAULT 0;

-- The approval log: every request and decision, and the issue of an approved call,
-- sealed at its position (1, 2, … per session) and counted by the head, as resolutions
-- are. Append-only, it says where each call stands: a decision or an issue checks the row
-- against its call's last event, so an older sealed version of the row put back (to run
-- an approved call again, or to approve a denied one) is refused. `id` only orders rows; the
-- unique index of `(session_id, position)` reads a session's log in order.
CREATE TABLE durable_approvals (
    id          BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    call_id     TEXT    NOT NULL REFERENCES durable_tool_calls (id),
    session_id  TEXT    NOT NULL REFERENCES durable_sessions (id),
    position    BIGINT  NOT NULL,
    event       TEXT    NOT NULL
                CHECK (event IN ('requested', 'approved', 'denied', 'expired', 'issued')),
    actor       TEXT    NOT NULL,
    note        TEXT,
    args_before TEXT,
    args_after  TEXT,
    format      INTEGER NOT NULL,
    created_at  BIGINT  NOT NULL,
    seal        TEXT,
    UNIQUE (session_id, position)
);

-- Purging a session deletes its journal rows, and PostgreSQL checks each deleted row
-- against the foreign key of `call_id`: without this index every check would scan the
-- whole log, of every session.
CREATE INDEX durable_approvals_call ON durable_approvals (call_id);
