-- Every statement durable runs. Each starts with `-- <name> --` and a one-line purpose.
-- {schema} is replaced by the quoted schema name once, when the engine starts; every value
-- is a bind parameter.
--
-- On a schema distributed by Citus, a statement goes to one shard only when every table it
-- reads or writes is filtered by its distribution column (the workflow id) given as a value:
-- a run's statements name the id again where a join would imply it.
--
-- The fence of a run's writes is written `workflow_id = ? AND (epoch, status) IS NOT
-- DISTINCT FROM (?, 'RUNNING')`, not `epoch = ? AND status = 'RUNNING'`: the same test
-- (neither column is ever NULL), but one no index on status can answer, so the primary
-- key is the only way to the row. With equalities, statistics gathered while few
-- workflows ran make the planner walk an index of every running workflow instead (a step
-- took 5 ms among 20,000 running workflows, against 0.1 ms by the key).

-- insert_workflow --
-- Create a workflow already owned by this run (epoch 1); nothing is returned if the id exists.
INSERT INTO {schema}.workflows (workflow_id, name, version, status, inputs, serializer,
    durability, parent_id, parent_step_seq, owner, epoch, lease_expires_at, timeout_seconds,
    deadline_at, budget_id, trace_context, journal_version, max_recovery_attempts,
    attributes)
VALUES (%(workflow_id)s, %(name)s, %(version)s, 'RUNNING', %(inputs)s, %(serializer)s,
    %(durability)s, %(parent_id)s, %(parent_step_seq)s, %(owner)s, 1,
    {schema}.current_time() + make_interval(secs => %(lease_seconds)s), %(timeout_seconds)s,
    {schema}.current_time() + make_interval(secs => %(timeout_seconds)s::float8),
    %(budget_id)s, %(trace_context)s, %(journal_version)s, %(max_recovery_attempts)s,
    %(attributes)s::jsonb)
ON CONFLICT (workflow_id) DO NOTHING
RETURNING epoch, deadline_at

-- insert_workflow_pending --
-- Create a runnable workflow that no one owns yet (a worker will claim it).
INSERT INTO {schema}.workflows (workflow_id, name, version, status, inputs, serializer,
    durability, parent_id, parent_step_seq, timeout_seconds, budget_id, trace_context,
    journal_version, max_recovery_attempts, attributes)
VALUES (%(workflow_id)s, %(name)s, %(version)s, 'PENDING', %(inputs)s, %(serializer)s,
    %(durability)s, %(parent_id)s, %(parent_step_seq)s, %(timeout_seconds)s, %(budget_id)s,
    %(trace_context)s, %(journal_version)s, %(max_recovery_attempts)s, %(attributes)s::jsonb)
ON CONFLICT (workflow_id) DO NOTHING
RETURNING epoch

-- get_workflow --
-- One workflow row.
SELECT workflow_id, name, version, status, inputs, output, error, serializer, durability,
    parent_id, parent_step_seq, owner, epoch, lease_expires_at, recovery_attempts,
    created_at, updated_at, finished_at, journal_version, attributes,
    (paused_at IS NOT NULL AND status IN ('RUNNING', 'PAUSED')) AS pause_requested
FROM {schema}.workflows WHERE workflow_id = %(workflow_id)s

-- get_incarnation --
-- Which life of its id a workflow is ('' for a row from before incarnations): read once
-- by a run that derives the id of a message it sends.
SELECT coalesce(incarnation, '') AS incarnation FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s

-- get_workflow_status --
-- The status, output and error of one workflow, for result polling.
SELECT status, output, error, serializer FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s

-- list_workflows --
-- Workflows, newest first, optionally filtered (status, name, id prefix, created range), one
-- page after the keyset (after_at, after_id). Each filter is folded away when its parameter
-- is NULL (plans are made for the values given), leaving a walk of one index (0012).
-- waiting_for_worker is waiting_for_worker's test, made for the rows of the page only.
-- What live executors have is read once (`live`, materialized: inlined, each row would
-- unfold every executor's capabilities again, 10 ms per 100 waiting rows with a generic
-- plan), and only when a row of the page waits at all (AND evaluates left to right).
WITH live AS MATERIALIZED (
    SELECT DISTINCT c ->> 0 AS name, coalesce(c ->> 1, '') AS version
    FROM {schema}.executors e, jsonb_array_elements(e.capabilities) AS c
    WHERE e.heartbeat_at > {schema}.current_time() - make_interval(secs => %(stale_seconds)s)
)
SELECT workflow_id, name, version, status, inputs, output, error, serializer, durability,
    parent_id, parent_step_seq, owner, epoch, lease_expires_at, recovery_attempts,
    created_at, updated_at, finished_at, journal_version, attributes,
    (w.status IN ('PENDING', 'ENQUEUED')
     OR (w.status = 'RUNNING' AND w.lease_expires_at < {schema}.current_time()))
    AND NOT EXISTS (
        SELECT 1 FROM live
        WHERE live.name = w.name AND live.version = coalesce(w.version, ''))
    AS waiting_for_worker
FROM {schema}.workflows AS w
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(id_from)s::text IS NULL OR (workflow_id COLLATE "C" >= %(id_from)s::text
       AND workflow_id COLLATE "C" < %(id_to)s::text AND starts_with(workflow_id, %(id_from)s)))
  AND (%(created_from)s::timestamptz IS NULL OR created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR created_at < %(created_to)s::timestamptz)
  AND (%(top_level)s = false OR parent_id IS NULL)
  AND (%(search)s::text IS NULL OR strpos(lower(inputs), %(search)s::text) > 0
       OR strpos(lower(output), %(search)s::text) > 0)
  -- A RunFilter's (durable/_run/filter.py): several statuses, a version ('' for none), a
  -- parent, attributes equal (the GIN index of 0033), ranges on attributes (a jsonpath
  -- whose values are attr_vars; a value of another type matches no range).
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(version)s::text IS NULL OR coalesce(version, '') = %(version)s::text)
  AND (%(parent_id)s::text IS NULL OR parent_id = %(parent_id)s::text)
  AND (%(attr_eq)s::jsonb IS NULL OR attributes @> %(attr_eq)s::jsonb)
  AND (%(attr_path)s::jsonpath IS NULL OR coalesce(jsonb_path_match(attributes,
       %(attr_path)s::jsonpath, %(attr_vars)s::jsonb, true), false))
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, workflow_id) < (%(after_at)s::timestamptz, %(after_id)s::text))
ORDER BY created_at DESC, workflow_id DESC
LIMIT %(limit)s

-- count_workflows --
-- How many workflows list_workflows' filters match, counted no further than `cap` (a
-- count over a million rows would cost more than the page: "10,000+" says enough).
SELECT count(*) AS n FROM (
    SELECT 1 FROM {schema}.workflows
    WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
      AND (%(name)s::text IS NULL OR name = %(name)s::text)
      AND (%(id_from)s::text IS NULL OR (workflow_id COLLATE "C" >= %(id_from)s::text
           AND workflow_id COLLATE "C" < %(id_to)s::text
           AND starts_with(workflow_id, %(id_from)s)))
      AND (%(created_from)s::timestamptz IS NULL
           OR created_at >= %(created_from)s::timestamptz)
      AND (%(created_to)s::timestamptz IS NULL OR created_at < %(created_to)s::timestamptz)
      AND (%(top_level)s = false OR parent_id IS NULL)
      AND (%(search)s::text IS NULL OR strpos(lower(inputs), %(search)s::text) > 0
           OR strpos(lower(output), %(search)s::text) > 0)
      AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
      AND (%(version)s::text IS NULL OR coalesce(version, '') = %(version)s::text)
      AND (%(parent_id)s::text IS NULL OR parent_id = %(parent_id)s::text)
      AND (%(attr_eq)s::jsonb IS NULL OR attributes @> %(attr_eq)s::jsonb)
      AND (%(attr_path)s::jsonpath IS NULL OR coalesce(jsonb_path_match(attributes,
           %(attr_path)s::jsonpath, %(attr_vars)s::jsonb, true), false))
    LIMIT %(cap)s
) AS matched

-- list_children --
-- The workflows these workflows started (one level), oldest first under each parent: the
-- console folds them under the rows of its page.
SELECT workflow_id, name, version, status, parent_id, parent_step_seq, created_at, finished_at
FROM {schema}.workflows
WHERE parent_id = ANY(%(parent_ids)s::text[])
ORDER BY parent_id, created_at, workflow_id
LIMIT %(limit)s

-- load_journal --
-- Every recorded step of a workflow, read once when a run resumes.
SELECT step_seq, step_name, kind, output, error, attempts, child_workflow_id,
    started_at, finished_at, applied_in
FROM {schema}.steps WHERE workflow_id = %(workflow_id)s ORDER BY step_seq

-- load_journals --
-- The journals of a batch of claimed workflows, in one query (read as tuples, in this
-- order of columns: StepRecord.from_journal_row).
SELECT workflow_id, step_seq, step_name, kind, output, error, attempts, child_workflow_id,
    started_at, finished_at, applied_in
FROM {schema}.steps WHERE workflow_id = ANY(%(workflow_ids)s::text[])
ORDER BY workflow_id, step_seq

-- abandon_workflow --
-- This process gave up a run without finishing it (SystemExit, KeyboardInterrupt in its
-- code): the lease expires now and the heartbeat no longer renews it, so a worker claims
-- it at once and counts a recovery attempt (a run that keeps doing this ends as
-- MAX_RECOVERY_ATTEMPTS_EXCEEDED instead of looping).
UPDATE {schema}.workflows
SET owner = 'abandoned:' || owner, lease_expires_at = {schema}.current_time(),
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')

-- prune_executors --
-- Forget executors whose heartbeat stopped long ago (killed workers) and that own nothing.
-- (The owners are read first: Citus deletes from a table copied to every node, as
-- executors is, only with what it has read beforehand from distributed tables.)
WITH busy AS (
    SELECT DISTINCT owner FROM {schema}.workflows
    WHERE status = 'RUNNING' AND owner IS NOT NULL
)
DELETE FROM {schema}.executors AS e
WHERE e.heartbeat_at < {schema}.current_time() - make_interval(secs => %(stale_seconds)s)
  AND e.executor_id NOT IN (SELECT owner FROM busy)

-- patch_point_started --
-- Whether a run of this workflow started a call at position step_seq that left no journal
-- row there yet (an effect's intent, an approval gate asked): code from before a patch
-- passed that point, so a patch there must take its old branch. One shard (both tables
-- are the workflow's); children and messages are asked apart (child_started_at,
-- message_sent_at), as they live on other shards.
SELECT EXISTS (SELECT 1 FROM {schema}.effects
               WHERE workflow_id = %(workflow_id)s AND step_seq = %(step_seq)s)
    OR EXISTS (SELECT 1 FROM {schema}.approvals
               WHERE workflow_id = %(workflow_id)s AND step_seq = %(step_seq)s) AS started

-- child_started_at --
-- Whether a run of this workflow started a child (called, started or enqueued, under a
-- derived id or one the code chose) at position step_seq: the child's row names its parent
-- and the position, whatever the child's id. Fans out to every shard on Citus (the child
-- lives on its own); asked only by a run recovering at a patch point.
SELECT 1 AS started FROM {schema}.workflows
WHERE parent_id = %(workflow_id)s AND parent_step_seq = %(step_seq)s
LIMIT 1

-- message_sent_at --
-- Whether a run of this workflow delivered a message from position step_seq (the message
-- is the receiver's row: by its sender columns, whatever its id). Fans out on Citus, like
-- child_started_at, and is asked only by a run recovering at a patch point.
SELECT 1 AS sent FROM {schema}.messages
WHERE sender_id = %(workflow_id)s AND sender_seq = %(step_seq)s
LIMIT 1

-- finished_among --
-- Which of these workflows have finished, or are not there (gone: yet, since an engine
-- remembers a workflow just before its row is written, or any more, once pruned): an engine
-- stops watching the finished ones, and those not there for a while.
SELECT t.workflow_id, w.workflow_id IS NULL AS gone
FROM unnest(%(workflow_ids)s::text[]) AS t (workflow_id)
LEFT JOIN {schema}.workflows AS w USING (workflow_id)
WHERE w.workflow_id IS NULL
   OR w.status IN ('SUCCESS', 'ERROR', 'CANCELLED', 'COMPENSATED', 'COMPENSATION_FAILED',
                   'MAX_RECOVERY_ATTEMPTS_EXCEEDED')

-- abandon_owned --
-- An executor restarting under the same id: whatever it owned was interrupted by its own
-- crash. Expire those leases now (and stop the heartbeat renewing them), so they are
-- claimed at once, each claim counting a recovery attempt, instead of after the lease.
-- Only while this process holds the id (the row names its incarnation); and unless the
-- process before is known to be dead, only the leases that expired already: a lease
-- that has not was taken by a process that is alive after all (paused, then resumed).
UPDATE {schema}.workflows
SET owner = 'abandoned:' || owner, lease_expires_at = {schema}.current_time(),
    updated_at = {schema}.current_time()
WHERE owner = %(owner)s AND status = 'RUNNING'
  AND (%(dead)s::boolean OR lease_expires_at < {schema}.current_time())
  AND EXISTS (SELECT 1 FROM {schema}.executors
              WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s)

-- queue_depths --
-- Per queue: entries waiting for a slot, entries holding one, and finished ones.
SELECT queue_name,
    count(*) FILTER (WHERE status = 'ENQUEUED') AS queued,
    count(*) FILTER (WHERE status IN ('PENDING', 'RUNNING', 'SUSPENDED')) AS active,
    count(*) FILTER (WHERE status IN ('SUCCESS', 'ERROR', 'CANCELLED', 'COMPENSATED',
        'COMPENSATION_FAILED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')) AS finished
FROM {schema}.workflows WHERE queue_name IS NOT NULL
GROUP BY queue_name ORDER BY queue_name

-- queue_partitions --
-- Per partition of one queue: its entries waiting for a slot and those holding one.
SELECT partition_key,
    count(*) FILTER (WHERE status = 'ENQUEUED') AS queued,
    count(*) FILTER (WHERE status IN ('PENDING', 'RUNNING', 'SUSPENDED')) AS active
FROM {schema}.workflows
WHERE queue_name = %(queue_name)s AND partition_key IS NOT NULL
  AND status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED')
GROUP BY partition_key ORDER BY partition_key

-- release_workflow --
-- Give one workflow back to the pool (this run could not finish it), if this epoch owns it;
-- PAUSED instead when a pause was asked of it (then nobody claims it until it is unpaused).
UPDATE {schema}.workflows
SET status = CASE WHEN paused_at IS NULL THEN 'PENDING' ELSE 'PAUSED' END,
    owner = NULL, lease_expires_at = NULL,
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')

-- children_of --
-- The workflows these workflows started: one level of a tree, which a cancel walks down a
-- level per statement (a recursive query over parent_id, not the distribution column,
-- cannot run on a schema sharded by workflow id).
SELECT workflow_id FROM {schema}.workflows WHERE parent_id = ANY(%(workflow_ids)s::text[])

-- cancel_workflows --
-- Cancel these workflows (one and its descendants, found by children_of). Running ones
-- (live lease) are asked and stop at their next step; started ones that are not running
-- become runnable so a worker stops them (running their compensations); never-started ones
-- are cancelled at once, with the epoch bumped to fence any stale runner. Each is decided
-- from its row as read, and written only if that row is unchanged under its lock (compare-
-- and-set: no row locks over many shards); `settled` false: it changed meanwhile, ask again.
WITH targets AS (
    SELECT w.workflow_id, w.epoch, w.status, {schema}.current_time() AS now,
        CASE WHEN w.status = 'RUNNING' AND w.lease_expires_at >= {schema}.current_time()
                 THEN 'RUNNING'
             -- Started (a journaled call, or an effect that may be in flight): a worker
             -- stops it, settling pending effects and running compensations.
             WHEN EXISTS (SELECT 1 FROM {schema}.steps AS s WHERE s.workflow_id = w.workflow_id)
                  OR EXISTS (SELECT 1 FROM {schema}.effects AS e
                             WHERE e.workflow_id = w.workflow_id)
                 THEN 'PENDING'
             ELSE 'CANCELLED' END AS next_status
    FROM {schema}.workflows AS w
    WHERE w.workflow_id = ANY(%(workflow_ids)s::text[])
      AND w.status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED', 'PAUSED')
), cancelled AS (
    UPDATE {schema}.workflows AS w
    SET status = t.next_status,
        cancel_requested_at = coalesce(w.cancel_requested_at, t.now),
        cancel_reason = coalesce(w.cancel_reason, %(reason)s),
        paused_at = NULL,  -- a cancel goes before a pause: nothing holds the stop back
        owner = CASE WHEN t.next_status = 'RUNNING' THEN w.owner END,
        lease_expires_at = CASE WHEN t.next_status = 'RUNNING' THEN w.lease_expires_at END,
        wake_at = NULL,
        epoch = CASE WHEN t.next_status = 'CANCELLED' THEN w.epoch + 1 ELSE w.epoch END,
        error = CASE WHEN t.next_status = 'CANCELLED' THEN %(error)s ELSE w.error END,
        finished_at = CASE WHEN t.next_status = 'CANCELLED' THEN t.now END,
        updated_at = t.now
    FROM targets AS t
    WHERE w.workflow_id = ANY(%(workflow_ids)s::text[])
      AND w.workflow_id = t.workflow_id AND w.epoch = t.epoch AND w.status = t.status
    RETURNING w.workflow_id, w.status, w.epoch
)
SELECT workflow_id, status, epoch, true AS settled FROM cancelled
UNION ALL
SELECT workflow_id, status, epoch, false FROM targets
WHERE workflow_id NOT IN (SELECT workflow_id FROM cancelled)

-- get_cancel_request --
-- Why a workflow was asked to stop (NULL: it was not), and its timeout.
SELECT cancel_reason, timeout_seconds FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s

-- owned_cancel_requests --
-- The running workflows of this executor that were asked to stop or to pause (polled by its
-- runner), among those it holds (on a distributed schema only their shards are asked),
-- while its incarnation holds the id. cancel_reason NULL: only a pause was asked.
SELECT workflow_id, epoch, cancel_reason, paused_at IS NOT NULL AS pause_requested
FROM {schema}.workflows
WHERE owner = %(owner)s AND status = 'RUNNING'
  AND (cancel_requested_at IS NOT NULL OR paused_at IS NOT NULL)
  AND workflow_id = ANY(%(held)s::text[])
  AND EXISTS (SELECT 1 FROM {schema}.executors
              WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s)

-- resume_workflow --
-- Make a stopped workflow runnable again (cancelled, failed, or out of recovery attempts).
-- The failures that ended it (failed step, tool, transaction, child and send records after the
-- last record that succeeded) are forgotten, so those calls run again; everything that
-- completed replays. Failed effects stay failed (the ledger says so), and the budget's
-- totals keep what the failed attempts spent. %(version)s: NULL keeps its version, ''
-- moves it to no version, any other text to that version.
WITH resumed AS (
    UPDATE {schema}.workflows
    SET status = 'PENDING', owner = NULL, lease_expires_at = NULL, epoch = epoch + 1,
        recovery_attempts = 0, output = NULL, error = NULL, finished_at = NULL,
        cancel_requested_at = NULL, cancel_reason = NULL, deadline_at = NULL, paused_at = NULL,
        version = CASE WHEN %(version)s::text IS NULL THEN version
                       ELSE nullif(%(version)s::text, '') END,
        updated_at = {schema}.current_time()
    WHERE workflow_id = %(workflow_id)s
      AND status IN ('CANCELLED', 'ERROR', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')
      -- A journal of a newer format is left for code that reads it (JournalVersionError).
      AND journal_version <= %(journal_version)s
      -- A cancel whose compensations ran is final: a replay would redo the effects on
      -- top of their undo (the error, always JSON from encode_error, says so).
      AND NOT (status = 'CANCELLED'
               AND coalesce((error::jsonb ->> 'compensated')::boolean, false))
    RETURNING workflow_id, name, version, status
), forgotten AS (
    DELETE FROM {schema}.steps AS s
    USING resumed AS r
    -- The id again, not only through r: Citus then sends the whole statement to the
    -- workflow's shard, instead of planning each part apart.
    WHERE s.workflow_id = %(workflow_id)s AND s.workflow_id = r.workflow_id
      AND s.error IS NOT NULL
      AND s.kind IN ('step', 'tool', 'transaction', 'child', 'send')
      AND s.step_seq > coalesce((
          SELECT max(ok.step_seq) FROM {schema}.steps AS ok
          WHERE ok.workflow_id = %(workflow_id)s AND ok.error IS NULL), -1)
    RETURNING s.step_seq
)
SELECT r.workflow_id, r.name, r.version, r.status,
    (SELECT count(*) FROM forgotten) AS forgotten
FROM resumed AS r

-- move_workflow --
-- Move a workflow that waits (for a worker, a queue slot or its wake-up) to another version
-- (%(version)s as in resume_workflow), on purpose. An interrupted run (RUNNING, its lease
-- expired) is released with its epoch bumped, so that its old owner, were it alive, writes
-- nothing more; a pending, queued or suspended one keeps its status, and with it its place
-- in its queue, its wake-up and a cancel asked of it. Its journal is left as it is: a
-- worker of the new version replays it. A run whose lease is live, and a finished
-- workflow, are not moved (nothing is returned); nor is a journal newer than this code.
UPDATE {schema}.workflows
SET status = CASE WHEN status = 'RUNNING' THEN 'PENDING' ELSE status END,
    version = nullif(%(version)s::text, ''),
    owner = CASE WHEN status = 'RUNNING' THEN NULL ELSE owner END,
    lease_expires_at = CASE WHEN status = 'RUNNING' THEN NULL ELSE lease_expires_at END,
    epoch = CASE WHEN status = 'RUNNING' THEN epoch + 1 ELSE epoch END,
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s
  AND (status IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'PAUSED')
       OR (status = 'RUNNING' AND lease_expires_at < {schema}.current_time()))
  AND journal_version <= %(journal_version)s
RETURNING workflow_id, name, version, status

-- fork_workflow --
-- A new workflow with another's inputs, runnable by any worker that has its code: the
-- original's version, or %(version)s when given (as in resume_workflow).
-- A forked root gets a ledger of its own (seeded with the copied steps' charges); a
-- forked child keeps drawing from its root's.
INSERT INTO {schema}.workflows (workflow_id, name, version, status, inputs, serializer,
    durability, budget_id, timeout_seconds, trace_context, journal_version,
    max_recovery_attempts, attributes)
SELECT %(new_id)s, name,
    CASE WHEN %(version)s::text IS NULL THEN version ELSE nullif(%(version)s::text, '') END,
    'PENDING', inputs, serializer, durability,
    CASE WHEN budget_id = workflow_id THEN %(new_id)s ELSE budget_id END, timeout_seconds,
    %(trace_context)s, %(journal_version)s, max_recovery_attempts, attributes
FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s AND journal_version <= %(journal_version)s
RETURNING workflow_id

-- fork_seqs --
-- The positions of a workflow's journal before a fork point, read once: every fork_*
-- statement copies those positions only, so a step the original's run records meanwhile
-- is left behind with all that belongs to it (each statement reads one shard).
SELECT step_seq FROM {schema}.steps
WHERE workflow_id = %(workflow_id)s AND step_seq < %(before_seq)s ORDER BY step_seq

-- fork_steps --
-- Copy a workflow's journal before a position into a fork. Each effect call copied names
-- the workflow whose ledger row records it (the original, or the workflow the original
-- copied it from): the fork shares that effect, and its one undo (claim_undo).
INSERT INTO {schema}.steps (workflow_id, step_seq, step_name, kind, output, error, attempts,
    child_workflow_id, started_at, finished_at, applied_in)
SELECT %(new_id)s, step_seq, step_name, kind, output, error, attempts, child_workflow_id,
    started_at, finished_at,
    CASE WHEN kind = 'effect' THEN coalesce(applied_in, workflow_id) END
FROM {schema}.steps
WHERE workflow_id = %(workflow_id)s AND step_seq = ANY(%(copied)s::int[])

-- fork_tool_calls --
-- Copy the tool calls of the copied steps into a fork.
INSERT INTO {schema}.tool_calls (workflow_id, step_seq, tool_name, arguments, latency_ms)
SELECT %(new_id)s, step_seq, tool_name, arguments, latency_ms FROM {schema}.tool_calls
WHERE workflow_id = %(workflow_id)s AND step_seq = ANY(%(copied)s::int[])

-- fork_charges --
-- Copy the charges of the copied steps (what the fork starts having spent), under the
-- fork's budget: its own when the original had its own, else the same (as fork_workflow
-- decides). Reads the original's shard only: the fork may live on another.
INSERT INTO {schema}.charges (workflow_id, step_seq, budget_id, dollars, tokens, steps)
SELECT %(new_id)s, c.step_seq,
    CASE WHEN c.budget_id = %(workflow_id)s THEN %(new_id)s ELSE c.budget_id END,
    c.dollars, c.tokens, c.steps
FROM {schema}.charges AS c
WHERE c.workflow_id = %(workflow_id)s AND c.step_seq = ANY(%(copied)s::int[])

-- fork_streams --
-- What readers of the original saw before the fork point, for readers of the fork: the
-- stream values (and closes) of the copied calls, at the same offsets.
INSERT INTO {schema}.streams (workflow_id, key, "offset", value, closed, step_seq, created_at)
SELECT %(new_id)s, key, "offset", value, closed, step_seq, created_at
FROM {schema}.streams
WHERE workflow_id = %(workflow_id)s AND step_seq = ANY(%(copied)s::int[])

-- fork_events --
-- Each event's value as it was at the fork point: the latest event call per key among the
-- copied ones (the events table keeps only a key's latest value, which may have been set
-- at or after the fork point), or the value a copied step's code set, when the events
-- table still holds it and it is later (an event set in a step has no journal row).
INSERT INTO {schema}.events (workflow_id, key, value, step_seq, updated_at)
SELECT DISTINCT ON (key) %(new_id)s, key, value, step_seq, updated_at
FROM (
    SELECT substr(step_name, length(%(event_prefix)s) + 1) AS key, output AS value,
        step_seq, finished_at AS updated_at
    FROM {schema}.steps
    WHERE workflow_id = %(workflow_id)s AND step_seq = ANY(%(copied)s::int[])
      AND kind = 'event' AND output IS NOT NULL
    UNION ALL
    SELECT key, value, step_seq, updated_at FROM {schema}.events
    WHERE workflow_id = %(workflow_id)s AND step_seq = ANY(%(copied)s::int[])
) AS set_before
ORDER BY key, step_seq DESC

-- fork_gates --
-- The gates decided at the copied positions (a gate still waiting is asked again by the
-- fork's run).
INSERT INTO {schema}.approvals (workflow_id, name, step_seq, status, payload,
    default_approved, comment, decided_by, requested_at, expires_at, decided_at)
SELECT %(new_id)s, name, step_seq, status, payload, default_approved, comment, decided_by,
    requested_at, expires_at, decided_at
FROM {schema}.approvals
WHERE workflow_id = %(workflow_id)s AND step_seq = ANY(%(copied)s::int[])
  AND status <> 'waiting'

-- fork_messages --
-- The messages consumed at the copied positions (a retry of one with its key delivers
-- nothing new, as to the original). Messages never consumed, or consumed at or after the
-- fork point, stay the original's.
INSERT INTO {schema}.messages (workflow_id, message_id, topic, payload, created_at,
    consumed_at, consumed_seq)
SELECT %(new_id)s, message_id, topic, payload, created_at, consumed_at, consumed_seq
FROM {schema}.messages
WHERE workflow_id = %(workflow_id)s AND consumed_seq = ANY(%(copied)s::int[])

-- export_snapshot --
-- An export reads one snapshot: a run that records a step or settles an effect meanwhile
-- is seen before or after, not half-way (the first statement of the export's transaction).
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY

-- export_workflows --
-- Export (Client.export_workflow): the rows of these workflows, each as a JSON object of its
-- columns, stored values as the text they are. Every export_* statement filters by the
-- workflows' ids (on Citus: their shards only), and runs in one transaction with the others.
SELECT to_jsonb(w)::text AS data FROM {schema}.workflows AS w
WHERE w.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY w.workflow_id

-- export_steps --
-- Export: the journals of these workflows.
SELECT to_jsonb(s)::text AS data FROM {schema}.steps AS s
WHERE s.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY s.workflow_id, s.step_seq

-- export_effects --
-- Export: the effect ledgers of these workflows.
SELECT to_jsonb(e)::text AS data FROM {schema}.effects AS e
WHERE e.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY e.workflow_id, e.step_seq

-- export_approvals --
-- Export: the gates of these workflows (waiting or decided).
SELECT to_jsonb(a)::text AS data FROM {schema}.approvals AS a
WHERE a.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY a.workflow_id, a.name

-- export_messages --
-- Export: the messages sent to these workflows, consumed or not.
SELECT to_jsonb(m)::text AS data FROM {schema}.messages AS m
WHERE m.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY m.workflow_id, m.message_id

-- export_events --
-- Export: the events these workflows published (the latest value per key).
SELECT to_jsonb(v)::text AS data FROM {schema}.events AS v
WHERE v.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY v.workflow_id, v.key

-- export_streams --
-- Export: the stream values these workflows wrote.
SELECT to_jsonb(t)::text AS data FROM {schema}.streams AS t
WHERE t.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY t.workflow_id, t.key, t."offset"

-- export_budgets --
-- Export: the budget ledgers of these workflows (a budget is its root's). Amounts of money
-- and time are numeric: written as text, so that JSON's floating point rounds none of them.
SELECT (to_jsonb(b) || jsonb_build_object('limit_dollars', b.limit_dollars::text,
        'limit_seconds', b.limit_seconds::text, 'spent_dollars', b.spent_dollars::text))::text
    AS data
FROM {schema}.budgets AS b
WHERE b.budget_id = ANY(%(workflow_ids)s::text[]) ORDER BY b.budget_id

-- export_charges --
-- Export: what the steps of these workflows spent (dollars as text, as export_budgets).
SELECT (to_jsonb(c) || jsonb_build_object('dollars', c.dollars::text))::text AS data
FROM {schema}.charges AS c
WHERE c.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY c.workflow_id, c.step_seq

-- export_tool_calls --
-- Export: the tool-call records of these workflows' steps.
SELECT to_jsonb(t)::text AS data FROM {schema}.tool_calls AS t
WHERE t.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY t.workflow_id, t.step_seq

-- import_taken --
-- Which of these ids this database already knows: a workflow, or the effect records a
-- pruned workflow left behind (its idempotency keys were used here). An import refuses them.
SELECT workflow_id FROM {schema}.workflows WHERE workflow_id = ANY(%(workflow_ids)s::text[])
UNION
SELECT workflow_id FROM {schema}.effects WHERE workflow_id = ANY(%(workflow_ids)s::text[])

-- import_columns --
-- Import: the columns of each per-workflow table, as this database has them (each as an
-- object of its columns, all null: a row type read from the catalog, no table scanned).
-- The import_* statements below ignore a key their table lacks, so an import refuses a
-- row with such a key first: a newer release's column would be dropped without a word.
SELECT to_jsonb(jsonb_populate_record(NULL::{schema}.workflows, e)) AS workflows,
       to_jsonb(jsonb_populate_record(NULL::{schema}.budgets, e)) AS budgets,
       to_jsonb(jsonb_populate_record(NULL::{schema}.steps, e)) AS steps,
       to_jsonb(jsonb_populate_record(NULL::{schema}.charges, e)) AS charges,
       to_jsonb(jsonb_populate_record(NULL::{schema}.tool_calls, e)) AS tool_calls,
       to_jsonb(jsonb_populate_record(NULL::{schema}.effects, e)) AS effects,
       to_jsonb(jsonb_populate_record(NULL::{schema}.approvals, e)) AS approvals,
       to_jsonb(jsonb_populate_record(NULL::{schema}.messages, e)) AS messages,
       to_jsonb(jsonb_populate_record(NULL::{schema}.events, e)) AS events,
       to_jsonb(jsonb_populate_record(NULL::{schema}.streams, e)) AS streams,
       to_jsonb(jsonb_populate_record(NULL::{schema}.step_attempts, e)) AS step_attempts,
       to_jsonb(jsonb_populate_record(NULL::{schema}.late_charges, e)) AS late_charges
FROM (VALUES (jsonb_build_object())) AS nothing (e)

-- import_workflows --
-- Import (Client.import_workflow): insert exported rows, given as a JSON array of objects
-- keyed by column (PostgreSQL reads each value as its column's type). Every import_*
-- statement runs in one transaction with the others; a key the table lacks is ignored
-- (import_columns is asked first, and such a row refused).
INSERT INTO {schema}.workflows
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.workflows, %(rows)s::jsonb)

-- import_budgets --
-- Import: budget ledgers (after their root's workflows row, which they reference).
INSERT INTO {schema}.budgets
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.budgets, %(rows)s::jsonb)

-- import_steps --
-- Import: journal rows.
INSERT INTO {schema}.steps
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.steps, %(rows)s::jsonb)

-- import_charges --
-- Import: charges (after the journal rows they reference).
INSERT INTO {schema}.charges
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.charges, %(rows)s::jsonb)

-- import_tool_calls --
-- Import: tool-call records (after the journal rows they reference).
INSERT INTO {schema}.tool_calls
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.tool_calls, %(rows)s::jsonb)

-- import_effects --
-- Import: effect ledger rows.
INSERT INTO {schema}.effects
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.effects, %(rows)s::jsonb)

-- import_approvals --
-- Import: gates.
INSERT INTO {schema}.approvals
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.approvals, %(rows)s::jsonb)

-- import_messages --
-- Import: messages.
INSERT INTO {schema}.messages
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.messages, %(rows)s::jsonb)

-- import_events --
-- Import: events.
INSERT INTO {schema}.events
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.events, %(rows)s::jsonb)

-- import_streams --
-- Import: stream values.
INSERT INTO {schema}.streams
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.streams, %(rows)s::jsonb)

-- notify_work --
-- Wake idle workers: there is runnable work (NOTIFY is sent by the client, after its write).
SELECT pg_notify(%(channel)s, %(payload)s)

-- list_executors --
-- Every registered executor, with its heartbeat age and the workflows it owns.
-- (Counted per owner, then joined: Citus takes no correlated subquery beside a table copied
-- to every node, as executors is.)
SELECT e.executor_id, e.hostname, e.pid, e.started_at, e.heartbeat_at, e.capabilities,
    ({schema}.current_time() - e.heartbeat_at) AS heartbeat_age,
    coalesce(r.running, 0) AS running
FROM {schema}.executors e
LEFT JOIN (
    SELECT owner, count(*) AS running FROM {schema}.workflows
    WHERE status = 'RUNNING' AND owner IS NOT NULL GROUP BY owner
) AS r ON r.owner = e.executor_id
ORDER BY e.started_at

-- waiting_for_worker --
-- Runnable (or interrupted) workflows that no live executor has the code for.
SELECT w.workflow_id, w.name, w.version FROM {schema}.workflows w
WHERE (w.status IN ('PENDING', 'ENQUEUED')
       OR (w.status = 'RUNNING' AND w.lease_expires_at < {schema}.current_time()))
  AND NOT EXISTS (
    SELECT 1 FROM {schema}.executors e, jsonb_array_elements(e.capabilities) AS c
    WHERE e.heartbeat_at > {schema}.current_time() - make_interval(secs => %(stale_seconds)s)
      AND c ->> 0 = w.name AND coalesce(c ->> 1, '') = coalesce(w.version, ''))
ORDER BY w.created_at LIMIT %(limit)s

-- worker_wait --
-- One workflow: whether it waits for a worker of its (name, version) that no live executor
-- has (waiting_for_worker's test), and the versions of its name that live executors have
-- ('' for none), so that an operator sees where it could go.
SELECT w.workflow_id, w.name, w.version, w.status,
    (w.status IN ('PENDING', 'ENQUEUED')
     OR (w.status = 'RUNNING' AND w.lease_expires_at < {schema}.current_time()))
    AND NOT EXISTS (
        SELECT 1 FROM {schema}.executors e, jsonb_array_elements(e.capabilities) AS c
        WHERE e.heartbeat_at
                  > {schema}.current_time() - make_interval(secs => %(stale_seconds)s)
          AND c ->> 0 = w.name AND coalesce(c ->> 1, '') = coalesce(w.version, ''))
    AS waiting,
    ARRAY(
        SELECT DISTINCT coalesce(c ->> 1, '')
        FROM {schema}.executors e, jsonb_array_elements(e.capabilities) AS c
        WHERE e.heartbeat_at
                  > {schema}.current_time() - make_interval(secs => %(stale_seconds)s)
          AND c ->> 0 = w.name
        ORDER BY 1) AS live_versions
FROM {schema}.workflows AS w WHERE w.workflow_id = %(workflow_id)s

-- record_step --
-- Journal one step, only while this run's epoch owns the workflow (one statement, one commit).
-- RETURNING says whose row it wrote: lazy modes send batches of large records as one
-- pipeline of these in one transaction (see SystemDB.write_steps).
INSERT INTO {schema}.steps AS j (workflow_id, step_seq, step_name, kind, output, error, attempts,
    child_workflow_id, started_at)
SELECT workflow_id, %(step_seq)s, %(step_name)s, %(kind)s, %(output)s, %(error)s,
    %(attempts)s, %(child_workflow_id)s, %(started_at)s
FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
FOR SHARE
RETURNING workflow_id

-- record_step_in_app --
-- record_step inside a @transaction step's own transaction, sent in one pipeline with its
-- COMMIT (one round trip for both). Where record_step would insert nothing because this
-- run lost the workflow, this raises (fence_lost, SQLSTATE UD001): the transaction is then
-- aborted and the COMMIT behind it keeps none of its writes.
WITH rec AS (
    INSERT INTO {schema}.steps AS j (workflow_id, step_seq, step_name, kind, output, error,
        attempts, child_workflow_id, started_at)
    SELECT workflow_id, %(step_seq)s, %(step_name)s, %(kind)s, %(output)s, %(error)s,
        %(attempts)s, %(child_workflow_id)s, %(started_at)s
    FROM {schema}.workflows
    WHERE workflow_id = %(workflow_id)s
        AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
    FOR SHARE
    RETURNING workflow_id
)
SELECT CASE WHEN count(*) = 1 THEN 1
    ELSE {schema}.fence_lost(%(workflow_id)s, %(epoch)s::bigint) END AS written
FROM rec

-- finish_workflow --
-- Write a run's outcome and release ownership, only while this run's epoch owns it. A
-- SUCCESS is refused while a cancel request stands (asked before this commit): the cancel
-- wins, and the run stops as cancelled instead (see finish_refused).
UPDATE {schema}.workflows
SET status = %(status)s, output = %(output)s, error = %(error)s, owner = NULL,
    lease_expires_at = NULL, finished_at = {schema}.current_time(),
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
    AND (%(status)s <> 'SUCCESS' OR cancel_requested_at IS NULL)

-- finish_refused --
-- Why this run's outcome was refused: its row while the run still owns it and a cancel
-- request stands (the run then stops as cancelled); no row: it lost ownership.
SELECT cancel_reason FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
    AND cancel_requested_at IS NOT NULL

-- finish_workflows --
-- Many runs' outcomes in one statement and one commit (a group commit: runs that finish
-- at the same moment, as during a recovery, share it). Each row is fenced by its own run's
-- epoch; RETURNING tells which were written.
UPDATE {schema}.workflows AS w
SET status = f.status, output = f.output, error = f.error, owner = NULL,
    lease_expires_at = NULL, finished_at = {schema}.current_time(),
    updated_at = {schema}.current_time()
FROM unnest(%(workflow_ids)b::text[], %(epochs)b::bigint[], %(statuses)b::text[],
            %(outputs)b::text[], %(errors)b::text[])
     AS f (workflow_id, epoch, status, output, error)
WHERE w.workflow_id = f.workflow_id
  AND (w.epoch, w.status) IS NOT DISTINCT FROM (f.epoch, 'RUNNING')
  AND (f.status <> 'SUCCESS' OR w.cancel_requested_at IS NULL)  -- as in finish_workflow
RETURNING w.workflow_id

-- finish_with_steps --
-- An exit-mode run's last records and its outcome in one statement, one commit: the outcome
-- is written only while this run's epoch owns the workflow (the UPDATE locks the row and
-- fences), the records only with it. RETURNING: the workflow id of each record written.
WITH finished AS (
    UPDATE {schema}.workflows
    SET status = %(status)s, output = %(output)s, error = %(error)s, owner = NULL,
        lease_expires_at = NULL, finished_at = {schema}.current_time(),
        updated_at = {schema}.current_time()
    WHERE workflow_id = %(workflow_id)s
        AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
        AND (%(status)s <> 'SUCCESS' OR cancel_requested_at IS NULL)  -- as finish_workflow
    RETURNING workflow_id
)
INSERT INTO {schema}.steps AS j (workflow_id, step_seq, step_name, kind, output, error, attempts,
    started_at)
SELECT f.workflow_id, u.step_seq, u.step_name, u.kind, u.output, u.error, u.attempts,
    u.started_at
FROM finished AS f,
     unnest(%(seqs)b::int[], %(names)b::text[], %(kinds)b::text[], %(outputs)b::text[],
            %(errors)b::text[], %(attempts)b::int[], %(started)b::timestamptz[])
     AS u (step_seq, step_name, kind, output, error, attempts, started_at)
ORDER BY u.step_seq
RETURNING workflow_id

-- claim_batch --
-- Take up to `limit` runnable workflows this executor can run (new, released, or with an
-- expired lease), optionally only among given ids; each claim bumps the epoch. Nothing
-- once another incarnation holds this executor's id (see 0017). "Can run": it has their
-- code (name, version) and reads their journal's version (0020); every claim and dequeue
-- below says the same. An executor given `queues` (the queues it runs) leaves the entries
-- of other queues, interrupted ones included, to the executors that run those; work that
-- came from no queue is claimed by any.
UPDATE {schema}.workflows AS w
-- Out of attempts: its own limit (stored when it was created, 0029), else this engine's.
SET status = CASE WHEN w.status = 'RUNNING'
                       AND w.recovery_attempts >= coalesce(w.max_recovery_attempts,
                                                           %(max_attempts)s)
                  THEN 'MAX_RECOVERY_ATTEMPTS_EXCEEDED' ELSE 'RUNNING' END,
    owner = CASE WHEN w.status = 'RUNNING'
                      AND w.recovery_attempts >= coalesce(w.max_recovery_attempts,
                                                          %(max_attempts)s)
                 THEN NULL ELSE %(owner)s END,
    -- NULL when out of attempts. The time is never inside a CASE or a COALESCE (Citus
    -- refuses it there), and a column is added to it by plus_seconds (IMMUTABLE).
    lease_expires_at = {schema}.plus_seconds({schema}.current_time(),
        CASE WHEN w.status = 'RUNNING'
                  AND w.recovery_attempts >= coalesce(w.max_recovery_attempts,
                                                      %(max_attempts)s)
             THEN NULL ELSE %(lease_seconds)s END),
    recovery_attempts = w.recovery_attempts + (CASE WHEN w.status = 'RUNNING' THEN 1 ELSE 0 END),
    epoch = w.epoch + 1,
    -- The first claim's deadline is kept: LEAST ignores the NULL given once it is set.
    deadline_at = LEAST(w.deadline_at, {schema}.plus_seconds({schema}.current_time(),
        CASE WHEN w.deadline_at IS NULL THEN w.timeout_seconds END)),
    updated_at = {schema}.current_time()
FROM (
    SELECT workflow_id, status FROM {schema}.workflows
    WHERE (status = 'PENDING'
           OR (status = 'RUNNING' AND lease_expires_at < {schema}.current_time()))
      AND (%(workflow_ids)s::text[] IS NULL OR workflow_id = ANY(%(workflow_ids)s::text[]))
      AND (%(queues)s::text[] IS NULL OR queue_name IS NULL
           OR queue_name = ANY(%(queues)s::text[]))
      AND (name, coalesce(version, '')) IN (
          SELECT n, v FROM unnest(%(names)s::text[], %(versions)s::text[]) AS t (n, v))
      AND journal_version <= %(journal_version)s
      AND EXISTS (SELECT 1 FROM {schema}.executors
                  WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s)
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS c
WHERE w.workflow_id = c.workflow_id
RETURNING w.workflow_id, w.name, w.version, w.status, w.inputs, w.serializer, w.durability,
    w.epoch, w.deadline_at, w.cancel_reason, w.budget_id, w.recovery_attempts, w.trace_context,
    c.status = 'RUNNING' AS lease_expired, w.parent_id, w.max_recovery_attempts,
    w.paused_at IS NOT NULL AS pause_requested

-- claim_batch_cas --
-- claim_batch for distributed PostgreSQL, which cannot lock rows of many shards in one
-- statement (FOR UPDATE SKIP LOCKED): read the candidates, then claim each only if it is
-- still claimable, a compare-and-set in the UPDATE's WHERE. A row another worker claimed
-- in between is re-checked after its lock and skipped.
WITH c AS (
    SELECT workflow_id, status FROM {schema}.workflows
    WHERE (status = 'PENDING'
           OR (status = 'RUNNING' AND lease_expires_at < {schema}.current_time()))
      AND (%(workflow_ids)s::text[] IS NULL OR workflow_id = ANY(%(workflow_ids)s::text[]))
      AND (%(queues)s::text[] IS NULL OR queue_name IS NULL
           OR queue_name = ANY(%(queues)s::text[]))
      AND (name, coalesce(version, '')) IN (
          SELECT n, v FROM unnest(%(names)s::text[], %(versions)s::text[]) AS t (n, v))
      AND journal_version <= %(journal_version)s
      AND EXISTS (SELECT 1 FROM {schema}.executors
                  WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s)
    ORDER BY created_at
    LIMIT %(limit)s
)
UPDATE {schema}.workflows AS w
-- Out of attempts: its own limit (stored when it was created, 0029), else this engine's.
SET status = CASE WHEN w.status = 'RUNNING'
                       AND w.recovery_attempts >= coalesce(w.max_recovery_attempts,
                                                           %(max_attempts)s)
                  THEN 'MAX_RECOVERY_ATTEMPTS_EXCEEDED' ELSE 'RUNNING' END,
    owner = CASE WHEN w.status = 'RUNNING'
                      AND w.recovery_attempts >= coalesce(w.max_recovery_attempts,
                                                          %(max_attempts)s)
                 THEN NULL ELSE %(owner)s END,
    -- NULL when out of attempts. The time is never inside a CASE or a COALESCE (Citus
    -- refuses it there), and a column is added to it by plus_seconds (IMMUTABLE).
    lease_expires_at = {schema}.plus_seconds({schema}.current_time(),
        CASE WHEN w.status = 'RUNNING'
                  AND w.recovery_attempts >= coalesce(w.max_recovery_attempts,
                                                      %(max_attempts)s)
             THEN NULL ELSE %(lease_seconds)s END),
    recovery_attempts = w.recovery_attempts + (CASE WHEN w.status = 'RUNNING' THEN 1 ELSE 0 END),
    epoch = w.epoch + 1,
    -- The first claim's deadline is kept: LEAST ignores the NULL given once it is set.
    deadline_at = LEAST(w.deadline_at, {schema}.plus_seconds({schema}.current_time(),
        CASE WHEN w.deadline_at IS NULL THEN w.timeout_seconds END)),
    updated_at = {schema}.current_time()
FROM c
WHERE w.workflow_id = c.workflow_id
  AND (%(workflow_ids)s::text[] IS NULL OR w.workflow_id = ANY(%(workflow_ids)s::text[]))
  AND (w.status = 'PENDING'
       OR (w.status = 'RUNNING' AND w.lease_expires_at < {schema}.current_time()))
  -- ...and still of a version this worker has (an operator may have moved it meanwhile).
  AND (w.name, coalesce(w.version, '')) IN (
      SELECT n, v FROM unnest(%(names)s::text[], %(versions)s::text[]) AS t (n, v))
RETURNING w.workflow_id, w.name, w.version, w.status, w.inputs, w.serializer, w.durability,
    w.epoch, w.deadline_at, w.cancel_reason, w.budget_id, w.recovery_attempts, w.trace_context,
    c.status = 'RUNNING' AS lease_expired, w.parent_id, w.max_recovery_attempts,
    w.paused_at IS NOT NULL AS pause_requested

-- renew_claim --
-- Keep a claim that waited in the queue, if it is still this run's: renewing its lease
-- in the same statement means no other worker can take it between the answer and the
-- run (its lease may have run out, untaken, while it waited).
UPDATE {schema}.workflows
SET lease_expires_at = {schema}.current_time() + make_interval(secs => %(lease_seconds)s)
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
RETURNING 1 AS owned

-- claim_candidates_on_shards --
-- claim_batch_cas's candidates while a Citus worker node is down: the claim over every
-- shard is refused then, so each shard that answers is read by itself
-- (run_command_on_shards, as due_on_shards), up to `limit` runnable workflows of each,
-- and the oldest `limit` of them all are claimed by claim_batch_cas with their ids, which
-- touches only their shards. The work held by the node that is down waits for it; the
-- rest goes on. `%%s` is the shard's name; the names, versions, journal version and queues
-- are quoted into the command. A read on a worker: its clock, not a FakeClock's.
SELECT c.workflow_id FROM run_command_on_shards(
    '{schema}.workflows',
    $cmd$SELECT coalesce(json_agg(c)::text, '[]') FROM (
             SELECT workflow_id, created_at FROM %%s
             WHERE (status = 'PENDING'
                    OR (status = 'RUNNING' AND lease_expires_at < {schema}.current_time()))
               AND (name, coalesce(version, '')) IN (SELECT n, v FROM unnest($cmd$
        || quote_literal(%(names)s::text[]) || '::text[], '
        || quote_literal(%(versions)s::text[]) || $cmd$::text[]) AS t (n, v))
               AND journal_version <= $cmd$ || %(journal_version)s::int || $cmd$
               AND (queue_name IS NULL OR $cmd$ || quote_nullable(%(queues)s::text[])
        || $cmd$::text[] IS NULL OR queue_name = ANY($cmd$
        || quote_nullable(%(queues)s::text[]) || $cmd$::text[]))
             ORDER BY created_at LIMIT $cmd$ || %(limit)s::int || ') AS c') AS s,
    LATERAL json_to_recordset(s.result::json) AS c (workflow_id text, created_at timestamptz)
WHERE s.success
ORDER BY c.created_at
LIMIT %(limit)s

-- claim_candidates_on_nodes --
-- claim_candidates_on_shards while a Citus worker node hangs (it keeps its connections
-- and answers nothing, so run_command_on_shards would wait for it): each node that is not
-- among the `hung` groups is asked by master_run_on_worker, one command per node over the
-- union of its shards, for up to `limit` runnable workflows; the oldest `limit` of them all
-- are claimed by claim_batch_cas with their ids. A read on a worker: its clock.
WITH tables AS (
    SELECT n.nodename, n.nodeport,
           string_agg('SELECT workflow_id, created_at, status, lease_expires_at, name,'
                      || ' version, journal_version, queue_name FROM '
                      || shard_name(s.logicalrelid, s.shardid), ' UNION ALL ') AS shards
    FROM pg_dist_shard AS s
    JOIN pg_dist_placement AS p ON p.shardid = s.shardid
    JOIN pg_dist_node AS n ON n.groupid = p.groupid AND n.noderole = 'primary'
    WHERE s.logicalrelid = '{schema}.workflows'::regclass
      AND NOT (p.groupid = ANY(%(hung)s::int[]))
    GROUP BY n.nodename, n.nodeport
), commands AS (
    SELECT array_agg(nodename) AS names, array_agg(nodeport) AS ports,
           array_agg($cmd$SELECT coalesce(json_agg(c)::text, '[]') FROM (
               SELECT workflow_id, created_at FROM ($cmd$ || shards || $cmd$) AS w
               WHERE (status = 'PENDING'
                      OR (status = 'RUNNING' AND lease_expires_at < {schema}.current_time()))
                 AND (name, coalesce(version, '')) IN (SELECT n, v FROM unnest($cmd$
               || quote_literal(%(names)s::text[]) || '::text[], '
               || quote_literal(%(versions)s::text[]) || $cmd$::text[]) AS t (n, v))
                 AND journal_version <= $cmd$ || %(journal_version)s::int || $cmd$
                 AND (queue_name IS NULL OR $cmd$ || quote_nullable(%(queues)s::text[])
               || $cmd$::text[] IS NULL OR queue_name = ANY($cmd$
               || quote_nullable(%(queues)s::text[]) || $cmd$::text[]))
               ORDER BY created_at LIMIT $cmd$ || %(limit)s::int || ') AS c') AS cmds
    FROM tables
)
SELECT c.workflow_id
FROM commands,
     LATERAL master_run_on_worker(commands.names, commands.ports, commands.cmds, true) AS r,
     LATERAL json_to_recordset(r.result::json) AS c (workflow_id text, created_at timestamptz)
WHERE r.success
ORDER BY c.created_at
LIMIT %(limit)s

-- citus_probe_session --
-- The probe's own connection gives each Citus worker node `ms` milliseconds to connect and
-- answer (citus.node_connection_timeout): a node that hangs accepts no connection.
SELECT set_config('citus.node_connection_timeout', %(ms)s::int::text, false)

-- citus_probe_nodes --
-- Whether each Citus worker node answers a trivial command: all asked at once, through
-- the coordinator (its metadata answers while one hangs), each on a new connection.
WITH nodes AS (
    SELECT groupid, nodename, nodeport FROM pg_dist_node
    WHERE noderole = 'primary' AND groupid <> 0 AND isactive
), asked AS (
    SELECT r.node_name, r.node_port, r.success
    FROM (SELECT array_agg(nodename) AS names, array_agg(nodeport) AS ports,
                 array_agg('SELECT 1'::text) AS cmds FROM nodes) AS a,
         LATERAL master_run_on_worker(a.names, a.ports, a.cmds, true) AS r
    WHERE a.names IS NOT NULL
)
SELECT n.groupid, n.nodename || ':' || n.nodeport AS node, coalesce(asked.success, false) AS answers
FROM nodes AS n
LEFT JOIN asked ON asked.node_name = n.nodename AND asked.node_port = n.nodeport

-- citus_set_local --
-- In a claim's transaction on Citus, the SET LOCAL that follows reaches the worker nodes
-- too (where the rows and their locks are).
SET LOCAL citus.propagate_set_commands = 'local'

-- claim_lock_wait --
-- While a Citus worker node hangs, a claim by ids waits a moment at most for a row that a
-- statement left waiting on the hung node still locks (55P03: left for later).
SET LOCAL lock_timeout = '200ms'

-- citus_session --
-- On a Citus schema, each connection of durable's lets its multi-shard writes on
-- distributed tables run beside one another (no ShareUpdateExclusive shard lock): a claim
-- or lease renewal left waiting on a node that hangs then holds up no multi-shard write
-- on the other nodes' shards. Row locks and the epoch fences keep the writes correct; a
-- distributed deadlock is cancelled by Citus (SQLSTATE 40P01) and the statement retried.
-- Reference tables keep their exclusive locks (their replicas stay in one order).
SET citus.enable_deadlock_prevention = off

-- nodes_of --
-- The workflows `held` grouped by the Citus node that holds their shard (read from the
-- coordinator's metadata: it answers while a worker node is down), so that a statement
-- on them refused for one node can be sent again per node, and the others' go through.
SELECT p.groupid AS node, array_agg(h.i) AS held, array_agg(h.e) AS epochs
FROM unnest(%(held)s::text[], %(epochs)s::bigint[]) AS h (i, e)
JOIN pg_dist_placement AS p
  ON p.shardid = get_shard_id_for_distribution_column('{schema}.workflows', h.i)
GROUP BY p.groupid

-- renew_leases --
-- Extend the lease of every workflow this executor runs (the heartbeat): the claims it
-- holds, each (workflow, epoch), not every row it owns (a claim it never heard back about
-- must expire), and only while its incarnation holds the id.
UPDATE {schema}.workflows
SET lease_expires_at = {schema}.current_time() + make_interval(secs => %(lease_seconds)s)
WHERE owner = %(owner)s AND status = 'RUNNING' AND workflow_id = ANY(%(held)s::text[])
  AND (workflow_id, epoch) IN (
      SELECT i, e FROM unnest(%(held)s::text[], %(epochs)s::bigint[]) AS h (i, e))
  AND EXISTS (SELECT 1 FROM {schema}.executors
              WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s)

-- release_owned --
-- Hand every claim this executor still holds back to the pool (clean shutdown): each
-- (workflow, epoch) it holds, only while its incarnation holds the id. A process resumed
-- after another took its id over releases nothing: the rows under the id are the new
-- holder's, and one released while its run is inside a step would run that step twice.
-- One asked to pause is given back PAUSED.
UPDATE {schema}.workflows
SET status = CASE WHEN paused_at IS NULL THEN 'PENDING' ELSE 'PAUSED' END,
    owner = NULL, lease_expires_at = NULL,
    updated_at = {schema}.current_time()
WHERE owner = %(owner)s AND status = 'RUNNING' AND workflow_id = ANY(%(held)s::text[])
  AND (workflow_id, epoch) IN (
      SELECT i, e FROM unnest(%(held)s::text[], %(epochs)s::bigint[]) AS h (i, e))
  AND EXISTS (SELECT 1 FROM {schema}.executors
              WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s)

-- get_executor --
-- One executor's row, with how long ago it last beat (is that id in use right now?).
SELECT executor_id, hostname, pid, host_key, pid_start, incarnation, heartbeat_at,
    extract(epoch FROM {schema}.current_time() - heartbeat_at) AS heartbeat_age
FROM {schema}.executors WHERE executor_id = %(executor_id)s

-- wake_if_message --
-- After a run suspended to wait on a topic: a message that was sent while the suspension
-- waited for the row (its commit unseen by the suspension's snapshot) wakes it now.
UPDATE {schema}.workflows SET status = 'PENDING', wake_at = NULL,
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s AND status = 'SUSPENDED' AND EXISTS (
    SELECT 1 FROM {schema}.messages
    WHERE workflow_id = %(workflow_id)s AND topic = %(topic)s AND consumed_at IS NULL)

-- join_suspension --
-- A branch of a run whose sibling parked the workflow adds its own wait: the workflow wakes
-- at the earlier of the two times (LEAST ignores a NULL: a wait with no time adds none).
UPDATE {schema}.workflows SET wake_at = LEAST(wake_at, %(wake_at)s::timestamptz)
WHERE workflow_id = %(workflow_id)s AND epoch = %(epoch)s AND status = 'SUSPENDED'

-- wake_if_decided --
-- After a run suspended at a gate: a decision made while the suspension waited for the
-- row wakes it now (the same race as wake_if_message).
UPDATE {schema}.workflows SET status = 'PENDING', wake_at = NULL,
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s AND status = 'SUSPENDED' AND EXISTS (
    SELECT 1 FROM {schema}.approvals
    WHERE workflow_id = %(workflow_id)s AND name = %(name)s AND status <> 'waiting')

-- upsert_executor --
-- Register this executor at start: its incarnation holds the id from now on (an earlier
-- process under the id, if any, is a stale incarnation that touches nothing any more). The
-- time is read once, in VALUES: Citus refuses a function that is not IMMUTABLE in DO
-- UPDATE SET.
INSERT INTO {schema}.executors (executor_id, hostname, pid, started_at, heartbeat_at,
    capabilities, incarnation, host_key, pid_start)
VALUES (%(executor_id)s, %(hostname)s, %(pid)s, {schema}.current_time(),
    {schema}.current_time(), %(capabilities)s, %(incarnation)s, %(host_key)s, %(pid_start)s)
ON CONFLICT (executor_id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at,
    hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, started_at = EXCLUDED.started_at,
    capabilities = EXCLUDED.capabilities, incarnation = EXCLUDED.incarnation,
    host_key = EXCLUDED.host_key, pid_start = EXCLUDED.pid_start

-- heartbeat_executor --
-- Refresh this executor's heartbeat while its incarnation holds the id (registering it
-- again if its row was pruned while it was silent). No row back: another process took
-- the id over, and this one must stop.
INSERT INTO {schema}.executors AS e (executor_id, hostname, pid, started_at, heartbeat_at,
    capabilities, incarnation, host_key, pid_start)
VALUES (%(executor_id)s, %(hostname)s, %(pid)s, {schema}.current_time(),
    {schema}.current_time(), %(capabilities)s, %(incarnation)s, %(host_key)s, %(pid_start)s)
ON CONFLICT (executor_id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
    WHERE e.incarnation = EXCLUDED.incarnation
RETURNING 1 AS held

-- holder_of --
-- Who holds a running workflow's claim, and for how long still: its executor's host, pid
-- and heartbeat age (NULL where its row is gone), and the seconds left on its lease. What
-- a process that starts the same id again is told it waits for.
SELECT w.owner, extract(epoch FROM w.lease_expires_at - {schema}.current_time()) AS lease_left,
    e.hostname, e.pid, extract(epoch FROM {schema}.current_time() - e.heartbeat_at)
        AS heartbeat_age
FROM {schema}.workflows AS w
LEFT JOIN {schema}.executors AS e ON e.executor_id = w.owner
WHERE w.workflow_id = %(workflow_id)s AND w.status = 'RUNNING'

-- executors_on_host --
-- The other executors registered from this host (the same host key: the same kernel and
-- pid namespace), with their pid and its process's start tick: those whose process is
-- gone had their claims cut off by a crash.
SELECT executor_id, pid, incarnation, pid_start
FROM {schema}.executors
WHERE host_key = %(host_key)s AND host_key <> '' AND executor_id <> %(executor_id)s

-- abandon_dead_executor --
-- An executor whose process is gone (seen from its host): expire the leases of what it
-- was running, so they are claimed at once, each claim counting a recovery attempt. Only
-- while its row still names the incarnation found dead (a new process under its id is
-- alive and keeps what it holds).
UPDATE {schema}.workflows
SET owner = 'abandoned:' || owner, lease_expires_at = {schema}.current_time(),
    updated_at = {schema}.current_time()
WHERE owner = %(owner)s AND status = 'RUNNING'
  AND EXISTS (SELECT 1 FROM {schema}.executors
              WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s)

-- forget_dead_executor --
-- The row of an executor whose process is gone, once its claims were handed back (if its
-- incarnation still holds the id).
DELETE FROM {schema}.executors
WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s

-- delete_executor --
-- Forget this executor (clean shutdown), if its incarnation still holds the id.
DELETE FROM {schema}.executors
WHERE executor_id = %(executor_id)s AND incarnation = %(incarnation)s

-- app_migration_lock --
-- Serialize creating the application database's tables (inside that transaction).
SELECT pg_advisory_xact_lock(%(key)s)

-- app_record_transaction --
-- Journal a @transaction step in the application's database, inside the user's transaction.
INSERT INTO {schema}.transaction_outputs (workflow_id, step_seq, step_name, output, error)
VALUES (%(workflow_id)s, %(step_seq)s, %(step_name)s, %(output)s, %(error)s)

-- app_get_transaction --
-- A @transaction step's journal row in the application's database (replay).
SELECT step_name, output, error FROM {schema}.transaction_outputs
WHERE workflow_id = %(workflow_id)s AND step_seq = %(step_seq)s

-- app_refuses_writes --
-- Whether the application database refuses every write (a standby mid-failover, or a
-- database or role read-only by default), as opposed to what a step's code made
-- read-only: its transaction, or its session (reset_val ignores a session's SET).
SELECT pg_is_in_recovery() OR (
    SELECT reset_val::boolean FROM pg_settings WHERE name = 'default_transaction_read_only'
) AS refuses

-- effect_intent --
-- Write an effect ahead of its call, only while this run owns the workflow: the intent and
-- the mark that the call is starting are one write (status pending, first attempt), since
-- nothing happens between them that a crash could tell apart.
INSERT INTO {schema}.effects (workflow_id, step_seq, effect_name, idempotency_key, status,
    params_fingerprint, attempts)
SELECT workflow_id, %(step_seq)s, %(effect_name)s, %(idempotency_key)s, 'pending',
    %(params_fingerprint)s, 1
FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
FOR SHARE
ON CONFLICT DO NOTHING

-- get_effect --
-- An effect's ledger row by its key (resume, and keys shared between positions).
SELECT workflow_id, step_seq, effect_name, idempotency_key, status, params_fingerprint,
    result, error, attempts, reconciled, created_at, updated_at
FROM {schema}.effects
WHERE workflow_id = %(workflow_id)s AND idempotency_key = %(idempotency_key)s

-- effect_pending --
-- Mark an effect's call as started, only while this run owns the workflow.
UPDATE {schema}.effects AS e
SET status = 'pending', attempts = e.attempts + 1, updated_at = {schema}.current_time()
FROM {schema}.workflows AS w
WHERE e.workflow_id = %(workflow_id)s AND e.idempotency_key = %(idempotency_key)s
  AND w.workflow_id = e.workflow_id
  AND (w.epoch, w.status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
  AND e.status IN ('intent', 'pending')

-- settle_effect --
-- Record an effect's outcome and journal it as this step in one statement, fenced by epoch:
-- both or neither (0 rows: this run no longer owns the workflow, or the effect was settled).
WITH owner AS (
    SELECT workflow_id FROM {schema}.workflows
    WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
    FOR SHARE
), settled AS (
    UPDATE {schema}.effects AS e
    SET status = %(status)s, result = %(result)s, error = %(error)s,
        reconciled = %(reconciled)s, updated_at = {schema}.current_time()
    FROM owner
    WHERE e.workflow_id = %(workflow_id)s AND e.workflow_id = owner.workflow_id
      AND e.idempotency_key = %(idempotency_key)s
      AND e.status IN ('intent', 'pending')
    RETURNING e.workflow_id
)
INSERT INTO {schema}.steps (workflow_id, step_seq, step_name, kind, output, error, attempts,
    child_workflow_id, started_at)
SELECT workflow_id, %(step_seq)s, %(step_name)s, 'effect', %(result)s, %(error)s, 1, NULL,
    %(started_at)s
FROM settled

-- claim_undo --
-- Claim the undo of the effect recorded at a ledger position, only while this run owns its
-- workflow: the first workflow to claim it (the one that applied it, or a fork sharing it)
-- undoes it, and every later claim reads that workflow back instead of undoing it again.
-- One row: whether this run owns its workflow, who undoes the effect (NULL when no
-- effect was applied at that position: a later call that found its key applied earlier,
-- whose undo belongs to that earlier call), and whether that workflow's ledger is there at
-- all (a shared effect's ledger pruned or not imported: nobody can tell if it was undone).
-- A claim is never released.
WITH owner AS (
    SELECT workflow_id FROM {schema}.workflows
    WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
    FOR SHARE
), claimed AS (
    UPDATE {schema}.effects AS e
    SET undone_by = coalesce(e.undone_by, owner.workflow_id)
    FROM owner
    WHERE e.workflow_id = %(applied_in)s AND e.step_seq = %(step_seq)s
      AND e.status = 'applied'
    RETURNING e.undone_by
)
SELECT (SELECT count(*) FROM owner) AS owned, (SELECT undone_by FROM claimed) AS undone_by,
    EXISTS (SELECT 1 FROM {schema}.effects WHERE workflow_id = %(applied_in)s) AS ledger

-- list_effects --
-- The effect ledger of one workflow, in call order, with who undid each (claim_undo).
SELECT workflow_id, step_seq, effect_name, idempotency_key, status, params_fingerprint,
    result, error, attempts, reconciled, created_at, updated_at, undone_by
FROM {schema}.effects WHERE workflow_id = %(workflow_id)s ORDER BY step_seq

-- approval_request --
-- Ask for a decision, only while this run owns the workflow.
INSERT INTO {schema}.approvals (workflow_id, name, step_seq, status, payload,
    default_approved, expires_at)
SELECT workflow_id, %(name)s, %(step_seq)s, 'waiting', %(payload)s, %(default_approved)s,
    {schema}.current_time() + make_interval(secs => %(timeout_seconds)s)
FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
FOR SHARE
ON CONFLICT DO NOTHING

-- get_approval --
-- One gate.
SELECT workflow_id, name, step_seq, status, payload, default_approved, comment, decided_by,
    requested_at, expires_at, decided_at
FROM {schema}.approvals WHERE workflow_id = %(workflow_id)s AND name = %(name)s

-- suspend_for_approval --
-- Park the workflow without a process until the gate is decided (unless it already is).
-- A cancel that arrived after the run last looked makes it runnable instead, so that a
-- worker stops it (a parked workflow would wait for a decision nobody will make).
-- A gate with a timeout wakes the workflow when it expires (wake_due, which every claim
-- round sends, the keeper's too): its run then decides it by its default (expire_approval).
-- A pause asked after the run last looked parks it PAUSED instead: nothing wakes it until
-- it is unpaused, and its run then waits for the gate again.
UPDATE {schema}.workflows
SET status = CASE WHEN cancel_reason IS NOT NULL THEN 'PENDING'
                  WHEN paused_at IS NOT NULL THEN 'PAUSED' ELSE 'SUSPENDED' END,
    owner = NULL, lease_expires_at = NULL,
    wake_at = (SELECT expires_at FROM {schema}.approvals
               WHERE workflow_id = %(workflow_id)s AND name = %(name)s),
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.approvals
      WHERE workflow_id = %(workflow_id)s AND name = %(name)s AND status <> 'waiting')

-- decide_approval --
-- The first decision wins; it wakes the suspended workflow in the same statement.
WITH decided AS (
    UPDATE {schema}.approvals
    SET status = %(status)s, comment = %(comment)s, decided_by = %(decided_by)s,
        decided_at = {schema}.current_time()
    WHERE workflow_id = %(workflow_id)s AND name = %(name)s AND status = 'waiting'
    RETURNING workflow_id
), woken AS (
    -- RUNNING too, for the same reason as send_message: a suspend in flight is waited for.
    UPDATE {schema}.workflows
    SET status = CASE WHEN status = 'SUSPENDED' THEN 'PENDING' ELSE status END,
        wake_at = CASE WHEN status = 'SUSPENDED' THEN NULL ELSE wake_at END,
        updated_at = {schema}.current_time()
    WHERE workflow_id = %(workflow_id)s AND workflow_id IN (SELECT workflow_id FROM decided)
      AND status IN ('SUSPENDED', 'RUNNING')
    RETURNING workflow_id
)
SELECT (SELECT count(*) FROM decided) AS decided, (SELECT count(*) FROM woken) AS woken

-- expire_approvals --
-- Decide gates whose timeout passed by their default, and wake their workflows.
WITH expired AS (
    UPDATE {schema}.approvals
    SET status = 'timed_out', decided_at = {schema}.current_time()
    WHERE status = 'waiting' AND expires_at < {schema}.current_time()
    RETURNING workflow_id
)
UPDATE {schema}.workflows
SET status = CASE WHEN status = 'SUSPENDED' THEN 'PENDING' ELSE status END,
    wake_at = CASE WHEN status = 'SUSPENDED' THEN NULL ELSE wake_at END,
    updated_at = {schema}.current_time()
WHERE workflow_id IN (SELECT workflow_id FROM expired) AND status IN ('SUSPENDED', 'RUNNING')

-- expire_approval --
-- Decide one waiting gate by its default if its timeout passed (what expire_approvals does
-- for every gate), for the run that finds it so: the decided gate, or nothing.
UPDATE {schema}.approvals
SET status = 'timed_out', decided_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s AND name = %(name)s AND status = 'waiting'
  AND expires_at <= {schema}.current_time()
RETURNING workflow_id, name, step_seq, status, payload, default_approved, comment,
    decided_by, requested_at, expires_at, decided_at

-- list_approvals --
-- Gates, waiting ones first, optionally of one workflow.
SELECT workflow_id, name, step_seq, status, payload, default_approved, comment, decided_by,
    requested_at, expires_at, decided_at
FROM {schema}.approvals
WHERE (%(workflow_id)s::text IS NULL OR workflow_id = %(workflow_id)s::text)
  AND (%(waiting_only)s = false OR status = 'waiting')
ORDER BY (status = 'waiting') DESC, requested_at
LIMIT %(limit)s

-- approval_inbox --
-- Gates for the console's inbox, waiting ones first, each with its workflow's name, version
-- and status (a join on the distribution column: each shard joins its own rows).
SELECT a.workflow_id, a.name, a.step_seq, a.status, a.payload, a.default_approved, a.comment,
    a.decided_by, a.requested_at, a.expires_at, a.decided_at,
    w.name AS workflow_name, w.version AS workflow_version, w.status AS workflow_status
FROM {schema}.approvals AS a
JOIN {schema}.workflows AS w ON w.workflow_id = a.workflow_id
WHERE (%(waiting_only)s = false OR a.status = 'waiting')
ORDER BY (a.status = 'waiting') DESC, a.requested_at
LIMIT %(limit)s

-- inbox_context --
-- The context of these workflows' gates: each one's latest durable.state and its last
-- `last` other journal rows (numbered per workflow, so each shard numbers its own).
SELECT workflow_id, step_seq, step_name, kind, output, error, attempts, finished_at
FROM (
    SELECT workflow_id, step_seq, step_name, kind, output, error, attempts, finished_at,
        row_number() OVER (PARTITION BY workflow_id, kind = 'state' ORDER BY step_seq DESC)
            AS nth
    FROM {schema}.steps
    WHERE workflow_id = ANY(%(workflow_ids)s::text[])
) AS recent
WHERE nth <= CASE WHEN kind = 'state' THEN 1 ELSE %(last)s END
ORDER BY workflow_id, step_seq

-- record_steps --
-- Journal many steps (of one or many workflows) in one statement; each row is fenced by its
-- own run's epoch, and RETURNING tells which runs' rows were refused. Every array goes in
-- binary: a text array literal is built by escaping every element (a 1 MB JSON payload
-- took seconds to send that way, binary milliseconds; and for small records the escaping
-- was a third of a lazy step's client time).
INSERT INTO {schema}.steps AS j (workflow_id, step_seq, step_name, kind, output, error, attempts,
    started_at)
SELECT w.workflow_id, u.step_seq, u.step_name, u.kind, u.output, u.error, u.attempts,
    u.started_at
FROM unnest(%(workflow_ids)b::text[], %(epochs)b::bigint[], %(seqs)b::int[],
            %(names)b::text[], %(kinds)b::text[], %(outputs)b::text[], %(errors)b::text[],
            %(attempts)b::int[], %(started)b::timestamptz[])
     AS u (workflow_id, epoch, step_seq, step_name, kind, output, error, attempts, started_at)
JOIN {schema}.workflows AS w
  ON w.workflow_id = u.workflow_id
  AND (w.epoch, w.status) IS NOT DISTINCT FROM (u.epoch, 'RUNNING')
ORDER BY u.workflow_id, u.step_seq
FOR SHARE OF w
RETURNING workflow_id

-- record_run_steps --
-- record_steps for the records of one run, named by its workflow id and epoch: on a schema
-- distributed by Citus, which cannot lock rows of many shards in one statement, a batch
-- goes as one of these per run, each on its workflow's shard. RETURNING as record_steps.
INSERT INTO {schema}.steps AS j (workflow_id, step_seq, step_name, kind, output, error, attempts,
    started_at)
SELECT w.workflow_id, u.step_seq, u.step_name, u.kind, u.output, u.error, u.attempts,
    u.started_at
FROM {schema}.workflows AS w,
     unnest(%(seqs)b::int[], %(names)b::text[], %(kinds)b::text[], %(outputs)b::text[],
            %(errors)b::text[], %(attempts)b::int[], %(started)b::timestamptz[])
     AS u (step_seq, step_name, kind, output, error, attempts, started_at)
WHERE w.workflow_id = %(workflow_id)s
  AND (w.epoch, w.status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
ORDER BY u.step_seq
FOR SHARE OF w
RETURNING workflow_id

-- suspend_until --
-- Park the workflow until wake_at (NULL: until woken), unless a message it waits for is here.
-- A cancel that arrived after the run last looked makes it runnable instead (see
-- suspend_for_approval); a pause asked meanwhile parks it PAUSED (nothing wakes it).
UPDATE {schema}.workflows
SET status = CASE WHEN cancel_reason IS NOT NULL THEN 'PENDING'
                  WHEN paused_at IS NOT NULL THEN 'PAUSED' ELSE 'SUSPENDED' END,
    owner = NULL, lease_expires_at = NULL, wake_at = %(wake_at)s,
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
  AND (%(topic)s::text IS NULL OR NOT EXISTS (
      SELECT 1 FROM {schema}.messages
      WHERE workflow_id = %(workflow_id)s AND topic = %(topic)s::text AND consumed_at IS NULL))

-- suspend_for_any --
-- Park the workflow until wake_at (NULL: until woken) while it waits for the first of
-- several things (durable.wait_first, a child's result), unless a message on one of its
-- topics is here or one of its gates is decided. A cancel makes it runnable instead (see
-- suspend_for_approval). A child's end is looked for after it (another workflow's row).
UPDATE {schema}.workflows
SET status = CASE WHEN cancel_reason IS NOT NULL THEN 'PENDING'
                  WHEN paused_at IS NOT NULL THEN 'PAUSED' ELSE 'SUSPENDED' END,
    owner = NULL, lease_expires_at = NULL, wake_at = %(wake_at)s,
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.messages
      WHERE workflow_id = %(workflow_id)s AND topic = ANY(%(topics)s::text[])
        AND consumed_at IS NULL)
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.approvals
      WHERE workflow_id = %(workflow_id)s AND name = ANY(%(gates)s::text[])
        AND status <> 'waiting')

-- wake_if_any --
-- After suspend_for_any (or joining a sibling's suspension): a message on one of its
-- topics or a decision on one of its gates that landed meanwhile wakes it now.
UPDATE {schema}.workflows SET status = 'PENDING', wake_at = NULL,
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s AND status = 'SUSPENDED' AND (EXISTS (
    SELECT 1 FROM {schema}.messages
    WHERE workflow_id = %(workflow_id)s AND topic = ANY(%(topics)s::text[])
      AND consumed_at IS NULL) OR EXISTS (
    SELECT 1 FROM {schema}.approvals
    WHERE workflow_id = %(workflow_id)s AND name = ANY(%(gates)s::text[])
      AND status <> 'waiting'))

-- wake_workflow --
-- Make a suspended workflow runnable: a child that finished wakes its parent (which may
-- wait for it), and a waiting run that sees a child's end after it parked wakes itself.
-- A parent that waits for something else looks, finds nothing, and parks again.
UPDATE {schema}.workflows SET status = 'PENDING', wake_at = NULL,
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s AND status = 'SUSPENDED'

-- wake_due --
-- Make sleeping workflows whose time has come runnable again (only among given ids, when
-- a Citus worker node is down: see due_on_shards).
UPDATE {schema}.workflows
SET status = 'PENDING', wake_at = NULL, updated_at = {schema}.current_time()
WHERE status = 'SUSPENDED'
  AND (wake_at <= {schema}.current_time() OR deadline_at <= {schema}.current_time())
  AND (%(workflow_ids)s::text[] IS NULL OR workflow_id = ANY(%(workflow_ids)s::text[]))

-- due_on_shards --
-- wake_due's candidates while a Citus worker node is down: wake_due over every shard is
-- refused then, so each shard that answers is read by itself (run_command_on_shards runs
-- the command on every shard and reports a shard it cannot reach instead of failing), and
-- wake_due is sent again for the ids found, which touches only their shards. `%%s` is the
-- shard's name. A read on a worker: its clock, not a FakeClock's.
SELECT d.workflow_id FROM run_command_on_shards(
    '{schema}.workflows',
    $cmd$SELECT coalesce(json_agg(workflow_id)::text, '[]') FROM %%s
         WHERE status = 'SUSPENDED'
           AND (wake_at <= {schema}.current_time() OR deadline_at <= {schema}.current_time())
    $cmd$) AS s,
    LATERAL json_array_elements_text(s.result::json) AS d (workflow_id)
WHERE s.success

-- send_message --
-- Deliver a message once per message id, and wake the workflow if it is waiting.
-- A RUNNING row is matched too (and left as it is, but for updated_at): if its run is
-- suspending right now, this waits for that statement's row lock and then sees SUSPENDED
-- and wakes it. Matching SUSPENDED alone would miss a suspend that checked for messages
-- before this one landed. (updated_at is set either way: Citus refuses the time inside a
-- CASE.)
WITH delivered AS (
    INSERT INTO {schema}.messages (workflow_id, message_id, topic, payload, sender_id,
                                   sender_seq)
    VALUES (%(workflow_id)s, %(message_id)s, %(topic)s, %(payload)s, %(sender_id)s,
            %(sender_seq)s)
    ON CONFLICT DO NOTHING
    RETURNING workflow_id
)
UPDATE {schema}.workflows
SET status = CASE WHEN status = 'SUSPENDED' THEN 'PENDING' ELSE status END,
    wake_at = CASE WHEN status = 'SUSPENDED' THEN NULL ELSE wake_at END,
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s AND workflow_id IN (SELECT workflow_id FROM delivered)
  AND status IN ('SUSPENDED', 'RUNNING')

-- consume_message --
-- Consume the oldest message of a topic and journal it as this step, in one statement.
WITH picked AS (
    SELECT workflow_id, message_id FROM {schema}.messages
    WHERE workflow_id = %(workflow_id)s AND topic = %(topic)s AND consumed_at IS NULL
    ORDER BY created_at, message_id
    LIMIT 1
    FOR UPDATE
), owner AS (
    SELECT workflow_id FROM {schema}.workflows
    WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
    FOR SHARE
), consumed AS (
    UPDATE {schema}.messages AS m
    SET consumed_at = {schema}.current_time(), consumed_seq = %(step_seq)s
    FROM picked, owner
    WHERE m.workflow_id = %(workflow_id)s
      AND m.workflow_id = picked.workflow_id AND m.message_id = picked.message_id
    RETURNING m.workflow_id, m.payload
)
INSERT INTO {schema}.steps AS j (workflow_id, step_seq, step_name, kind, output)
SELECT workflow_id, %(step_seq)s, %(step_name)s, 'recv', payload FROM consumed
RETURNING output

-- set_event --
-- Publish an event and journal it as this step in one statement, fenced by epoch.
-- (updated_at: the time its insert would have had, as in upsert_executor.)
WITH journaled AS (
    INSERT INTO {schema}.steps AS j (workflow_id, step_seq, step_name, kind, output)
    SELECT workflow_id, %(step_seq)s, %(step_name)s, 'event', %(value)s
    FROM {schema}.workflows
    WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
    FOR SHARE
    RETURNING workflow_id
)
INSERT INTO {schema}.events (workflow_id, key, value, step_seq)
SELECT workflow_id, %(key)s, %(value)s, %(step_seq)s FROM journaled
ON CONFLICT (workflow_id, key) DO UPDATE
SET value = excluded.value, step_seq = excluded.step_seq, updated_at = excluded.updated_at

-- set_step_event --
-- Publish an event from a step's code, fenced by epoch, under the step's position: no
-- journal row of its own (the step's record is its journal); a step run again sets it again.
INSERT INTO {schema}.events (workflow_id, key, value, step_seq)
SELECT workflow_id, %(key)s, %(value)s, %(step_seq)s FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s
AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
FOR SHARE
ON CONFLICT (workflow_id, key) DO UPDATE
SET value = excluded.value, step_seq = excluded.step_seq, updated_at = excluded.updated_at

-- write_stream --
-- Append a value (or the closing row) to a stream and journal it as this step in one
-- statement, fenced by epoch; readers following the stream are woken by the NOTIFY.
WITH journaled AS (
    INSERT INTO {schema}.steps AS j (workflow_id, step_seq, step_name, kind, output)
    SELECT workflow_id, %(step_seq)s, %(step_name)s, 'stream', %(value)s
    FROM {schema}.workflows
    WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
    FOR SHARE
    RETURNING workflow_id
), appended AS (
    INSERT INTO {schema}.streams (workflow_id, key, "offset", value, closed, step_seq)
    SELECT workflow_id, %(key)s, %(offset)s, %(value)s, %(closed)s, %(step_seq)s
    FROM journaled
    RETURNING workflow_id
)
SELECT pg_notify(%(channel)s, workflow_id) FROM appended

-- read_stream --
-- A stream's rows from an offset on, in order (at most `limit`).
SELECT "offset", value, closed FROM {schema}.streams
WHERE workflow_id = %(workflow_id)s AND key = %(key)s AND "offset" >= %(offset)s
ORDER BY "offset" LIMIT %(limit)s

-- list_events --
-- Every event a workflow published, with its latest value.
SELECT key, value, step_seq, updated_at FROM {schema}.events
WHERE workflow_id = %(workflow_id)s ORDER BY key

-- get_event --
-- The latest value of a workflow's event.
SELECT value FROM {schema}.events WHERE workflow_id = %(workflow_id)s AND key = %(key)s

-- upsert_schedule --
-- Store a schedule, or update its definition; its pause state and last tick are kept.
-- (updated_at: the time its insert would have had, as in upsert_executor.)
INSERT INTO {schema}.schedules (schedule_name, workflow_name, workflow_version, cron,
    timezone, catch_up)
VALUES (%(schedule_name)s, %(workflow_name)s, %(workflow_version)s, %(cron)s, %(timezone)s,
    %(catch_up)s)
ON CONFLICT (schedule_name) DO UPDATE
SET workflow_name = excluded.workflow_name, workflow_version = excluded.workflow_version,
    cron = excluded.cron, timezone = excluded.timezone, catch_up = excluded.catch_up,
    updated_at = excluded.updated_at

-- due_schedules --
-- Unpaused schedules of workflows this executor can run.
SELECT schedule_name, workflow_name, workflow_version FROM {schema}.schedules
WHERE NOT paused AND (workflow_name, coalesce(workflow_version, '')) IN (
    SELECT n, v FROM unnest(%(names)s::text[], %(versions)s::text[]) AS t (n, v))
ORDER BY schedule_name

-- lock_schedule --
-- Take one schedule to fire it (skipped if another worker holds it), inside a transaction.
SELECT cron, timezone, catch_up, last_tick FROM {schema}.schedules
WHERE schedule_name = %(schedule_name)s AND NOT paused
FOR UPDATE SKIP LOCKED

-- set_schedule_mark --
-- Record the latest tick fired or skipped.
UPDATE {schema}.schedules SET last_tick = %(last_tick)s, updated_at = {schema}.current_time()
WHERE schedule_name = %(schedule_name)s

-- list_schedules --
-- Every stored schedule.
SELECT schedule_name, workflow_name, workflow_version, cron, timezone, catch_up, paused,
    last_tick, created_at, updated_at
FROM {schema}.schedules ORDER BY schedule_name

-- delete_schedule --
-- Forget a schedule: no tick of it fires any more. The workflows its ticks started are
-- workflows like any other and stay; a firing under way holds the row (lock_schedule), and
-- the delete waits for its commit.
DELETE FROM {schema}.schedules WHERE schedule_name = %(schedule_name)s
RETURNING schedule_name

-- set_schedule_paused --
-- Pause or resume a schedule.
UPDATE {schema}.schedules SET paused = %(paused)s, updated_at = {schema}.current_time()
WHERE schedule_name = %(schedule_name)s
RETURNING schedule_name

-- enqueue_workflow --
-- Put a workflow on a queue; nothing is returned if the id exists (a dedup key is taken
-- first, in the same transaction: take_dedup).
INSERT INTO {schema}.workflows (workflow_id, name, version, status, inputs, serializer,
    durability, parent_id, parent_step_seq, timeout_seconds, budget_id, queue_name, priority,
    dedup_key, available_at, trace_context, journal_version, partition_key,
    max_recovery_attempts, attributes)
VALUES (%(workflow_id)s, %(name)s, %(version)s, 'ENQUEUED', %(inputs)s, %(serializer)s,
    %(durability)s, %(parent_id)s, %(parent_step_seq)s, %(timeout_seconds)s, %(budget_id)s,
    %(queue_name)s,
    %(priority)s, %(dedup_key)s,
    CASE WHEN %(delay_seconds)s::float8 > 0
         THEN {schema}.current_time() + make_interval(secs => %(delay_seconds)s::float8) END,
    %(trace_context)s, %(journal_version)s, %(partition_key)s, %(max_recovery_attempts)s,
    %(attributes)s::jsonb)
ON CONFLICT (workflow_id) DO NOTHING
RETURNING epoch

-- take_dedup --
-- Take a queue's dedup key for a workflow, inside the enqueue's transaction. A key already
-- held is not taken here: its row is locked (a no-op update) and its holder returned, so
-- two enqueues with one key are decided one after the other.
INSERT INTO {schema}.queue_dedup AS d (queue_name, dedup_key, workflow_id)
VALUES (%(queue_name)s, %(dedup_key)s, %(workflow_id)s)
ON CONFLICT (queue_name, dedup_key) DO UPDATE SET workflow_id = d.workflow_id
RETURNING workflow_id

-- dedup_holder_active --
-- Whether the workflow holding a dedup key is still queued or unfinished (a statement of
-- its own after take_dedup's lock, so that it sees the holder's latest committed row).
SELECT EXISTS (
    SELECT 1 FROM {schema}.workflows WHERE workflow_id = %(holder)s
      AND status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED', 'PAUSED')
) AS active

-- pass_dedup --
-- Hand a released dedup key (its holder finished) to the workflow now enqueued with it.
UPDATE {schema}.queue_dedup SET workflow_id = %(workflow_id)s
WHERE queue_name = %(queue_name)s AND dedup_key = %(dedup_key)s

-- push_debounced --
-- Debounce an entry again (in the debounce's transaction, after take_dedup): replace its
-- inputs and push its start back to `period` seconds from now (never past `max_wait` after
-- its first debounce), only while no worker has taken it; nothing is returned once it
-- started, and the debounce then makes the key's next entry.
UPDATE {schema}.workflows
SET inputs = %(inputs)s, serializer = %(serializer)s, updated_at = {schema}.current_time(),
    -- LEAST ignores the NULL bound of a NULL max_wait (Citus takes no CASE here).
    available_at = least({schema}.current_time() + make_interval(secs => %(period)s::float8),
                         {schema}.plus_seconds(created_at, %(max_wait)s::float8))
WHERE workflow_id = %(workflow_id)s AND name = %(name)s AND status = 'ENQUEUED'
RETURNING workflow_id

-- lock_queue --
-- Serialize dequeuing of one queue (inside the dequeue's transaction); false: another
-- worker is dequeuing it right now, so this one skips it this round.
SELECT pg_try_advisory_xact_lock(hashtextextended(%(lock_key)s, 0)) AS locked

-- dequeue --
-- Take as many entries as the queue's limits allow, oldest (or lowest priority) first,
-- and start them owned by this executor (none once another incarnation holds its id).
-- NULL limits are unlimited.
WITH allowed AS (
    SELECT greatest(0, least(
        %(limit)s,
        coalesce(%(concurrency)s - (
            SELECT count(*) FROM {schema}.workflows
            WHERE queue_name = %(queue_name)s AND dequeued_at IS NOT NULL
              AND status IN ('PENDING', 'RUNNING', 'SUSPENDED')), %(limit)s),
        coalesce(%(worker_concurrency)s - (
            SELECT count(*) FROM {schema}.workflows
            WHERE queue_name = %(queue_name)s AND dequeued_at IS NOT NULL
              AND status = 'RUNNING' AND owner = %(owner)s), %(limit)s),
        coalesce(%(rate_count)s - (
            SELECT count(*) FROM {schema}.workflows
            WHERE queue_name = %(queue_name)s AND dequeued_at > {schema}.current_time()
                  - make_interval(secs => %(rate_period)s::float8)), %(limit)s)
    )) AS n
), picked AS (
    SELECT workflow_id FROM {schema}.workflows
    WHERE status = 'ENQUEUED' AND queue_name = %(queue_name)s
      AND (available_at IS NULL OR available_at <= {schema}.current_time())
      AND (%(workflow_ids)s::text[] IS NULL OR workflow_id = ANY(%(workflow_ids)s::text[]))
      AND (name, coalesce(version, '')) IN (
          SELECT n, v FROM unnest(%(names)s::text[], %(versions)s::text[]) AS t (n, v))
      AND journal_version <= %(journal_version)s
      AND EXISTS (SELECT 1 FROM {schema}.executors
                  WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s)
    ORDER BY CASE WHEN %(by_priority)s THEN priority ELSE 0 END, created_at, workflow_id
    LIMIT (SELECT n FROM allowed)
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.workflows AS w
SET status = 'RUNNING', owner = %(owner)s, epoch = w.epoch + 1,
    lease_expires_at = {schema}.current_time() + make_interval(secs => %(lease_seconds)s),
    dequeued_at = {schema}.current_time(), updated_at = {schema}.current_time(),
    deadline_at = {schema}.plus_seconds({schema}.current_time(), w.timeout_seconds)
FROM picked
WHERE w.workflow_id = picked.workflow_id
RETURNING w.workflow_id, w.name, w.version, w.status, w.inputs, w.serializer, w.durability,
    w.epoch, w.deadline_at, w.cancel_reason, w.budget_id, w.trace_context, w.parent_id

-- queue_allowance --
-- How many entries one dequeue of a queue may take now, within its limits (dequeue's
-- `allowed`): dequeue_cas's LIMIT, counted by a statement of its own since Citus takes no
-- subquery in a LIMIT. Run under the queue's lock, in the dequeue's transaction.
SELECT greatest(0, least(
    %(limit)s,
    coalesce(%(concurrency)s - (
        SELECT count(*) FROM {schema}.workflows
        WHERE queue_name = %(queue_name)s AND dequeued_at IS NOT NULL
          AND status IN ('PENDING', 'RUNNING', 'SUSPENDED')), %(limit)s),
    coalesce(%(worker_concurrency)s - (
        SELECT count(*) FROM {schema}.workflows
        WHERE queue_name = %(queue_name)s AND dequeued_at IS NOT NULL
          AND status = 'RUNNING' AND owner = %(owner)s), %(limit)s),
    coalesce(%(rate_count)s - (
        SELECT count(*) FROM {schema}.workflows
        WHERE queue_name = %(queue_name)s AND dequeued_at > {schema}.current_time()
              - make_interval(secs => %(rate_period)s::float8)), %(limit)s)
)) AS n

-- dequeue_cas --
-- dequeue for distributed PostgreSQL: the entries are read without a row lock and taken
-- only if still ENQUEUED (compare-and-set); the queue's advisory lock still orders the
-- dequeuers of one queue, so its limits hold. %(allowed)s: what queue_allowance said.
WITH picked AS (
    SELECT workflow_id FROM {schema}.workflows
    WHERE status = 'ENQUEUED' AND queue_name = %(queue_name)s
      AND (available_at IS NULL OR available_at <= {schema}.current_time())
      AND (%(workflow_ids)s::text[] IS NULL OR workflow_id = ANY(%(workflow_ids)s::text[]))
      AND (name, coalesce(version, '')) IN (
          SELECT n, v FROM unnest(%(names)s::text[], %(versions)s::text[]) AS t (n, v))
      AND journal_version <= %(journal_version)s
      AND EXISTS (SELECT 1 FROM {schema}.executors
                  WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s)
    ORDER BY CASE WHEN %(by_priority)s THEN priority ELSE 0 END, created_at, workflow_id
    LIMIT %(allowed)s
)
UPDATE {schema}.workflows AS w
SET status = 'RUNNING', owner = %(owner)s, epoch = w.epoch + 1,
    lease_expires_at = {schema}.current_time() + make_interval(secs => %(lease_seconds)s),
    dequeued_at = {schema}.current_time(), updated_at = {schema}.current_time(),
    deadline_at = {schema}.plus_seconds({schema}.current_time(), w.timeout_seconds)
FROM picked
WHERE w.workflow_id = picked.workflow_id AND w.status = 'ENQUEUED'
  -- (Given ids, on Citus: the shards of those ids only.)
  AND (%(workflow_ids)s::text[] IS NULL OR w.workflow_id = ANY(%(workflow_ids)s::text[]))
  -- ...and still of a version this worker has (an operator may have moved it meanwhile).
  AND (w.name, coalesce(w.version, '')) IN (
      SELECT n, v FROM unnest(%(names)s::text[], %(versions)s::text[]) AS t (n, v))
RETURNING w.workflow_id, w.name, w.version, w.status, w.inputs, w.serializer, w.durability,
    w.epoch, w.deadline_at, w.cancel_reason, w.budget_id, w.trace_context, w.parent_id

-- dequeue_partitioned --
-- dequeue for a queue with partition limits (partition_concurrency, partition_rate_limit):
-- in queue order, entries whose partition holds fewer than its limit of slots and started
-- fewer than its rate's count within the rate's period (counting, in order, those this
-- dequeue takes), up to %(allowed)s (what queue_allowance said: the queue's own limits). An
-- entry without a partition key counts only against the queue's limits, and the entries of
-- a full partition, or of one over its rate, are passed over, not waited for, so they hold
-- back no other partition. NULL partition limits are unlimited. Read without a row lock and
-- taken only if still ENQUEUED (compare-and-set, as dequeue_cas), so that one statement
-- serves one server and Citus; the queue's advisory lock orders the dequeuers of the queue,
-- so the slots and starts counted are the slots held and the starts made.
WITH held AS (
    SELECT partition_key, count(*) AS n FROM {schema}.workflows
    WHERE queue_name = %(queue_name)s AND partition_key IS NOT NULL
      AND status IN ('PENDING', 'RUNNING', 'SUSPENDED') AND dequeued_at IS NOT NULL
    GROUP BY partition_key
), started AS (
    -- Each partition's starts within the rate's period (none counted without a rate).
    SELECT partition_key, count(*) AS n FROM {schema}.workflows
    WHERE queue_name = %(queue_name)s AND partition_key IS NOT NULL
      AND %(partition_rate_count)s::int IS NOT NULL
      AND dequeued_at > {schema}.current_time()
          - make_interval(secs => %(partition_rate_period)s::float8)
    GROUP BY partition_key
), ranked AS (
    SELECT workflow_id, partition_key, created_at,
        CASE WHEN %(by_priority)s THEN priority ELSE 0 END AS queue_rank,
        row_number() OVER (PARTITION BY partition_key ORDER BY
            CASE WHEN %(by_priority)s THEN priority ELSE 0 END, created_at, workflow_id) AS place
    FROM {schema}.workflows
    WHERE status = 'ENQUEUED' AND queue_name = %(queue_name)s
      AND (available_at IS NULL OR available_at <= {schema}.current_time())
      AND (%(workflow_ids)s::text[] IS NULL OR workflow_id = ANY(%(workflow_ids)s::text[]))
      AND (name, coalesce(version, '')) IN (
          SELECT n, v FROM unnest(%(names)s::text[], %(versions)s::text[]) AS t (n, v))
      AND journal_version <= %(journal_version)s
      AND EXISTS (SELECT 1 FROM {schema}.executors
                  WHERE executor_id = %(owner)s AND incarnation = %(incarnation)s)
), picked AS (
    SELECT r.workflow_id FROM ranked AS r
    LEFT JOIN held AS h USING (partition_key)
    LEFT JOIN started AS s USING (partition_key)
    WHERE r.partition_key IS NULL
       OR ((%(partition_concurrency)s::int IS NULL
            OR r.place + coalesce(h.n, 0) <= %(partition_concurrency)s::int)
           AND (%(partition_rate_count)s::int IS NULL
                OR r.place + coalesce(s.n, 0) <= %(partition_rate_count)s::int))
    ORDER BY r.queue_rank, r.created_at, r.workflow_id
    LIMIT %(allowed)s
)
UPDATE {schema}.workflows AS w
SET status = 'RUNNING', owner = %(owner)s, epoch = w.epoch + 1,
    lease_expires_at = {schema}.current_time() + make_interval(secs => %(lease_seconds)s),
    dequeued_at = {schema}.current_time(), updated_at = {schema}.current_time(),
    deadline_at = {schema}.plus_seconds({schema}.current_time(), w.timeout_seconds)
FROM picked
WHERE w.workflow_id = picked.workflow_id AND w.status = 'ENQUEUED'
  -- (Given ids, on Citus: the shards of those ids only.)
  AND (%(workflow_ids)s::text[] IS NULL OR w.workflow_id = ANY(%(workflow_ids)s::text[]))
  -- ...and still of a version this worker has (an operator may have moved it meanwhile).
  AND (w.name, coalesce(w.version, '')) IN (
      SELECT n, v FROM unnest(%(names)s::text[], %(versions)s::text[]) AS t (n, v))
RETURNING w.workflow_id, w.name, w.version, w.status, w.inputs, w.serializer, w.durability,
    w.epoch, w.deadline_at, w.cancel_reason, w.budget_id, w.trace_context, w.parent_id

-- ensure_budget --
-- Create a workflow tree's budget from its code's limits at first start (kept afterwards,
-- so a raise survives restarts), and read it.
-- Charges already recorded under this id (a fork's copied steps) are its starting spend:
-- those of the root itself, since no other workflow of the tree has run yet.
WITH created AS (
    INSERT INTO {schema}.budgets (budget_id, limit_dollars, limit_tokens, limit_steps,
        limit_seconds, spent_dollars, spent_tokens, spent_steps)
    SELECT %(budget_id)s, %(limit_dollars)s, %(limit_tokens)s, %(limit_steps)s,
        %(limit_seconds)s, coalesce(sum(dollars), 0), coalesce(sum(tokens), 0),
        coalesce(sum(steps), 0)
    FROM {schema}.charges WHERE workflow_id = %(budget_id)s AND budget_id = %(budget_id)s
    ON CONFLICT (budget_id) DO NOTHING
    RETURNING budget_id, limit_dollars, limit_tokens, limit_steps, limit_seconds,
        spent_dollars, spent_tokens, spent_steps, created_at AS started_at
)
SELECT * FROM created
UNION ALL
SELECT budget_id, limit_dollars, limit_tokens, limit_steps, limit_seconds, spent_dollars,
    spent_tokens, spent_steps, created_at AS started_at
FROM {schema}.budgets WHERE budget_id = %(budget_id)s AND NOT EXISTS (SELECT 1 FROM created)

-- get_budget --
-- One budget's limits and what has been spent.
SELECT budget_id, limit_dollars, limit_tokens, limit_steps, limit_seconds, spent_dollars,
    spent_tokens, spent_steps, created_at AS started_at
FROM {schema}.budgets WHERE budget_id = %(budget_id)s

-- raise_budget --
-- Add to a budget's limits (NULL adds nothing; an unlimited dimension stays unlimited).
UPDATE {schema}.budgets
SET limit_dollars = limit_dollars + coalesce(%(dollars)s::numeric, 0),
    limit_tokens = limit_tokens + coalesce(%(tokens)s::bigint, 0),
    limit_steps = limit_steps + coalesce(%(steps)s::integer, 0),
    limit_seconds = limit_seconds + coalesce(%(seconds)s::numeric, 0),
    updated_at = {schema}.current_time()
WHERE budget_id = %(budget_id)s
RETURNING budget_id, limit_dollars, limit_tokens, limit_steps, limit_seconds, spent_dollars,
    spent_tokens, spent_steps, created_at AS started_at

-- denied_budget_gate --
-- A denied budget gate at a step's position (`budget@<n>` or `budget@<n>:cap<k>`): a
-- resumed run does not run that step again.
SELECT name, comment FROM {schema}.approvals
WHERE workflow_id = %(workflow_id)s AND status = 'denied'
    AND (name = %(name)s OR name LIKE %(name)s || ':%%')
LIMIT 1

-- budget_of --
-- The budget a workflow draws from.
SELECT budget_id FROM {schema}.workflows WHERE workflow_id = %(workflow_id)s

-- waiting_budget_gates --
-- Budget gates still waiting in the workflows that draw from one budget.
SELECT a.workflow_id, a.name FROM {schema}.approvals AS a
JOIN {schema}.workflows AS w ON w.workflow_id = a.workflow_id
WHERE w.budget_id = %(budget_id)s AND a.status = 'waiting' AND a.name LIKE 'budget@%%'

-- record_charged_step --
-- Journal a step together with what it spent (and, for a tool, its call record) in one
-- fenced statement; `written` is 0 if this run no longer owns the workflow.
WITH journaled AS (
    INSERT INTO {schema}.steps AS j (workflow_id, step_seq, step_name, kind, output, error, attempts,
        started_at)
    SELECT workflow_id, %(step_seq)s, %(step_name)s, %(kind)s, %(output)s, %(error)s,
        %(attempts)s, %(started_at)s
    FROM {schema}.workflows
    WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
    FOR SHARE
    RETURNING workflow_id
), charged AS (
    INSERT INTO {schema}.charges (workflow_id, step_seq, budget_id, dollars, tokens, steps)
    SELECT workflow_id, %(step_seq)s, %(budget_id)s, %(dollars)s, %(tokens)s, %(steps)s
    FROM journaled
    RETURNING budget_id, dollars, tokens, steps
), tool AS (
    INSERT INTO {schema}.tool_calls (workflow_id, step_seq, tool_name, arguments, latency_ms)
    SELECT workflow_id, %(step_seq)s, %(step_name)s, %(arguments)s, %(latency_ms)s
    FROM journaled WHERE %(arguments)s::text IS NOT NULL
), spent AS (
    UPDATE {schema}.budgets AS b
    SET spent_dollars = b.spent_dollars + c.dollars, spent_tokens = b.spent_tokens + c.tokens,
        spent_steps = b.spent_steps + c.steps, updated_at = {schema}.current_time()
    FROM charged AS c
    WHERE b.budget_id = %(budget_id)s AND b.budget_id = c.budget_id
    RETURNING b.budget_id, b.limit_dollars, b.limit_tokens, b.limit_steps, b.limit_seconds,
        b.spent_dollars, b.spent_tokens, b.spent_steps, b.created_at AS started_at
)
SELECT (SELECT count(*) FROM journaled) AS written, s.*
FROM (SELECT 1) AS one LEFT JOIN spent AS s ON true

-- add_late_charge --
-- Add what an attempt that no longer counts spent to its budget, once per key (unfenced).
WITH charged AS (
    INSERT INTO {schema}.late_charges (workflow_id, charge_key, step_seq, budget_id, dollars,
        tokens)
    VALUES (%(workflow_id)s, %(charge_key)s, %(step_seq)s, %(budget_id)s, %(dollars)s,
        %(tokens)s)
    ON CONFLICT (workflow_id, charge_key) DO NOTHING
    RETURNING budget_id, dollars, tokens
), spent AS (
    UPDATE {schema}.budgets AS b
    SET spent_dollars = b.spent_dollars + c.dollars, spent_tokens = b.spent_tokens + c.tokens,
        updated_at = {schema}.current_time()
    FROM charged AS c
    WHERE b.budget_id = %(budget_id)s AND b.budget_id = c.budget_id
    RETURNING b.budget_id, b.limit_dollars, b.limit_tokens, b.limit_steps, b.limit_seconds,
        b.spent_dollars, b.spent_tokens, b.spent_steps, b.created_at AS started_at
)
SELECT * FROM spent

-- list_charges --
-- The charges of every workflow drawing from one budget, in order.
SELECT c.workflow_id, c.step_seq, s.step_name, c.dollars, c.tokens, c.steps, c.created_at
FROM {schema}.charges AS c
JOIN {schema}.steps AS s ON s.workflow_id = c.workflow_id AND s.step_seq = c.step_seq
WHERE c.budget_id = %(budget_id)s OR c.workflow_id = %(budget_id)s
ORDER BY c.created_at, c.workflow_id, c.step_seq

-- list_tool_calls --
-- An agent's tool calls, in order, with their results from the journal.
SELECT t.step_seq, t.tool_name, t.arguments, s.output, s.error, t.latency_ms,
    coalesce(c.dollars, 0) AS dollars, coalesce(c.tokens, 0) AS tokens
FROM {schema}.tool_calls AS t
JOIN {schema}.steps AS s ON s.workflow_id = t.workflow_id AND s.step_seq = t.step_seq
LEFT JOIN {schema}.charges AS c ON c.workflow_id = t.workflow_id AND c.step_seq = t.step_seq
WHERE t.workflow_id = %(workflow_id)s ORDER BY t.step_seq

-- latest_state --
-- A workflow's working state as of a step position (the latest update before it).
SELECT step_seq, output FROM {schema}.steps
WHERE workflow_id = %(workflow_id)s AND kind = 'state' AND step_seq < %(before_seq)s
ORDER BY step_seq DESC LIMIT 1

-- list_turns --
-- A workflow's conversation, one journal row per turn.
SELECT step_seq, output FROM {schema}.steps
WHERE workflow_id = %(workflow_id)s AND kind = 'turn' ORDER BY step_seq

-- prune_finished --
-- Delete up to `batch` finished workflows older than the cutoff with their journals (steps
-- explicitly, since a journal row is fenced rather than referenced; messages, events,
-- approvals and charges cascade); the effect ledger stays. One row: what was deleted.
-- The candidates are read without a row lock (Citus takes none over many shards); each is
-- deleted only if still finished as of its own row lock (one resumed meanwhile is kept,
-- with its journal), and two pruners at once delete each workflow once.
WITH doomed AS (
    SELECT workflow_id FROM {schema}.workflows
    WHERE finished_at < {schema}.current_time() - make_interval(secs => %(older_than)s)
      AND status IN ('SUCCESS', 'ERROR', 'CANCELLED', 'COMPENSATED', 'COMPENSATION_FAILED')
    ORDER BY finished_at
    LIMIT %(batch)s
), gone AS (
    DELETE FROM {schema}.workflows AS w USING doomed AS d
    WHERE w.workflow_id = d.workflow_id
      AND w.status IN ('SUCCESS', 'ERROR', 'CANCELLED', 'COMPENSATED', 'COMPENSATION_FAILED')
    RETURNING w.workflow_id
), journal AS (
    DELETE FROM {schema}.steps AS s USING gone AS g
    WHERE s.workflow_id = g.workflow_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS workflows, (SELECT count(*) FROM journal) AS steps

-- prune_effects --
-- Delete up to `batch` effect-ledger rows older than the cutoff whose workflow is gone or
-- finished, but for those a live fork shares. (Read without a row lock, as in prune_finished: a settled effect of a finished
-- workflow is not written again.)
WITH shared AS (
    -- Rows a live fork shares (its journal names them, steps.applied_in): its undo claims
    -- them, so they stay while it may fail, whatever their own workflow's age.
    SELECT s.applied_in, s.step_seq FROM {schema}.steps AS s
    JOIN {schema}.workflows AS w ON w.workflow_id = s.workflow_id
    WHERE s.applied_in IS NOT NULL
      AND w.status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED',
                       'COMPENSATING', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')
), doomed AS (
    SELECT e.workflow_id, e.step_seq FROM {schema}.effects AS e
    WHERE e.updated_at < {schema}.current_time() - make_interval(secs => %(older_than)s)
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.workflows AS w WHERE w.workflow_id = e.workflow_id
            AND w.status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED',
                             'COMPENSATING', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED'))
      AND (e.workflow_id, e.step_seq) NOT IN (SELECT applied_in, step_seq FROM shared)
    ORDER BY e.updated_at
    LIMIT %(batch)s
)
DELETE FROM {schema}.effects AS e USING doomed AS d
WHERE e.workflow_id = d.workflow_id AND e.step_seq = d.step_seq

-- count_prunable --
-- What prune would delete now (for --dry-run).
SELECT
    (SELECT count(*) FROM {schema}.workflows
     WHERE finished_at < {schema}.current_time() - make_interval(secs => %(finished_after)s)
       AND status IN ('SUCCESS', 'ERROR', 'CANCELLED', 'COMPENSATED', 'COMPENSATION_FAILED'))
        AS workflows,
    (SELECT count(*) FROM {schema}.steps AS s JOIN {schema}.workflows AS w USING (workflow_id)
     WHERE w.finished_at < {schema}.current_time() - make_interval(secs => %(finished_after)s)
       AND w.status IN ('SUCCESS', 'ERROR', 'CANCELLED', 'COMPENSATED', 'COMPENSATION_FAILED'))
        AS steps,
    (SELECT count(*) FROM {schema}.effects AS e
     WHERE e.updated_at < {schema}.current_time() - make_interval(secs => %(effects_after)s)
       AND NOT EXISTS (
           SELECT 1 FROM {schema}.workflows AS w WHERE w.workflow_id = e.workflow_id
             AND w.status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED',
                              'COMPENSATING', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED'))
       AND (e.workflow_id, e.step_seq) NOT IN (  -- as prune_effects: a live fork's shared
           SELECT s.applied_in, s.step_seq FROM {schema}.steps AS s
           JOIN {schema}.workflows AS w ON w.workflow_id = s.workflow_id
           WHERE s.applied_in IS NOT NULL
             AND w.status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED',
                              'COMPENSATING', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')))
        AS effects

-- metrics_workflows --
-- Prometheus' scrape-time counts (durable/_host/metrics.py) of the workflows not finished and
-- the dead-lettered ones, through workflows_unfinished_idx (finished rows are not read):
-- by status and name, how many hold a lease that ran out and how long the oldest went
-- unchanged; queued entries also by queue (partitions summed), with how long the oldest
-- entry that may start has waited.
SELECT status, name,
    CASE WHEN status = 'ENQUEUED' THEN queue_name END AS queue_name,
    count(*) AS n,
    count(*) FILTER (WHERE status = 'RUNNING' AND lease_expires_at < {schema}.current_time())
        AS lease_expired,
    extract(epoch FROM {schema}.current_time() - min(updated_at))::float8 AS oldest_change,
    extract(epoch FROM {schema}.current_time() - min(greatest(created_at, available_at))
        FILTER (WHERE status = 'ENQUEUED' AND (available_at IS NULL
                OR available_at <= {schema}.current_time())))::float8 AS oldest_ready
FROM {schema}.workflows
WHERE status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED', 'COMPENSATING',
    'MAX_RECOVERY_ATTEMPTS_EXCEEDED')
GROUP BY status, name, CASE WHEN status = 'ENQUEUED' THEN queue_name END

-- metrics_executors --
-- Prometheus' scrape-time heartbeat age of each registered executor (durable/_host/metrics.py).
SELECT executor_id,
    extract(epoch FROM {schema}.current_time() - heartbeat_at)::float8 AS heartbeat_age
FROM {schema}.executors

-- metrics_registered --
-- A worker's readiness (/readyz): the database answers and still names this process's
-- incarnation as the holder of its executor id.
SELECT 1 AS registered FROM {schema}.executors
WHERE executor_id = %(executor_id)s AND incarnation = %(incarnation)s

-- insert_audit --
-- Record an operator action's rows, in the transaction of the action itself.
INSERT INTO {schema}.audit_log (workflow_id, audit_id, at, actor, action, subject, detail)
SELECT t.workflow_id, t.audit_id, {schema}.current_time(), %(actor)s, t.action, t.subject,
       t.detail
FROM unnest(%(workflow_ids)s::text[], %(audit_ids)s::uuid[], %(actions)s::text[],
            %(subjects)s::text[], %(details)s::text[])
    AS t (workflow_id, audit_id, action, subject, detail)

-- audit_of_workflow --
-- The operator actions on one workflow ('' for the schedules'), newest first (keyset
-- `before`: the (at, audit_id) of the last row of the page before).
SELECT workflow_id, audit_id, at, actor, action, subject, detail FROM {schema}.audit_log
WHERE workflow_id = %(workflow_id)s
  AND (%(action)s::text IS NULL OR action = %(action)s::text)
  AND (%(before_at)s::timestamptz IS NULL
       OR (at, audit_id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY at DESC, audit_id DESC
LIMIT %(limit)s

-- list_audit --
-- Every operator action, newest first (an action's name filters; keyset `before` as in
-- audit_of_workflow).
SELECT workflow_id, audit_id, at, actor, action, subject, detail FROM {schema}.audit_log
WHERE (%(action)s::text IS NULL OR action = %(action)s::text)
  AND (%(before_at)s::timestamptz IS NULL
       OR (at, audit_id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY at DESC, audit_id DESC
LIMIT %(limit)s

-- begin_step_attempt --
-- A watched attempt of a long step begins (0027): its row names this run's epoch and the
-- attempt, heartbeat now, and keeps the last details; only while this run owns the
-- workflow, and never over a later attempt's row. No row: this run lost the workflow.
INSERT INTO {schema}.step_attempts AS a (workflow_id, step_seq, epoch, attempt,
    heartbeat_timeout, heartbeat_at)
SELECT workflow_id, %(step_seq)s, epoch, %(attempt)s, %(heartbeat_timeout)s,
    {schema}.current_time()
FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
FOR SHARE
ON CONFLICT (workflow_id, step_seq) DO UPDATE
SET epoch = EXCLUDED.epoch, attempt = EXCLUDED.attempt,
    heartbeat_timeout = EXCLUDED.heartbeat_timeout, heartbeat_at = EXCLUDED.heartbeat_at
WHERE (a.epoch, a.attempt) <= (EXCLUDED.epoch, EXCLUDED.attempt)
RETURNING details

-- heartbeat_step --
-- A step's attempt reports progress: heartbeat now, with its details; fenced as
-- begin_step_attempt (an attempt given up, or a run that lost the workflow, writes nothing).
-- Whether its own attempt's row is watched is left as begin and end set it (a heartbeat
-- written late, in the background, does not watch an attempt that ended).
INSERT INTO {schema}.step_attempts AS a (workflow_id, step_seq, epoch, attempt,
    heartbeat_timeout, heartbeat_at, details)
SELECT workflow_id, %(step_seq)s, epoch, %(attempt)s, %(heartbeat_timeout)s,
    {schema}.current_time(), %(details)s
FROM {schema}.workflows
WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
FOR SHARE
ON CONFLICT (workflow_id, step_seq) DO UPDATE
SET heartbeat_timeout = CASE WHEN (a.epoch, a.attempt) = (EXCLUDED.epoch, EXCLUDED.attempt)
                             THEN a.heartbeat_timeout ELSE EXCLUDED.heartbeat_timeout END,
    epoch = EXCLUDED.epoch, attempt = EXCLUDED.attempt, heartbeat_at = EXCLUDED.heartbeat_at,
    details = EXCLUDED.details
WHERE (a.epoch, a.attempt) <= (EXCLUDED.epoch, EXCLUDED.attempt)
RETURNING 1 AS written

-- last_step_heartbeat --
-- The details of a step's last heartbeat (by an earlier attempt, or an earlier run's).
SELECT details FROM {schema}.step_attempts
WHERE workflow_id = %(workflow_id)s AND step_seq = %(step_seq)s

-- end_step_attempt --
-- A watched attempt ended (returned or raised): no longer watched by the sweep.
UPDATE {schema}.step_attempts
SET heartbeat_timeout = NULL
WHERE workflow_id = %(workflow_id)s AND step_seq = %(step_seq)s
    AND epoch = %(epoch)s AND attempt = %(attempt)s

-- expire_stuck_steps --
-- A live worker's sweep: a running workflow whose watched step attempt (of its current
-- epoch, not yet journaled) has not heartbeat for `slack` times its heartbeat_timeout is
-- stuck, its process frozen or cut off (its own lease may still run long): expire the
-- lease now and stop the heartbeat renewing it, so a worker claims it at once (epoch
-- bumped: the stuck attempt's heartbeats and record are refused) and runs the step again.
UPDATE {schema}.workflows AS w
SET owner = 'abandoned:' || w.owner, lease_expires_at = {schema}.current_time(),
    updated_at = {schema}.current_time()
FROM {schema}.step_attempts AS a
WHERE a.workflow_id = w.workflow_id AND a.epoch = w.epoch AND w.status = 'RUNNING'
    AND a.heartbeat_timeout IS NOT NULL
    AND {schema}.plus_seconds(a.heartbeat_at, a.heartbeat_timeout * %(slack)s)
        < {schema}.current_time()
    AND w.lease_expires_at >= {schema}.current_time()
    AND w.owner NOT LIKE 'abandoned:%%'
    AND NOT EXISTS (SELECT 1 FROM {schema}.steps AS s
                    WHERE s.workflow_id = a.workflow_id AND s.step_seq = a.step_seq)
RETURNING w.workflow_id

-- export_step_attempts --
-- Export: the last heartbeat of these workflows' long steps (where their next attempt resumes).
SELECT to_jsonb(t)::text AS data FROM {schema}.step_attempts AS t
WHERE t.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY t.workflow_id, t.step_seq

-- import_step_attempts --
-- Import: the last heartbeat of long steps.
INSERT INTO {schema}.step_attempts
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.step_attempts, %(rows)s::jsonb)

-- export_late_charges --
-- Export: what given-up attempts of these workflows spent apart from their steps' records.
SELECT to_jsonb(t)::text AS data FROM {schema}.late_charges AS t
WHERE t.workflow_id = ANY(%(workflow_ids)s::text[]) ORDER BY t.workflow_id, t.charge_key

-- import_late_charges --
-- Import: what given-up attempts spent apart from their steps' records.
INSERT INTO {schema}.late_charges
SELECT * FROM jsonb_populate_recordset(NULL::{schema}.late_charges, %(rows)s::jsonb)

-- ---------------------------------------------------------------------------------------
-- Callback URLs (durable.callback_url, durable/_client/callbacks.py): a token's row, by its hash.
-- On Citus the table is sharded by token_hash in a group of its own: each statement here
-- names one token, so it is routed to one shard.
-- ---------------------------------------------------------------------------------------

-- insert_callback --
-- Store a new callback URL's token by its sha256 (the run journals the call next).
INSERT INTO {schema}.callbacks (token_hash, workflow_id, kind, target, expires_at)
VALUES (%(token_hash)s, %(workflow_id)s, %(kind)s, %(target)s, %(expires_at)s)
ON CONFLICT DO NOTHING

-- use_callback --
-- Spend a callback: once, before it expires; what it delivers commits in this transaction.
UPDATE {schema}.callbacks
SET used_at = {schema}.current_time(), outcome = %(outcome)s
WHERE token_hash = %(token_hash)s AND used_at IS NULL
  AND expires_at > {schema}.current_time()
RETURNING token_hash, workflow_id, kind, target, used_at

-- find_callback --
-- A callback by its token's hash: spent (with the first outcome), or expired.
SELECT token_hash, workflow_id, kind, target, used_at, outcome,
       expires_at <= {schema}.current_time() AS expired
FROM {schema}.callbacks WHERE token_hash = %(token_hash)s

-- prune_callbacks --
-- Retention: delete up to `batch` callbacks expired longer ago than the cutoff (a POST to
-- one answered 410; now 404), whatever became of their workflows.
WITH doomed AS (
    SELECT token_hash FROM {schema}.callbacks
    WHERE expires_at < {schema}.current_time() - make_interval(secs => %(older_than)s)
    ORDER BY expires_at
    LIMIT %(batch)s
)
DELETE FROM {schema}.callbacks AS c USING doomed AS d
WHERE c.token_hash = d.token_hash

-- Attributes (durable/_run/attributes.py) -----------------------------------------------

-- set_attributes --
-- Merge attributes into a workflow's (durable.set_attributes) and journal the call as this
-- step, in one statement fenced by epoch: a replay finds the call and writes nothing.
WITH changed AS (
    UPDATE {schema}.workflows SET attributes = attributes || %(attributes)s::jsonb
    WHERE workflow_id = %(workflow_id)s
    AND (epoch, status) IS NOT DISTINCT FROM (%(epoch)s::bigint, 'RUNNING')
    RETURNING workflow_id
)
INSERT INTO {schema}.steps (workflow_id, step_seq, step_name, kind, output)
SELECT workflow_id, %(step_seq)s, %(step_name)s, 'step', %(output)s FROM changed

-- == Pause and unpause: operator actions (migration 0039) ==

-- pause_workflow --
-- Hold a workflow where it is. One that waits (queued, runnable, suspended), or whose
-- owner's lease lapsed (its epoch bumped to fence a late runner), becomes PAUSED at once;
-- a running one is asked (paused_at) and gives itself back PAUSED at its next step
-- boundary. Nothing is returned for a finished, already paused or already asked one, nor
-- for one being cancelled (its cancel goes first). Decided from the row as read and
-- written only if it is unchanged (compare-and-set, as cancel_workflows: Citus takes no
-- clock in an UPDATE's CASE); no row: it changed meanwhile, or there is nothing to do.
WITH target AS (
    SELECT w.workflow_id, w.epoch, w.status, {schema}.current_time() AS now,
        CASE WHEN w.status = 'RUNNING' AND w.lease_expires_at >= {schema}.current_time()
                 THEN 'RUNNING'
             ELSE 'PAUSED' END AS next_status
    FROM {schema}.workflows AS w
    WHERE w.workflow_id = %(workflow_id)s
      AND w.status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED')
      AND w.cancel_requested_at IS NULL
      AND (w.paused_at IS NULL
           OR (w.status = 'RUNNING' AND w.lease_expires_at < {schema}.current_time()))
)
UPDATE {schema}.workflows AS w
SET status = t.next_status,
    epoch = CASE WHEN t.status = 'RUNNING' AND t.next_status = 'PAUSED' THEN w.epoch + 1
                 ELSE w.epoch END,
    owner = CASE WHEN t.next_status = 'RUNNING' THEN w.owner END,
    lease_expires_at = CASE WHEN t.next_status = 'RUNNING' THEN w.lease_expires_at END,
    paused_at = coalesce(w.paused_at, t.now),
    updated_at = t.now
FROM target AS t
WHERE w.workflow_id = %(workflow_id)s AND w.workflow_id = t.workflow_id
  AND w.epoch = t.epoch AND w.status = t.status
RETURNING w.workflow_id, w.status, w.epoch

-- unpause_workflow --
-- Let a paused workflow go on where it stopped: ENQUEUED when it never left its queue (it
-- waits for a slot again), else PENDING (any worker claims it and replays its journal; a
-- wait not over yet suspends it again). A running one that was asked to pause and has not
-- stopped yet keeps running: the request is withdrawn. Nothing is returned when no pause
-- was asked.
UPDATE {schema}.workflows
SET status = CASE WHEN status = 'RUNNING' THEN 'RUNNING'
                  WHEN queue_name IS NOT NULL AND dequeued_at IS NULL THEN 'ENQUEUED'
                  ELSE 'PENDING' END,
    paused_at = NULL,
    updated_at = {schema}.current_time()
WHERE workflow_id = %(workflow_id)s AND paused_at IS NOT NULL
  AND status IN ('PAUSED', 'RUNNING')
RETURNING workflow_id, status

-- Messages before the run exists (send(..., before_start=True), start_or_send): 0035.
-- ---------------------------------------------------------------------------------------

-- keep_early_message --
-- send(before_start=True) to an id no workflow has: keep the message for the run that
-- starts under it (once per message id). `found`: a workflow has the id after all (nothing
-- kept: the sender delivers it with send_message). A workflow created meanwhile, unseen by
-- this snapshot, is found by the sender's adopt_early_messages after this commits.
WITH target AS (
    SELECT workflow_id FROM {schema}.workflows WHERE workflow_id = %(workflow_id)s
), kept AS (
    INSERT INTO {schema}.early_messages (workflow_id, message_id, topic, payload)
    SELECT %(workflow_id)s, %(message_id)s, %(topic)s, %(payload)s
    WHERE NOT EXISTS (SELECT 1 FROM target)
    ON CONFLICT DO NOTHING
    RETURNING workflow_id
)
SELECT (SELECT count(*) FROM target) AS found, (SELECT count(*) FROM kept) AS kept

-- adopt_early_messages --
-- Once the workflow exists: move the messages kept for its id into `messages`, each with
-- its created_at (so they come before anything sent since, in the order they were sent);
-- a message id already there is not delivered again. Run by the run before its first
-- receive and by a sender after it kept one: whichever looks last sees the other's commit,
-- so none is left behind. `wake`: the sender's move wakes a waiting workflow, as
-- send_message does (the run's own does not: it is running).
WITH target AS (
    SELECT workflow_id FROM {schema}.workflows WHERE workflow_id = %(workflow_id)s
), moved AS (
    DELETE FROM {schema}.early_messages AS e
    WHERE e.workflow_id = %(workflow_id)s AND EXISTS (SELECT 1 FROM target)
    RETURNING e.workflow_id, e.message_id, e.topic, e.payload, e.created_at
), delivered AS (
    INSERT INTO {schema}.messages (workflow_id, message_id, topic, payload, created_at)
    SELECT workflow_id, message_id, topic, payload, created_at FROM moved
    ON CONFLICT DO NOTHING
    RETURNING workflow_id
), woken AS (
    UPDATE {schema}.workflows
    SET status = CASE WHEN status = 'SUSPENDED' THEN 'PENDING' ELSE status END,
        wake_at = CASE WHEN status = 'SUSPENDED' THEN NULL ELSE wake_at END,
        updated_at = {schema}.current_time()
    WHERE workflow_id = %(workflow_id)s AND %(wake)s
      AND workflow_id IN (SELECT workflow_id FROM delivered)
      AND status IN ('SUSPENDED', 'RUNNING')
    RETURNING workflow_id
)
SELECT (SELECT count(*) FROM delivered) AS delivered, (SELECT count(*) FROM woken) AS woken

-- prune_early_messages --
-- Retention: delete up to `batch` messages kept for an id no workflow took within the
-- cutoff (RetentionPolicy.early_messages_after), oldest first.
WITH doomed AS (
    SELECT workflow_id, message_id FROM {schema}.early_messages
    WHERE created_at < {schema}.current_time() - make_interval(secs => %(older_than)s)
    ORDER BY created_at
    LIMIT %(batch)s
)
DELETE FROM {schema}.early_messages AS e USING doomed AS d
WHERE e.workflow_id = d.workflow_id AND e.message_id = d.message_id

-- count_early_messages --
-- What prune_early_messages would delete now (for --dry-run).
SELECT count(*) AS messages FROM {schema}.early_messages
WHERE created_at < {schema}.current_time() - make_interval(secs => %(older_than)s)

-- ==== Starts, enqueues and messages in the application's transaction (conn=), the outbox ====

-- database_identity --
-- Which server and database a connection is on: a connection given as conn= is compared
-- with the system database's, to tell whether its transaction can hold durable's rows.
-- (The server's own port setting, not the connection's: a socket and TCP agree on it.)
SELECT current_database() AS dbname, current_setting('port') AS port,
    pg_postmaster_start_time() AS started

-- app_outbox_put --
-- A start, an enqueue or a message, in the application's transaction, in the outbox of an
-- application database that is not the system database (a worker drains it there). The id
-- names the workflow (or the message): the same start twice is one row.
INSERT INTO {schema}.outbox (outbox_id, statement, params)
VALUES (%(outbox_id)s, %(statement)s, %(params)s)
ON CONFLICT (outbox_id) DO NOTHING

-- app_outbox_take --
-- The oldest outbox rows, locked for this drainer until its transaction ends (another
-- drainer skips them).
SELECT outbox_id, statement, params FROM {schema}.outbox
ORDER BY created_at, outbox_id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- app_outbox_done --
-- Rows whose writes are committed in the system database leave the outbox.
DELETE FROM {schema}.outbox WHERE outbox_id = ANY(%(outbox_ids)s::text[])

-- ---------------------------------------------------------------------------------------------
-- Triggers: the PostgreSQL outbox (durable.triggers.PostgresOutbox; migration 0038)
-- ---------------------------------------------------------------------------------------------

-- outbox_write --
-- An application's message, written on its own connection inside its transaction.
INSERT INTO {schema}.trigger_outbox (topic, message_id, body, headers)
VALUES (%(topic)s, %(message_id)s, %(body)s::jsonb, %(headers)s::jsonb)

-- outbox_notify --
-- Wake the consumers of a topic when the transaction that wrote to it commits.
SELECT pg_notify(%(channel)s, %(topic)s)

-- outbox_take --
-- Take up to `limit` waiting messages of a topic, the oldest first: each hidden for
-- `lease_seconds` (a consumer that dies leaves it to the next after that), its delivery counted.
UPDATE {schema}.trigger_outbox AS o
SET visible_at = {schema}.current_time() + make_interval(secs => %(lease_seconds)s::float8),
    deliveries = o.deliveries + 1
FROM (
    SELECT message_id FROM {schema}.trigger_outbox
    WHERE topic = %(topic)s AND rejected IS NULL AND visible_at <= {schema}.current_time()
    ORDER BY created_at, message_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS due
WHERE o.topic = %(topic)s AND o.message_id = due.message_id
RETURNING o.message_id, o.body::text AS body, o.headers::text AS headers, o.deliveries

-- outbox_ack --
-- The message's workflow row is committed: the message is done.
DELETE FROM {schema}.trigger_outbox WHERE topic = %(topic)s AND message_id = %(message_id)s

-- outbox_retry --
-- The start failed for now: the message is taken again after `delay_seconds`.
UPDATE {schema}.trigger_outbox
SET visible_at = {schema}.current_time() + make_interval(secs => %(delay_seconds)s::float8)
WHERE topic = %(topic)s AND message_id = %(message_id)s

-- outbox_reject --
-- The message can never start a workflow: kept with why, never taken again.
UPDATE {schema}.trigger_outbox SET rejected = %(reason)s
WHERE topic = %(topic)s AND message_id = %(message_id)s

-- ---------------------------------------------------------------------------------------
-- The console: a hard terminate, the list sorted by another column, running steps.

-- terminate_workflows --
-- End these workflows (one and its descendants, found by children_of) CANCELLED at once,
-- whatever they were doing: no compensation runs, pending effects stay as they are, and the
-- epoch is bumped, so a runner that still holds one has every later write refused (its step
-- in flight is not stopped: its record is refused). Compare-and-set per row, as
-- cancel_workflows; `settled` false: the row changed meanwhile, ask again.
WITH targets AS (
    SELECT w.workflow_id, w.epoch, w.status, {schema}.current_time() AS now
    FROM {schema}.workflows AS w
    WHERE w.workflow_id = ANY(%(workflow_ids)s::text[])
      AND w.status IN ('ENQUEUED', 'PENDING', 'RUNNING', 'SUSPENDED', 'PAUSED')
), terminated AS (
    UPDATE {schema}.workflows AS w
    SET status = 'CANCELLED',
        cancel_requested_at = coalesce(w.cancel_requested_at, t.now),
        cancel_reason = coalesce(w.cancel_reason, %(reason)s),
        paused_at = NULL, owner = NULL, lease_expires_at = NULL, wake_at = NULL,
        epoch = w.epoch + 1, error = %(error)s, finished_at = t.now, updated_at = t.now
    FROM targets AS t
    WHERE w.workflow_id = ANY(%(workflow_ids)s::text[])
      AND w.workflow_id = t.workflow_id AND w.epoch = t.epoch AND w.status = t.status
    RETURNING w.workflow_id, w.status, w.epoch
)
SELECT workflow_id, status, epoch, true AS settled FROM terminated
UNION ALL
SELECT workflow_id, status, epoch, false FROM targets
WHERE workflow_id NOT IN (SELECT workflow_id FROM terminated)

-- list_workflows_sorted --
-- list_workflows' filters, sorted by `sort` (created, updated, status or name; then the
-- newest first) in `descending` order, a page at `offset` rows: the console's column
-- sorting. Sorted so, no index serves the order; the default order (list_workflows) walks one.
WITH live AS MATERIALIZED (
    SELECT DISTINCT c ->> 0 AS name, coalesce(c ->> 1, '') AS version
    FROM {schema}.executors e, jsonb_array_elements(e.capabilities) AS c
    WHERE e.heartbeat_at > {schema}.current_time() - make_interval(secs => %(stale_seconds)s)
)
SELECT workflow_id, name, version, status, inputs, output, error, serializer, durability,
    parent_id, parent_step_seq, owner, epoch, lease_expires_at, recovery_attempts,
    created_at, updated_at, finished_at, journal_version, attributes,
    (w.status IN ('PENDING', 'ENQUEUED')
     OR (w.status = 'RUNNING' AND w.lease_expires_at < {schema}.current_time()))
    AND NOT EXISTS (
        SELECT 1 FROM live
        WHERE live.name = w.name AND live.version = coalesce(w.version, ''))
    AS waiting_for_worker
FROM {schema}.workflows AS w
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(id_from)s::text IS NULL OR (workflow_id COLLATE "C" >= %(id_from)s::text
       AND workflow_id COLLATE "C" < %(id_to)s::text AND starts_with(workflow_id, %(id_from)s)))
  AND (%(created_from)s::timestamptz IS NULL OR created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR created_at < %(created_to)s::timestamptz)
  AND (%(top_level)s = false OR parent_id IS NULL)
  AND (%(search)s::text IS NULL OR strpos(lower(inputs), %(search)s::text) > 0
       OR strpos(lower(output), %(search)s::text) > 0)
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(version)s::text IS NULL OR coalesce(version, '') = %(version)s::text)
  AND (%(parent_id)s::text IS NULL OR parent_id = %(parent_id)s::text)
  AND (%(attr_eq)s::jsonb IS NULL OR attributes @> %(attr_eq)s::jsonb)
  AND (%(attr_path)s::jsonpath IS NULL OR coalesce(jsonb_path_match(attributes,
       %(attr_path)s::jsonpath, %(attr_vars)s::jsonb, true), false))
ORDER BY
    CASE WHEN %(sort)s::text = 'updated' AND %(descending)s::boolean THEN updated_at END DESC,
    CASE WHEN %(sort)s::text = 'updated' AND NOT %(descending)s::boolean THEN updated_at END ASC,
    CASE WHEN %(sort)s::text = 'status' AND %(descending)s::boolean THEN status END DESC,
    CASE WHEN %(sort)s::text = 'status' AND NOT %(descending)s::boolean THEN status END ASC,
    CASE WHEN %(sort)s::text = 'name' AND %(descending)s::boolean THEN name END DESC,
    CASE WHEN %(sort)s::text = 'name' AND NOT %(descending)s::boolean THEN name END ASC,
    CASE WHEN %(sort)s::text = 'created' AND NOT %(descending)s::boolean THEN created_at END ASC,
    created_at DESC, workflow_id DESC
OFFSET %(offset)s
LIMIT %(limit)s

-- running_steps --
-- Where each of these running workflows is: the position of the call under way (one past
-- its last journaled call), that last call's name, and since when the run has been at it
-- (the last call's end, else the workflow's creation). A watched attempt (0027, a step with
-- a heartbeat_timeout) of the current run is that call, with its last heartbeat. A plain
-- step writes nothing until it is journaled, so its own name is not known before then.
SELECT w.workflow_id,
    coalesce(a.step_seq, coalesce(s.step_seq + 1, 0)) AS step_seq,
    s.step_name AS previous_step,
    coalesce(s.finished_at, w.created_at) AS since,
    a.heartbeat_at, a.attempt
FROM {schema}.workflows AS w
LEFT JOIN LATERAL (
    SELECT step_seq, step_name, finished_at FROM {schema}.steps
    WHERE workflow_id = w.workflow_id ORDER BY step_seq DESC LIMIT 1
) AS s ON true
LEFT JOIN LATERAL (
    SELECT step_seq, heartbeat_at, attempt FROM {schema}.step_attempts
    WHERE workflow_id = w.workflow_id AND epoch = w.epoch AND heartbeat_timeout IS NOT NULL
    ORDER BY step_seq DESC LIMIT 1
) AS a ON true
WHERE w.workflow_id = ANY(%(workflow_ids)s::text[]) AND w.status = 'RUNNING'

-- shard_keys --
-- One workflow id for each shard of `workflows` (any id that would live there: the key a
-- call of runnable_on_shard or enqueued_on_shard names its shard by), with the node group
-- that holds it, in the order of the shards' hash ranges.
SELECT s.shardid, p.groupid,
    (SELECT 's' || g FROM generate_series(1, 1000000) AS g
     WHERE worker_hash('s' || g) BETWEEN s.shardminvalue::int AND s.shardmaxvalue::int
     LIMIT 1) AS shard_key
FROM pg_dist_shard AS s
JOIN pg_dist_placement AS p ON p.shardid = s.shardid
WHERE s.logicalrelid = '{schema}.workflows'::regclass
ORDER BY s.shardminvalue::int

-- runnable_on_shard --
-- claim_batch_cas's candidates and wake_due's sleepers in ONE shard (see 0040): a call
-- routed to the node that holds it. The claims are then taken by their ids.
SELECT workflow_id, due FROM {schema}.runnable_on_shard(%(shard_key)s::text,
    %(at_time)s::timestamptz, %(names)s::text[], %(versions)s::text[],
    %(journal_version)s::int, %(queues)s::text[], %(limit)s::int)

-- enqueued_on_shard --
-- dequeue_cas's candidates in ONE shard (see 0040), in the queue's order there.
SELECT workflow_id FROM {schema}.enqueued_on_shard(%(shard_key)s::text,
    %(at_time)s::timestamptz, %(queue_name)s::text, %(names)s::text[], %(versions)s::text[],
    %(journal_version)s::int, %(by_priority)s::boolean, %(limit)s::int)

-- make_queue_lock --
-- The queue's row of queue_locks (lock_queue_row), made on a queue's first dequeue.
INSERT INTO {schema}.queue_locks (queue_name) VALUES (%(queue_name)s)
ON CONFLICT (queue_name) DO NOTHING

-- lock_queue_row --
-- lock_queue on Citus (inside the dequeue's transaction, after make_queue_lock): the
-- queue's row of queue_locks, on one shard, the same from every node (an advisory lock is
-- one node's, and workers may connect to different nodes). No row: another worker is
-- dequeuing the queue right now, so this one skips it this round.
SELECT queue_name FROM {schema}.queue_locks WHERE queue_name = %(queue_name)s
FOR UPDATE SKIP LOCKED
