-- durable schema, version 7: queues.
--
-- A queued workflow is a workflows row in status ENQUEUED with its queue's name. Workers
-- dequeue entries in one statement that counts, under a per-queue advisory lock, what the
-- queue's limits still allow (running entries across all workers, this worker's entries,
-- and dequeues within the rate-limit period) and takes that many with FOR UPDATE SKIP
-- LOCKED. A dequeued entry keeps its queue name, so it holds its slot until it finishes.

ALTER TABLE {schema}.workflows
    ADD COLUMN queue_name    text,
    -- Lower runs first (in queues declared with priority=True).
    ADD COLUMN priority      integer NOT NULL DEFAULT 0,
    -- At most one queued or unfinished entry per (queue, dedup key).
    ADD COLUMN dedup_key     text,
    -- Not dequeued before this time (enqueue(..., delay=...)).
    ADD COLUMN available_at  timestamptz,
    -- When a worker took it off the queue; the rate limit counts these.
    ADD COLUMN dequeued_at   timestamptz;

CREATE UNIQUE INDEX workflows_dedup_idx ON {schema}.workflows (queue_name, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED');
CREATE INDEX workflows_enqueued_idx ON {schema}.workflows (queue_name, priority, created_at)
    WHERE status = 'ENQUEUED';
CREATE INDEX workflows_dequeued_idx ON {schema}.workflows (queue_name, dequeued_at)
    WHERE dequeued_at IS NOT NULL;
