-- Ready for distributed PostgreSQL (Citus and the like shard tables by one column; see
-- docs/scaling.md): every key of a per-workflow table is led by the workflow's id, and no
-- row points at another workflow's row.
--
-- A child names its parent in parent_id, but no longer through a foreign key: the two rows
-- may live on different shards. A pruned parent leaves its children's parent_id naming a
-- workflow that is gone, as a dangling id rather than NULL; nothing reads it as a row.
ALTER TABLE {schema}.workflows DROP CONSTRAINT workflows_parent_id_fkey;

-- A queue's dedup keys move from a partial unique index on workflows (led by queue_name,
-- so unique across shards only on one server) into a table of their own, keyed by queue
-- and key. A row names the workflow holding the key; it is released lazily: the next
-- enqueue with the key takes it over once that workflow is no longer queued or unfinished.
CREATE TABLE {schema}.queue_dedup (
    queue_name   text NOT NULL,
    dedup_key    text NOT NULL,
    workflow_id  text NOT NULL,
    PRIMARY KEY (queue_name, dedup_key)
);
INSERT INTO {schema}.queue_dedup (queue_name, dedup_key, workflow_id)
SELECT queue_name, dedup_key, workflow_id FROM {schema}.workflows
WHERE dedup_key IS NOT NULL AND status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED');
DROP INDEX {schema}.workflows_dedup_idx;
