-- durable schema, version 1.
--
-- The model: a workflow is one row in `workflows`; every call a workflow makes to a step is
-- one row in `steps`, keyed by (workflow_id, step_seq), the call's deterministic position.
-- A run owns a workflow through (owner, epoch, lease_expires_at): each claim bumps epoch,
-- and every journal write carries the epoch it was claimed with, so a stale runner writes
-- nothing. Time is read through {schema}.current_time() so tests can fake it.
--
-- Per-workflow tables lead every key with workflow_id (ready for distribution by it);
-- there are no sequences and no triggers.

-- Every call in the body is STABLE, so PostgreSQL inlines it (a volatile clock_timestamp()
-- here would make every statement that uses it set up a function call: ~30 us each).
-- Statements run in autocommit, so statement_timestamp() is the time of the write.
CREATE FUNCTION {schema}.current_time() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        nullif(current_setting('durable.fake_now', true), '')::timestamptz,
        statement_timestamp()
    )
$$;

CREATE TABLE {schema}.executors (
    executor_id    text PRIMARY KEY,
    hostname       text NOT NULL,
    pid            integer NOT NULL,
    started_at     timestamptz NOT NULL,
    heartbeat_at   timestamptz NOT NULL,
    -- The workflow names (and versions) this executor can run, for operators.
    capabilities   jsonb NOT NULL DEFAULT '[]'::jsonb
);

CREATE TABLE {schema}.workflows (
    workflow_id        text PRIMARY KEY,
    -- Registered name and optional version of the function; a worker runs only what it has.
    name               text NOT NULL,
    version            text,
    status             text NOT NULL CHECK (status IN (
        'ENQUEUED',            -- waiting in a queue for a slot
        'PENDING',             -- runnable, nobody owns it (new, released, or resumed)
        'RUNNING',             -- owned by `owner` until lease_expires_at
        'SUSPENDED',           -- waiting (sleep, message, approval) without a process
        'SUCCESS',             -- finished; output holds the result
        'ERROR',               -- finished with an error; error holds it
        'CANCELLED',           -- cancelled; never recovered
        'COMPENSATING',        -- running compensations after a failure or cancel
        'COMPENSATED',         -- every compensation ran
        'COMPENSATION_FAILED', -- a compensation failed; error names it
        'MAX_RECOVERY_ATTEMPTS_EXCEEDED' -- crashed its worker too often; resume to retry
    )),
    inputs             text NOT NULL,
    output             text,
    error              text,
    serializer         text NOT NULL DEFAULT 'json',
    durability         text NOT NULL DEFAULT 'sync' CHECK (durability IN ('sync', 'async', 'exit')),
    parent_id          text REFERENCES {schema}.workflows (workflow_id) ON DELETE SET NULL,
    parent_step_seq    integer,
    owner              text,
    epoch              bigint NOT NULL DEFAULT 0,
    lease_expires_at   timestamptz,
    recovery_attempts  integer NOT NULL DEFAULT 0,
    created_at         timestamptz NOT NULL DEFAULT {schema}.current_time(),
    updated_at         timestamptz NOT NULL DEFAULT {schema}.current_time(),
    finished_at        timestamptz,
    CHECK ((status = 'RUNNING') = (owner IS NOT NULL))
);

-- Claims walk runnable work oldest first (PENDING, or RUNNING with an expired lease);
-- finished rows are not in this index, so it stays as small as the live work.
CREATE INDEX workflows_runnable_idx ON {schema}.workflows (created_at)
    WHERE status IN ('PENDING', 'RUNNING');
CREATE INDEX workflows_status_created_idx ON {schema}.workflows (status, created_at);
CREATE INDEX workflows_parent_idx ON {schema}.workflows (parent_id) WHERE parent_id IS NOT NULL;

CREATE TABLE {schema}.steps (
    workflow_id        text NOT NULL REFERENCES {schema}.workflows (workflow_id) ON DELETE CASCADE,
    step_seq           integer NOT NULL CHECK (step_seq >= 0),
    step_name          text NOT NULL,
    kind               text NOT NULL CHECK (kind IN (
        'step',          -- a plain @step
        'transaction',   -- a @transaction step, committed with the app's writes
        'child',         -- a child workflow started or called by this one
        'effect',        -- an @effect (see the effect ledger)
        'sleep',         -- a durable sleep's wake-up time
        'recv',          -- a consumed message
        'send',          -- a sent message
        'event',         -- a published event
        'approval',      -- a human decision
        'tool',          -- an agent tool call
        'state'          -- an update of the working state
    )),
    output             text,
    error              text,
    attempts           integer NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    child_workflow_id  text,
    started_at         timestamptz,
    finished_at        timestamptz NOT NULL DEFAULT {schema}.current_time(),
    PRIMARY KEY (workflow_id, step_seq),
    CHECK (output IS NULL OR error IS NULL)
);
