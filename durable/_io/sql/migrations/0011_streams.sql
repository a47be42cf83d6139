-- Durable streams: values a workflow writes under a key, in order, for readers that follow
-- them live. A value is written with its journal row in one statement (a replay writes
-- nothing again); the stream's last row (closed) ends it.
CREATE TABLE {schema}.streams (
    workflow_id  text NOT NULL REFERENCES {schema}.workflows (workflow_id) ON DELETE CASCADE,
    key          text NOT NULL,
    "offset"     integer NOT NULL CHECK ("offset" >= 0),
    value        text,
    closed       boolean NOT NULL DEFAULT false,
    step_seq     integer NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT {schema}.current_time(),
    PRIMARY KEY (workflow_id, key, "offset")
);

ALTER TABLE {schema}.steps DROP CONSTRAINT steps_kind_check;
ALTER TABLE {schema}.steps ADD CONSTRAINT steps_kind_check CHECK (kind IN (
    'step', 'transaction', 'child', 'effect', 'sleep', 'recv', 'send', 'event', 'approval',
    'tool', 'state', 'turn', 'stream'));
