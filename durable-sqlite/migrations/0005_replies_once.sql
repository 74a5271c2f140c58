-- durable schema, version 5: a model reply is stored once.
--
-- An agent pushes the model's reply onto the transcript right after the journal recorded
-- it as the result of a `model` row, so the same text would be stored twice. A message
-- whose text equals the result of a `model` row of the step its checkpoint ends is stored
-- as `message = ''` (never a JSON text) with `call_seq`, that row's position in the
-- session's journal. Its seal covers the text, as for any message, so the row it refers
-- to cannot change without the message failing its seal.
ALTER TABLE durable_messages ADD COLUMN call_seq INTEGER;

-- The transcript as written: each message's text, referenced ones read from the journal.
-- Every reader of message text reads this view.
CREATE VIEW durable_transcript AS
SELECT m.session_num, m.seq, m.format, m.seal, m.created_at,
       CASE WHEN m.call_seq IS NULL THEN m.message
            ELSE COALESCE((SELECT r.result FROM durable_sessions s
                           JOIN durable_tool_calls r ON r.session_id = s.id AND r.seq = m.call_seq
                           WHERE s.num = m.session_num), '')
       END AS message
FROM durable_messages m;
