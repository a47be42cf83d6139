-- Each applied effect is undone at most once, across a workflow and its forks. A fork's
-- journal names, on each effect call it copied, the workflow whose ledger row records that
-- call (steps.applied_in; NULL on a workflow's own calls): the fork and its original share
-- the effect, and its undo. A compensation claims the undo on that ledger row before it
-- runs (effects.undone_by: the workflow whose compensation undoes it, set once); another
-- workflow that finds the claim taken does not undo the effect again.
-- In a DO block: Citus takes no two commands in one query string.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {schema}.steps ADD COLUMN applied_in text';
    EXECUTE 'ALTER TABLE {schema}.effects ADD COLUMN undone_by text';
END
$$;
