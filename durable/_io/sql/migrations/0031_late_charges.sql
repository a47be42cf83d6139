-- late_charges: what an attempt that no longer counted spent (a def step's attempt given up
--   by its timeout or heartbeat_timeout, whose call returned and charged after the step
--   moved on or recorded). Not the step's record: written on its own, unfenced (the money
--   was spent, whoever owns the workflow now), adding to its budget's spent_* once per
--   charge_key (the run's epoch, the step's position and the charge's number in it), so a
--   write sent again after its answer was lost adds nothing more.
CREATE TABLE {schema}.late_charges (
    workflow_id  text NOT NULL REFERENCES {schema}.workflows (workflow_id) ON DELETE CASCADE,
    charge_key   text NOT NULL,
    step_seq     integer NOT NULL,
    budget_id    text,
    dollars      numeric NOT NULL DEFAULT 0,
    tokens       bigint NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT {schema}.current_time(),
    PRIMARY KEY (workflow_id, charge_key)
);
