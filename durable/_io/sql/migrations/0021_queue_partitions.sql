-- Queue partitions: an entry enqueued with partition_key="user-1" on a queue declared with
-- partition_concurrency=N runs only while fewer than N entries of its partition hold a slot
-- (dequeued and unfinished), besides the queue's own limits. NULL: no partition, only the
-- queue's limits (every entry before this column).
-- The index serves the dequeue's count of the slots each partition holds: it covers only
-- entries holding one, a small set however long the queue's history.
-- In a DO block: on a Citus-distributed schema each command is propagated to the shards on
-- its own, and Citus takes no two commands in one query string.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {schema}.workflows ADD COLUMN partition_key text';
    EXECUTE 'CREATE INDEX workflows_partition_held_idx ON {schema}.workflows '
        '(queue_name, partition_key) WHERE partition_key IS NOT NULL '
        'AND status IN (''PENDING'', ''RUNNING'', ''SUSPENDED'')';
END
$$;
