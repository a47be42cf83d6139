-- Attributes: key/value pairs on a workflow run (a customer, an amount, a region), set when
-- it is recorded (attributes= on a start) and from its code (durable.set_attributes, a
-- journaled call), read back by filters (list, count, bulk actions).
-- A column of the workflows row, not a table of its own: a filter reads one row per run
-- (a side table would need a join, or one EXISTS per attribute named), the row is on the
-- run's own shard on Citus (no new table to distribute or colocate), and an export, a
-- fork and retention carry or drop it with the row. The GIN index (jsonb_path_ops) answers
-- equality (`attributes @> <an object of the pairs asked>`); ranges on numbers and times are
-- checked on the rows the other filters leave.
-- In a DO block: on a Citus-distributed schema each command is propagated to the shards on
-- its own, and Citus takes no two commands in one query string.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {schema}.workflows ADD COLUMN attributes jsonb NOT NULL DEFAULT jsonb_build_object()';
    EXECUTE 'CREATE INDEX workflows_attributes_idx ON {schema}.workflows '
        'USING gin (attributes jsonb_path_ops)';
END
$$;
