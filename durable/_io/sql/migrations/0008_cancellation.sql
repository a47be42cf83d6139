-- durable schema, version 8: workflow timeouts and cooperative cancellation.
--
-- Cancelling asks; the workflow stops itself. A running workflow gets cancel_requested_at
-- and its runner sees it at its next step or wait, runs its compensations and finishes as
-- CANCELLED. A workflow that is not running but has started is made runnable so that a
-- worker does the same; one that never started is CANCELLED at once. The request spreads
-- to every descendant (parent_id) in the same statement. A timeout is the same request,
-- made by the run itself once deadline_at (set at its first start) has passed.

ALTER TABLE {schema}.workflows
    ADD COLUMN timeout_seconds      float8 CHECK (timeout_seconds > 0),
    ADD COLUMN deadline_at          timestamptz,
    ADD COLUMN cancel_requested_at  timestamptz,
    ADD COLUMN cancel_reason        text;

-- Runners poll for requests against what they own; suspended workflows past their
-- deadline are woken to time out.
CREATE INDEX workflows_cancel_idx ON {schema}.workflows (owner)
    WHERE cancel_requested_at IS NOT NULL AND status = 'RUNNING';
CREATE INDEX workflows_deadline_idx ON {schema}.workflows (deadline_at)
    WHERE status = 'SUSPENDED' AND deadline_at IS NOT NULL;
