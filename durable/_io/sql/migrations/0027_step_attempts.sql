-- The attempt of a long step under way: which run (epoch) and attempt holds the step's
-- position, when it last heartbeat, with what details (the serializer's text), and its
-- heartbeat_timeout while it is watched (NULL once the attempt ended, or for a step that
-- heartbeats without one). A live worker's sweep expires the lease of a workflow whose
-- watched attempt stopped heartbeating (a frozen or cut-off process), so it is claimed with
-- its epoch bumped and the old owner's heartbeats and record are refused. The next attempt
-- reads the last details (durable.last_heartbeat()).
CREATE TABLE {schema}.step_attempts (
    workflow_id        text NOT NULL REFERENCES {schema}.workflows (workflow_id) ON DELETE CASCADE,
    step_seq           integer NOT NULL,
    epoch              bigint NOT NULL,
    attempt            integer NOT NULL,
    heartbeat_timeout  double precision CHECK (heartbeat_timeout > 0),
    heartbeat_at       timestamptz NOT NULL,
    details            text,
    PRIMARY KEY (workflow_id, step_seq)
);

CREATE INDEX step_attempts_watched ON {schema}.step_attempts (heartbeat_at)
    WHERE heartbeat_timeout IS NOT NULL;
