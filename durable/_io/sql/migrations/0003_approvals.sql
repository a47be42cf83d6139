-- durable schema, version 3: human approval gates.
--
-- A gate is one row per (workflow, name). While it waits, its workflow is SUSPENDED: it
-- holds no worker slot, thread or lease. The first decision wins; deciding wakes the
-- workflow (PENDING), any worker resumes it, and the decision is journaled as a step so a
-- replay never asks again. A gate may time out, which decides by its default.

CREATE TABLE {schema}.approvals (
    workflow_id       text NOT NULL REFERENCES {schema}.workflows (workflow_id) ON DELETE CASCADE,
    name              text NOT NULL,
    step_seq          integer NOT NULL,
    status            text NOT NULL CHECK (status IN (
        'waiting',    -- asked; nobody has decided
        'approved',   -- a person approved
        'denied',     -- a person denied
        'timed_out'   -- nobody decided in time; default_approved decides
    )),
    payload           text,
    default_approved  boolean NOT NULL DEFAULT false,
    comment           text,
    decided_by        text,
    requested_at      timestamptz NOT NULL DEFAULT {schema}.current_time(),
    expires_at        timestamptz,
    decided_at        timestamptz,
    PRIMARY KEY (workflow_id, name)
);

CREATE INDEX approvals_waiting_idx ON {schema}.approvals (expires_at) WHERE status = 'waiting';
