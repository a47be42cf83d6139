-- The effect calls a fork copied from the workflow it was forked from (steps.applied_in):
-- retention keeps the ledger rows a live fork shares (prune_effects), and finds them
-- through this index instead of reading every journal row.
CREATE INDEX steps_applied_in_idx ON {schema}.steps (applied_in, step_seq)
    WHERE applied_in IS NOT NULL;
