-- Claims on a Citus cluster without reading every shard: what is runnable in ONE shard of
-- `workflows`, read on the node that holds it.
--
-- `shard_key` names the shard: the shard of `workflows` where that workflow id would live.
-- On a distributed schema these functions are distributed by `shard_key`, colocated with
-- `workflows` (durable/_io/citus.py's DELEGATED), so a call from the coordinator (or any
-- node) is sent whole to the node that holds that shard and reads its table there, as a
-- local table: one shard per call, whatever the shard count. They only read: the claims
-- are then taken by their ids (claim_batch_cas, dequeue_cas, wake_due), statements routed
-- to that one shard, compare-and-set as before. On one server they are created and unused.
--
-- `at_time`: the caller's fake clock (tests), or NULL: the time on the node that reads (the
-- nodes' clocks are kept in step; see docs/scaling.md, "Time on a cluster").

CREATE FUNCTION {schema}.runnable_on_shard(shard_key text, at_time timestamptz, names text[],
    versions text[], journal_version int, queues text[], lim int)
RETURNS TABLE (workflow_id text, due boolean)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    shard text := shard_name('{schema}.workflows'::regclass,
        get_shard_id_for_distribution_column('{schema}.workflows', shard_key));
BEGIN
    -- Sleepers whose time has come (to wake, then claim), and runnable workflows this
    -- worker has the code of (new, released, or with an expired lease), oldest first.
    RETURN QUERY EXECUTE format($q$
        (SELECT workflow_id, true FROM %1$s
         WHERE status = 'SUSPENDED' AND (wake_at <= $1 OR deadline_at <= $1)
         LIMIT $6)
        UNION ALL
        (SELECT workflow_id, false FROM %1$s
         WHERE (status = 'PENDING' OR (status = 'RUNNING' AND lease_expires_at < $1))
           AND ($5::text[] IS NULL OR queue_name IS NULL OR queue_name = ANY($5::text[]))
           AND (name, coalesce(version, '')) IN (SELECT n, v FROM unnest($2, $3) AS t (n, v))
           AND journal_version <= $4
         ORDER BY created_at
         LIMIT $6)
    $q$, shard) USING coalesce(at_time, statement_timestamp()), names, versions,
        journal_version, queues, lim;
END
$fn$;

CREATE FUNCTION {schema}.enqueued_on_shard(shard_key text, at_time timestamptz, queue text,
    names text[], versions text[], journal_version int, by_priority boolean, lim int)
RETURNS TABLE (workflow_id text)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    shard text := shard_name('{schema}.workflows'::regclass,
        get_shard_id_for_distribution_column('{schema}.workflows', shard_key));
BEGIN
    -- A queue's entries that are ready, in the queue's order (within this shard).
    RETURN QUERY EXECUTE format($q$
        SELECT workflow_id FROM %1$s
        WHERE status = 'ENQUEUED' AND queue_name = $2
          AND (available_at IS NULL OR available_at <= $1)
          AND (name, coalesce(version, '')) IN (SELECT n, v FROM unnest($3, $4) AS t (n, v))
          AND journal_version <= $5
        ORDER BY CASE WHEN $6 THEN priority ELSE 0 END, created_at, workflow_id
        LIMIT $7
    $q$, shard) USING coalesce(at_time, statement_timestamp()), queue, names, versions,
        journal_version, by_priority, lim;
END
$fn$;

-- A queue's lock on Citus: a row per queue, locked by the dequeues of a queue with limits
-- (lock_queue_row), so that they count and take one after the other. An advisory lock is
-- the node's own, and workers may connect to different nodes (docs/scaling.md); the row
-- is on one shard (distributed by queue name), the same whichever node is asked.
CREATE TABLE {schema}.queue_locks (
    queue_name text PRIMARY KEY
);

-- On a schema distributed already (a deployment on Citus migrating to this version), the
-- table and functions are distributed here; on a fresh one, `durable migrate --citus`.
DO $$
DECLARE
    distributed boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition'
            ' WHERE logicalrelid = to_regclass($1))'
            INTO distributed USING '{schema}.workflows';
    END IF;
    IF distributed THEN
        PERFORM create_distributed_table('{schema}.queue_locks', 'queue_name',
            colocate_with => 'none');
        PERFORM create_distributed_function(
            '{schema}.runnable_on_shard(text, timestamptz, text[], text[], int, text[], int)',
            'shard_key', colocate_with => '{schema}.workflows');
        PERFORM create_distributed_function(
            '{schema}.enqueued_on_shard(text, timestamptz, text, text[], text[], int, boolean, int)',
            'shard_key', colocate_with => '{schema}.workflows');
    END IF;
END
$$;
