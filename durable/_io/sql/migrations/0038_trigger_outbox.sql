-- trigger_outbox: messages an application writes in its own transactions (with the data they are
--   about), each drained by a trigger (durable.triggers.PostgresOutbox) into one workflow:
--   the workflow's row is committed first, then the message's row is deleted. Keyed by
--   (topic, message_id): the message id is its run's key, and a message written twice is
--   refused by the key. Sharded by topic on Citus: a consumer reads one topic.
--   visible_at: a message is taken only once it has passed; a consumer that takes one moves
--     it past its lease, so a consumer that died leaves it to the next after the lease.
--   deliveries: how often it was taken.
--   rejected: why it can never start a workflow (not JSON-shaped as the trigger wants, no
--     key, its id held by another workflow); NULL while it waits. Rejected rows are kept,
--     out of the consumers' way, for an operator to read and delete.
CREATE TABLE {schema}.trigger_outbox (
    topic       text NOT NULL,
    message_id  text NOT NULL,
    body        jsonb NOT NULL,
    headers     jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT {schema}.current_time(),
    visible_at  timestamptz NOT NULL DEFAULT {schema}.current_time(),
    deliveries  integer NOT NULL DEFAULT 0,
    rejected    text,
    PRIMARY KEY (topic, message_id)
);

CREATE INDEX trigger_outbox_waiting ON {schema}.trigger_outbox (topic, visible_at) WHERE rejected IS NULL;
