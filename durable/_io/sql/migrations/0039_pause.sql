-- Pause and unpause: an operator holds a workflow where it is, and lets it go on later.
--
-- PAUSED: held by an operator; no worker claims, wakes or dequeues it until it is unpaused
-- (then PENDING, or ENQUEUED when it never left its queue), and it holds no slot meanwhile.
-- paused_at: when the pause was asked. On a RUNNING workflow it is the request its runner
-- sees at its next step boundary (as a cancel's); the run then gives the workflow back as
-- PAUSED. Cleared by an unpause, a cancel and a resume.
--
-- In a DO block: on a Citus-distributed schema each command is propagated to the shards on
-- its own, and Citus takes neither two commands in one query string nor an ADD CONSTRAINT
-- beside another subcommand.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {schema}.workflows ADD COLUMN paused_at timestamptz';
    EXECUTE 'ALTER TABLE {schema}.workflows DROP CONSTRAINT workflows_status_check';
    EXECUTE 'ALTER TABLE {schema}.workflows ADD CONSTRAINT workflows_status_check CHECK ('
        'status IN (''ENQUEUED'', ''PENDING'', ''RUNNING'', ''SUSPENDED'', ''PAUSED'', '
        '''SUCCESS'', ''ERROR'', ''CANCELLED'', ''COMPENSATING'', ''COMPENSATED'', '
        '''COMPENSATION_FAILED'', ''MAX_RECOVERY_ATTEMPTS_EXCEEDED''))';
END
$$;
