-- durable schema, version 4: durable sleep and messages.
--
-- A SUSPENDED workflow with wake_at set is woken (PENDING) by any worker once that time
-- passes: a sleep, or the timeout of a message wait. Messages are rows consumed in the same
-- statement that journals the consuming step, so each is consumed exactly once.

ALTER TABLE {schema}.workflows ADD COLUMN wake_at timestamptz;
CREATE INDEX workflows_wake_idx ON {schema}.workflows (wake_at) WHERE status = 'SUSPENDED';

CREATE TABLE {schema}.messages (
    workflow_id    text NOT NULL REFERENCES {schema}.workflows (workflow_id) ON DELETE CASCADE,
    -- The sender's idempotency key (or a UUID): sending twice with one key delivers once.
    message_id     text NOT NULL,
    topic          text NOT NULL DEFAULT '',
    payload        text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT {schema}.current_time(),
    consumed_at    timestamptz,
    consumed_seq   integer,
    PRIMARY KEY (workflow_id, message_id)
);
CREATE INDEX messages_unconsumed_idx ON {schema}.messages (workflow_id, topic, created_at)
    WHERE consumed_at IS NULL;
