-- The workflows not finished, plus the dead-lettered ones (few: each waits for an operator):
-- a Prometheus scrape (metrics_workflows) counts these through this index, so its cost
-- follows the live work and not the history kept. Finished outcomes are counted by the
-- workers that write them (durable_workflows_finished_total).
CREATE INDEX workflows_unfinished_idx ON {schema}.workflows (status, name)
    WHERE status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED', 'COMPENSATING',
        'MAX_RECOVERY_ATTEMPTS_EXCEEDED');
