-- durable schema, version 6: a model reply is stored once (SQLite's schema 5).
--
-- An agent pushes the model's reply onto the transcript right after the journal recorded
-- it as the result of a `model` row, so the same text would be stored twice. A message
-- whose text equals the result of a `model` row of the step its checkpoint ends (`step`
-- = the session's latest version when the checkpoint is written) is stored as
-- `message = ''` (never a JSON text) with `call_seq`, that row's position in the
-- session's journal; the checkpoint's own INSERT decides it. Its seal covers the text, as
-- for any message, so the row it refers to cannot change without the message failing its
-- seal. Readers of schema 5 and earlier would take the empty text for a changed message,
-- hence a schema version of its own. A column without a default: adding it rewrites
-- nothing.
ALTER TABLE durable_messages ADD COLUMN call_seq BIGINT;

-- The transcript as written: each message's text, referenced ones read from the journal
-- by position (the unique index of `(session_id, seq)`). Every reader of message text
-- reads this view.
CREATE VIEW durable_transcript AS
SELECT m.session_id, m.seq, m.format, m.seal, m.created_at,
       CASE WHEN m.call_seq IS NULL THEN m.message
            ELSE COALESCE((SELECT r.result FROM durable_tool_calls r
                           WHERE r.session_id = m.session_id AND r.seq = m.call_seq), '')
       END AS message
FROM durable_messages m;
