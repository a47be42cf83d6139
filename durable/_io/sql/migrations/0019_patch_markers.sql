-- durable.patched(): the marker a run journals where it first reaches a patch point on
-- code that has the patch (a replay that finds it takes the patch's new branch).
-- In a DO block: on a Citus-distributed schema each command is propagated to the shards on
-- its own, and Citus takes neither two commands in one query string nor an ADD CONSTRAINT
-- beside another subcommand.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {schema}.steps DROP CONSTRAINT steps_kind_check';
    EXECUTE 'ALTER TABLE {schema}.steps ADD CONSTRAINT steps_kind_check CHECK (kind IN ('
        '''step'', ''transaction'', ''child'', ''effect'', ''sleep'', ''recv'', ''send'', '
        '''event'', ''approval'', ''tool'', ''state'', ''turn'', ''stream'', ''patch''))';
END
$$;
