-- durable schema, version 5: unchanged snapshots are stored as references.
--
-- A checkpoint's plan, budget or state equal (byte for byte) to the previous version's is
-- stored as `@k`: the same text as version k of the session, the version that holds it
-- (JSON text never starts with `@`; a reference never names another reference). A session
-- whose plan, budget and state rarely change then grows by a few bytes per checkpoint,
-- not by their size. Seals cover the text, references resolved. Readers of schema 4 and
-- earlier would take a reference for corrupt JSON, hence a schema version of its own.
COMMENT ON COLUMN durable_checkpoints.plan IS
    'JSON text, or @k: the same text as version k of the session';
COMMENT ON COLUMN durable_checkpoints.budget IS
    'JSON text, or @k: the same text as version k of the session';
COMMENT ON COLUMN durable_checkpoints.state IS
    'JSON text, or @k: the same text as version k of the session';
