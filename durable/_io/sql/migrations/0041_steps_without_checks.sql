-- The journal's CHECK constraints go: PostgreSQL builds every CHECK expression of a table
-- anew for each statement that writes it (the list of 14 kinds most of all), and the four
-- of steps made a step's record cost the server about 20 microseconds of CPU more than the INSERT
-- alone (benchmarks/server_cpu.py). None guarded against anything a statement of durable
-- can get wrong: the kind is a StepKind's value or a literal of queries.sql, the position
-- is the journal's count of calls, attempts count from 1, and a record has an output or
-- an error, never both. Rows that come from elsewhere (an import) are checked as they are
-- read (durable/_client/transfer.py). Dropping a constraint rewrites nothing.
-- In a DO block: on a Citus-distributed schema each command is propagated to the shards on
-- its own, and Citus takes no two commands in one query string.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {schema}.steps DROP CONSTRAINT IF EXISTS steps_kind_check';
    EXECUTE 'ALTER TABLE {schema}.steps DROP CONSTRAINT IF EXISTS steps_step_seq_check';
    EXECUTE 'ALTER TABLE {schema}.steps DROP CONSTRAINT IF EXISTS steps_attempts_check';
    EXECUTE 'ALTER TABLE {schema}.steps DROP CONSTRAINT IF EXISTS steps_check';
END
$$;
