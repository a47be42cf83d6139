-- durable schema, version 5: events a workflow publishes for the outside world to read.
-- The latest value per (workflow, key); each update is journaled with the step that made it.

CREATE TABLE {schema}.events (
    workflow_id  text NOT NULL REFERENCES {schema}.workflows (workflow_id) ON DELETE CASCADE,
    key          text NOT NULL,
    value        text NOT NULL,
    step_seq     integer NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT {schema}.current_time(),
    PRIMARY KEY (workflow_id, key)
);
