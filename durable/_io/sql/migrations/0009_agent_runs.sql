-- durable schema, version 9: what a long agent run must keep besides its journal.
--
-- budgets: one ledger per budgeted workflow tree (budget_id is the root workflow's id;
--   children draw from it). Limits are copied from code at the first start and can be
--   raised by an operator; spent_* only grow, in the statement that journals the step.
-- charges: one row per step that spent, written with that step's journal row, so a crash
--   cannot lose a charge and a replayed step (journaled) cannot charge again.
-- tool_calls: an agent's tool calls with arguments, result, latency and cost.
-- Conversation turns are journal rows of kind 'turn' (one row per turn, appended).
-- The effect ledger no longer references workflows: it is an audit trail with its own
-- retention window, and outlives the journals it came from.

ALTER TABLE {schema}.workflows ADD COLUMN budget_id text;

CREATE TABLE {schema}.budgets (
    budget_id       text PRIMARY KEY REFERENCES {schema}.workflows (workflow_id) ON DELETE CASCADE,
    limit_dollars   numeric CHECK (limit_dollars >= 0),
    limit_tokens    bigint CHECK (limit_tokens >= 0),
    limit_steps     integer CHECK (limit_steps >= 0),
    spent_dollars   numeric NOT NULL DEFAULT 0,
    spent_tokens    bigint NOT NULL DEFAULT 0,
    spent_steps     integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT {schema}.current_time(),
    updated_at      timestamptz NOT NULL DEFAULT {schema}.current_time()
);

CREATE TABLE {schema}.charges (
    workflow_id  text NOT NULL,
    step_seq     integer NOT NULL,
    budget_id    text,
    dollars      numeric NOT NULL DEFAULT 0,
    tokens       bigint NOT NULL DEFAULT 0,
    steps        integer NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT {schema}.current_time(),
    PRIMARY KEY (workflow_id, step_seq),
    FOREIGN KEY (workflow_id, step_seq) REFERENCES {schema}.steps (workflow_id, step_seq)
        ON DELETE CASCADE
);
CREATE INDEX charges_budget_idx ON {schema}.charges (budget_id) WHERE budget_id IS NOT NULL;

CREATE TABLE {schema}.tool_calls (
    workflow_id  text NOT NULL,
    step_seq     integer NOT NULL,
    tool_name    text NOT NULL,
    arguments    text NOT NULL,
    latency_ms   double precision NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT {schema}.current_time(),
    PRIMARY KEY (workflow_id, step_seq),
    FOREIGN KEY (workflow_id, step_seq) REFERENCES {schema}.steps (workflow_id, step_seq)
        ON DELETE CASCADE
);

ALTER TABLE {schema}.steps DROP CONSTRAINT steps_kind_check;
ALTER TABLE {schema}.steps ADD CONSTRAINT steps_kind_check CHECK (kind IN (
    'step', 'transaction', 'child', 'effect', 'sleep', 'recv', 'send', 'event', 'approval',
    'tool', 'state', 'turn'));

ALTER TABLE {schema}.effects DROP CONSTRAINT effects_workflow_id_fkey;

-- Retention walks finished workflows oldest first and old effects.
CREATE INDEX workflows_finished_idx ON {schema}.workflows (finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX effects_updated_idx ON {schema}.effects (updated_at);
