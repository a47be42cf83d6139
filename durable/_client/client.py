"""The Client: everything that reads or changes stored workflows, and nothing that runs them.

A Client is a connection pool and the named statements: no threads, no heartbeat, no
executor row (while a stream reader or watcher waits, one thread reads the client's one
LISTEN connection: see `_io/listen.py`). It records workflows for workers to run (submit,
enqueue), hands out handles, reads journals and ledgers, and carries every operator
action (cancel, resume, fork, send, decide, raise a budget, schedules, prune). The CLI is
a Client; so is any process that only starts or inspects work; and an Engine holds one
(`engine.client`, on the engine's own pool: see `_host/engine.py`).

The Client is written by concern: its settings and connection (`_client/client_base.py`),
the reads (`_client/reading.py`), the messages to and from running workflows
(`_client/messages.py`), and here what records workflows and the operator actions.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from durable._base import labels
from durable._base.clock import Clock
from durable._base.models import (
    ApprovalStatus,
    Budget,
    Ledger,
    StepKind,
    WorkflowInfo,
    WorkflowStatus,
    dollars_exact,
)
from durable._base.names import check_name, check_text, check_version
from durable._base.registry import Registry
from durable._base.urls import redact
from durable._client import audit, starts, transfer
from durable._client.bulk import BulkProgress, BulkResult
from durable._client.bulk import run as bulk_run
from durable._client.client_base import libpq_url
from durable._client.client_calls import ClientCalls
from durable._client.client_calls_async import AsyncClientCalls
from durable._client.outbox import Outbox
from durable._client.schedules import Schedule, backfill, trigger
from durable._core import encode_error
from durable._io.config import Config
from durable._io.retention import PruneProgress, PruneReport, RetentionPolicy, prune
from durable._io.systemdb import is_unique_violation
from durable._run import tracing
from durable._run.attributes import call_attributes, pop_attributes
from durable._run.decorators import workflow_call, workflow_def
from durable._run.filter import RunFilter
from durable._run.handles import WorkflowHandle
from durable._run.start_options import start_method
from durable._run.timeouts import call_timeout, pop_timeout
from durable.errors import (
    ApprovalConflictError,
    ConfigurationError,
    ForkAfterUndoError,
    InvalidBudgetError,
    UnknownApprovalError,
    UnknownScheduleError,
    WorkflowCancelledError,
    WorkflowNotFoundError,
    WorkflowNotMovableError,
    WorkflowNotPausableError,
    WorkflowNotResumableError,
)
from durable.serialization import Serializer

logger = logging.getLogger("durable.client")

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")


# A workflow resume cannot run again: its undo already ran (or failed half-way).
_NOT_RESUMABLE = frozenset({WorkflowStatus.COMPENSATED, WorkflowStatus.COMPENSATION_FAILED})


def _compensated(info: WorkflowInfo) -> bool:
    """Whether a CANCELLED workflow's compensations ran (its stored error says so)."""
    if info.status is not WorkflowStatus.CANCELLED or not info.error:
        return False
    try:
        return json.loads(info.error).get("compensated") is True
    except (ValueError, AttributeError):
        return False


class Client(ClientCalls, AsyncClientCalls):
    """Reads and changes stored workflows in one PostgreSQL system database; runs nothing:
    no heartbeat, no worker loop, no executor row (only its connection pool's threads, and
    its listener's while a stream reader or watcher waits).

    Arguments (all optional):
      database_url: libpq URL of the system database. Default: DURABLE_DATABASE_URL, else
        the embedded server (`pip install 'durable-pg[embedded]'`).
      schema: schema of durable's tables (default "durable").
      migrate: apply migrations when connecting (default False for a Client: the workers
        own the schema; True for an Engine).
      serializer: value serializer (default JSONSerializer; PickleSerializer is opt-in).
      max_payload_bytes: largest serialized input/output stored (default 2,000,000).
      connect_timeout: seconds to wait for the database (default 15).
      response_timeout: seconds a statement waits for an answer (default 5; 0: for ever).
      clock: where time is read (default the system clock, or DURABLE_FAKE_CLOCK's).
      outbox_url: the application database whose outbox takes `conn=` writes made on it
        (see Engine; `drain_outbox` moves them into the system database).
      actor: who the operator actions are recorded as (the audit log; default "library
        <user>@<host>"; `with client.acting_as(...)` for some calls).

    Use it as a context manager (`with durable.Client(url) as client:`) or call
    `connect()` and `close()`.
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        schema: str = "durable",
        migrate: bool = False,
        serializer: Serializer | None = None,
        max_payload_bytes: int = 2_000_000,
        connect_timeout: float = 15.0,
        clock: Clock | None = None,
        listen: bool | None = None,
        actor: str | None = None,
        response_timeout: float | None = None,
        outbox_url: str | None = None,
    ) -> None:
        self.actor = actor
        self._configure(
            Config.resolve(
                database_url=database_url,
                schema=schema,
                migrate=migrate,
                serializer=serializer,
                max_payload_bytes=max_payload_bytes,
                connect_timeout=connect_timeout,
                clock=clock,
                listen=listen,
                response_timeout=response_timeout,
                outbox_url=outbox_url,
            )
        )

    @classmethod
    def _from_config(cls, config: Config) -> Client:
        """A client with settings already resolved (an Engine's own client)."""
        client = cls.__new__(cls)
        client._configure(config)
        return client

    # -- recording workflows -----------------------------------------------------------

    @start_method
    def submit(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle:
        """Record `fn(*args, **kwargs)` as runnable for any worker (`durable worker`), without
        running it here. `workflow_id=` chooses the id: ids are idempotency keys, so an
        existing id returns its handle. `timeout=` (popped from kwargs) replaces the
        decorator's timeout; `attributes=` (popped too) records the run's attributes.
        Inside a workflow it is journaled as a child, as enqueue's is. `conn=`: in the
        application's transaction (see Engine.start)."""
        if conn is not None:
            return self.handle(starts.start_in(self, conn, fn, args, kwargs, workflow_id))
        check_name("workflow_id", workflow_id, optional=True)  # "" is refused, not "none"
        defn, call_args = workflow_call(fn, args)
        timeout = pop_timeout(kwargs)
        attributes = pop_attributes(kwargs)

        def create(chosen: str, parent: tuple[str, int] | None) -> None:
            with call_timeout(timeout), call_attributes(attributes):
                inputs = self.inputs.encode(defn, call_args, kwargs)
                params = self.inputs.row(defn, chosen, inputs, parent, self.default_durability)
            row = self.db.fetch_one("insert_workflow_pending", params)
            starts.stored(self, defn, chosen, row, inputs)

        chosen, _ = starts.start_placed(defn, workflow_id, create)
        return self.handle(chosen)

    # -- the outbox (conn= on another database) --------------------------------------

    def install_outbox(self, url: str | None = None) -> None:
        """Create the outbox in the application database at `url` (default: this client's
        `outbox_url=`), where a start, enqueue or send with `conn=` on that database is
        written (`durable outbox install --url ...` does the same). Idempotent."""
        url = url or self.config.outbox_url
        if not url:
            raise ConfigurationError("install_outbox: give the application database's URL")
        self.db.install_outbox(libpq_url(url))

    def drain_outbox(self, limit: int = 100) -> int:
        """Move up to `limit` rows of the outbox at `outbox_url=` into the system database
        (a worker does this each round); how many moved. Each row names its workflow or
        message, so a drain repeated after a crash starts and sends nothing twice."""
        url = self.config.outbox_url
        if not url:
            raise ConfigurationError("drain_outbox: give the client or engine `outbox_url=`")
        with self._outbox_lock:
            outbox: Outbox | None = self._outbox
            if outbox is None or outbox.db is not self.db:
                outbox = self._outbox = Outbox(
                    self.db, url, self.notify_work, self.config.crash_points
                )
        return outbox.drain(limit)

    _outbox_lock = threading.Lock()

    def _drain_outbox_round(self) -> None:
        """drain_outbox for the worker loop: an outbox that fails (not installed yet, its
        database down) is said, and the loop's claims go on."""
        try:
            self.drain_outbox()
        except Exception as exc:
            logger.warning(
                "could not drain the outbox at %s: %s",
                redact(self.config.outbox_url or ""),
                exc,
                extra={"event": "outbox_failed"},
            )

    # -- operator actions --------------------------------------------------------------

    def cancel(self, workflow_id: str, reason: str = "cancelled") -> WorkflowStatus:
        """Cancel a workflow and every workflow it started (its descendants).

        Cooperative: a running workflow stops at its next step or wait (the step in flight
        finishes and is journaled), runs its compensations in reverse and ends CANCELLED. A
        started workflow that is not running (suspended, waiting for a worker) is made
        runnable so that a worker does the same; one that never started is CANCELLED at
        once. A cancelled workflow is never recovered. Returns the workflow's status after
        the request (RUNNING or PENDING while it stops; already-finished ones unchanged).
        """
        check_name("workflow_id", workflow_id)
        check_text("reason", reason)
        asked = self.cancel_tree(workflow_id, reason)
        if workflow_id in asked:
            return asked[workflow_id]
        return self.get_workflow(workflow_id).status  # WorkflowNotFoundError if none

    def cancel_tree(self, workflow_id: str, reason: str) -> dict[str, WorkflowStatus]:
        """Ask a workflow and its unfinished descendants to stop; {id: status after}."""
        check_name("workflow_id", workflow_id)
        check_text("reason", reason)
        error = encode_error(WorkflowCancelledError(workflow_id, reason))
        rows = audit.cancel_tree(self, workflow_id, reason, error)
        asked = {r["workflow_id"]: WorkflowStatus(r["status"]) for r in rows}
        running = [
            (r["workflow_id"], int(r["epoch"]))
            for r in rows
            if asked[r["workflow_id"]] is WorkflowStatus.RUNNING
        ]
        if running:
            if self.on_cancel_requested is not None:
                self.on_cancel_requested(running, reason)
        if any(status is WorkflowStatus.PENDING for status in asked.values()):
            self.notify_work(workflow_id)
        return asked

    def terminate(self, workflow_id: str, reason: str = "terminated") -> WorkflowStatus:
        """End a workflow and its unfinished descendants CANCELLED now, without their
        cooperation: unlike cancel, no compensation runs and pending effects are left as
        they are (an effect in flight may have happened). A running owner is fenced (the
        epoch is bumped): its step in flight is not stopped, but nothing it writes after is
        kept. Audited as "terminate". Returns the workflow's status after (finished ones
        unchanged). Resume can run it again from its journal, as any cancelled run."""
        check_name("workflow_id", workflow_id)
        check_text("reason", reason)
        error = encode_error(WorkflowCancelledError(workflow_id, reason))
        ended = audit.cancel_tree(self, workflow_id, reason, error, terminate=True)
        info = self.get_workflow(workflow_id)  # WorkflowNotFoundError if none
        if ended and info.parent_id is not None:  # a parent that waits for it sees its end
            self.db.execute("wake_workflow", {"workflow_id": info.parent_id})
            self.notify_work(info.parent_id)
        return info.status

    def resume(self, workflow_id: str, *, version: str | None = None) -> WorkflowHandle:
        """Run a stopped workflow again from its journal: completed steps replay, the rest
        run. Resumes a CANCELLED, ERROR or MAX_RECOVERY_ATTEMPTS_EXCEEDED workflow; any
        worker with its code picks it up. Returns its handle.

        A workflow that is still going is left as it is, and so is one that succeeded
        (nothing runs, nothing is written: its handle gives its result, as DBOS's
        resume_workflow does). One whose undo ran raises WorkflowNotResumableError (fork
        it instead): COMPENSATED, COMPENSATION_FAILED, and CANCELLED after its
        compensations ran, since a replay would redo its effects on top of their undo and
        undo them again under new keys. One whose journal is of a newer format than this
        release reads raises JournalVersionError, and is left as it is.

        `version` moves the workflow to other code on purpose (None, the default, keeps
        its version; "" moves it to no version, since a declared version is never empty):
        a stopped one is resumed under that version, and one that waits (PENDING,
        ENQUEUED, SUSPENDED, or RUNNING with its lease expired, its worker gone) is
        recorded under it and stays or becomes runnable, keeping its place in its queue,
        its wake-up and a cancel asked of it. Only workers of the new version claim it,
        and they replay its journal as any recovery does: code whose calls do not match
        it stops the run with NondeterminismError (the run ends ERROR, the journal
        untouched). A run whose lease is live and a workflow that succeeded raise
        WorkflowNotMovableError, and nothing changes. See docs/versioning.md."""
        self._resume(workflow_id, version=version)
        return self.handle(workflow_id)

    resume_workflow = resume

    def pause(self, workflow_id: str) -> WorkflowStatus:
        """Hold a workflow where it is until `unpause`: no worker claims, wakes or dequeues
        it meanwhile, and it holds no worker or queue slot.

        A running workflow stops at its next step boundary (the step in flight finishes and
        is journaled; the next does not start) and returns RUNNING until then; a queued,
        runnable or waiting one (a sleep, a message, an approval) is PAUSED at once. A
        message sent to a paused workflow is kept for it. A cancel still works (the run
        ends CANCELLED). Returns the status after the request (PAUSED, or RUNNING while
        it reaches its boundary); pausing a paused workflow changes nothing. A finished
        workflow, or one a cancel is stopping, raises WorkflowNotPausableError. Recorded in
        the audit log."""
        check_name("workflow_id", workflow_id)
        for _ in range(3):
            row = audit.pause(self, workflow_id, True)
            if row is not None:
                status = WorkflowStatus(row["status"])
                if status is WorkflowStatus.RUNNING and self.on_pause_requested is not None:
                    self.on_pause_requested(workflow_id, int(row["epoch"]), True)
                return status
            info = self.get_workflow(workflow_id)  # WorkflowNotFoundError if none
            if info.status is WorkflowStatus.PAUSED or (
                info.status is WorkflowStatus.RUNNING and info.pause_requested
            ):
                return info.status  # asked already
            if info.status.is_terminal:
                raise WorkflowNotPausableError(
                    workflow_id,
                    info.status.value,
                    "pause",
                    f"it has finished ({info.status.value}), so nothing is left to hold",
                )
            asked = self.db.fetch_one("get_cancel_request", {"workflow_id": workflow_id})
            if asked is not None and asked["cancel_reason"] is not None:
                raise WorkflowNotPausableError(
                    workflow_id,
                    info.status.value,
                    "pause",
                    "a cancel asked of it is under way (it ends CANCELLED)",
                )
            # Its row changed between the statements (claimed, released): ask again.
        return self.get_workflow(workflow_id).status

    def unpause(self, workflow_id: str) -> WorkflowStatus:
        """Let a paused workflow go on where it stopped: PENDING for any worker, which
        replays its journal (completed steps return their records, nothing runs twice)
        and runs the rest; ENQUEUED if it was paused before it left its queue. A running
        workflow asked to pause that has not reached its boundary yet keeps running (the
        request is withdrawn). Returns the status after; a workflow that is not paused is
        left as it is (its status returned). A finished workflow raises
        WorkflowNotPausableError. Recorded in the audit log."""
        check_name("workflow_id", workflow_id)
        row = audit.pause(self, workflow_id, False)
        if row is not None:
            status = WorkflowStatus(row["status"])
            if status is WorkflowStatus.RUNNING:
                if self.on_pause_requested is not None:
                    self.on_pause_requested(workflow_id, 0, False)
            else:
                self.notify_work(workflow_id)
            return status
        info = self.get_workflow(workflow_id)  # WorkflowNotFoundError if none
        if info.status.is_terminal:
            raise WorkflowNotPausableError(
                workflow_id,
                info.status.value,
                "unpause",
                f"it has finished ({info.status.value}): resume or fork it to run it again",
            )
        return info.status

    def _resume(self, workflow_id: str, *, version: str | None = None) -> dict[str, Any] | None:
        """resume(); the row this call changed (its workflow_id, name, version and status
        after it) when it made the workflow runnable or moved it, else None (a status read
        after it cannot tell: a worker may have claimed, or finished, the workflow since)."""
        check_name("workflow_id", workflow_id)
        if version is not None:
            check_version("version", version)
        params = {
            "workflow_id": workflow_id,
            "version": version,
            "journal_version": labels.JOURNAL_VERSION,
        }
        for _ in range(3):
            row = audit.resume(self, params)
            if row is not None:
                if row["status"] != WorkflowStatus.SUSPENDED:
                    self.notify_work(workflow_id)
                return row
            info = self.get_workflow(workflow_id)  # WorkflowNotFoundError if none
            info.check_journal()
            if info.status in _NOT_RESUMABLE:
                raise WorkflowNotResumableError(workflow_id, info.status.value)
            if _compensated(info):
                raise WorkflowNotResumableError(
                    workflow_id, "CANCELLED after its compensations ran"
                )
            if version is None:
                return None
            if info.status is WorkflowStatus.SUCCESS:
                raise WorkflowNotMovableError(
                    workflow_id,
                    info.status.value,
                    version,
                    "it SUCCEEDED, so nothing is left to run: fork it with version= to run "
                    f"it again under that code (`durable workflows fork {workflow_id} "
                    "--from-step N --version V`)",
                )
            if info.status is WorkflowStatus.RUNNING:
                raise WorkflowNotMovableError(
                    workflow_id,
                    info.status.value,
                    version,
                    f"it is RUNNING and its lease is live (held by executor {info.owner!r}): "
                    "wait until the run stops, or stop that worker (it releases its runs, "
                    "which then wait for a worker of their version), then move it",
                )
            # It stopped, or was let go, between the statements: try them again.
        raise WorkflowNotMovableError(
            workflow_id, info.status.value, version or "", "it kept changing: try again"
        )

    def fork(
        self,
        workflow_id: str,
        *,
        from_step: int,
        new_id: str | None = None,
        version: str | None = None,
    ) -> WorkflowHandle:
        """Start a new workflow with the same inputs that reuses the journal before position
        `from_step` (their outputs, charges and tool records) and runs the rest anew. Any
        worker with its code runs it: the original's version, or `version` when given
        ("" for no version), as DBOS forks to another application version. A worker of
        that version replays the copied journal, so code that does not match it stops the
        fork with NondeterminismError. Returns the fork's handle.

        A reader of the fork sees what a reader of the original saw before `from_step`: the
        stream values at their offsets, each event's value as it was there, the gates
        decided and the messages consumed there. What lies at or after `from_step` the
        fork's run writes itself. What a fork shares with its original, and what it does
        again (effects and their compensations, children, the budget): docs/discussions.md,
        "Forks"."""
        if isinstance(from_step, bool) or not isinstance(from_step, int) or from_step < 0:
            raise ConfigurationError(f"from_step={from_step!r}: give a step position >= 0")
        check_name("workflow_id", workflow_id)
        check_name("new_id", new_id, optional=True)
        if version is not None:
            check_version("version", version)
        self._refuse_fork_after_undo(workflow_id, from_step)
        new_id = new_id or str(uuid.uuid4())
        params = {
            "workflow_id": workflow_id,
            "new_id": new_id,
            "version": version,
            "before_seq": from_step,
            "trace_context": tracing.start_context("fork", new_id),
            "event_prefix": labels.EVENT_PREFIX,
            "journal_version": labels.JOURNAL_VERSION,
        }
        try:
            created = audit.fork(self, params)
        except Exception as exc:
            if is_unique_violation(exc, "workflows_pkey"):
                raise ConfigurationError(
                    f"new_id={new_id!r} is taken: give another id for the fork"
                ) from None
            raise
        if not created:
            raise WorkflowNotFoundError(workflow_id)
        self.notify_work(new_id)
        return self.handle(new_id)

    fork_workflow = fork

    def _refuse_fork_after_undo(self, workflow_id: str, from_step: int) -> None:
        """ForkAfterUndoError when the original's compensations ran and the fork would
        inherit an effect they undid (it would replay it as applied). Checked before the
        fork's statements: an original is undone only once it has ended, and a finished
        workflow does not change (a running original shares each copied effect, and its
        one undo, with the fork). JournalVersionError first when the original's journal
        is newer (fork_workflow refuses it too)."""
        info = self.get_workflow(workflow_id)  # WorkflowNotFoundError if none
        info.check_journal()
        if info.status not in _NOT_RESUMABLE and not _compensated(info):
            return
        effects = [
            s.step_seq
            for s in self.steps(workflow_id)
            if s.kind == StepKind.EFFECT and s.error is None and s.step_seq < from_step
        ]
        if effects:
            status = info.status.value
            if _compensated(info):
                status += " after its compensations ran"
            raise ForkAfterUndoError(workflow_id, status, min(effects))

    def bulk(
        self,
        action: str,
        filter: RunFilter,
        *,
        dry_run: bool = False,
        version: str | None = None,
        reason: str = "cancelled in bulk",
        batch_size: int = 100,
        sample: int = 10,
        progress: BulkProgress | None = None,
    ) -> BulkResult:
        """Apply `action` to every run `filter` matches: "cancel" (with `reason`), "resume",
        "retry" (fork from the start: a new run with the same inputs, id `<id>:retry`) or
        "move" (to `version`, "" for none; see resume). The filter's statuses are cut to
        those the action changes (a retry given no status retries the failed and
        cancelled runs). `dry_run` counts them and lists a `sample`, writing nothing;
        otherwise they are acted on newest first, `batch_size` per page read, each in its
        own transaction with its audit row. Run again after an interruption, it does
        nothing twice (durable/_client/bulk.py). `progress(done, total)` after each page."""
        return bulk_run(
            self,
            action,
            filter,
            dry_run=dry_run,
            version=version,
            reason=reason,
            batch_size=batch_size,
            sample=sample,
            progress=progress,
        )

    def export_workflow(self, workflow_id: str, *, children: bool = False) -> dict[str, Any]:
        """Every stored row of a workflow, as a dict `json.dumps` writes as it is: to carry
        a run to another database (`import_workflow`) and look at it there, resume it or
        fork it. With `children`, its descendants' rows too.

        The rows are read in one snapshot and kept as stored: the workflows row, the
        journal, effects, gates, messages, events, streams, the budget ledger (a root's)
        and charges, tool calls, a cancel request. Values stay the serialized text a
        replay reads. The dict also says its format and the journal labels' version, so
        that an older release refuses what it cannot read. What is not carried:
        durable/_client/transfer.py. WorkflowNotFoundError if there is no such workflow."""
        return transfer.export(self.db, workflow_id, children=children, now=self.config.clock.now())

    def import_workflow(self, data: Mapping[str, Any]) -> list[str]:
        """Store an export (`export_workflow`'s dict, or its JSON read back) in this
        database, in one transaction; returns the ids imported, the exported root first.

        A workflow that was running is imported PENDING, held by nobody, so that any
        worker with its code (or `resume`) takes it up and replays its journal; a
        suspended one still waits for its message, decision or wake-up time; a finished
        one keeps its outcome (fork it to run it again). Refused, with nothing written:
        ids this database already has (ImportConflictError); an export of a newer
        format or schema, a row with a column a table here lacks, two rows with the same
        key or a row PostgreSQL refuses (ExportFormatError); a newer journal
        (JournalVersionError)."""
        checked = transfer.check(data)
        audit.import_(self, checked)
        if checked.runnable:
            self.notify_work(checked.runnable[0])
        return checked.workflow_ids

    def decide(
        self,
        workflow_id: str,
        name: str,
        approve: bool,
        *,
        comment: str | None = None,
        decided_by: str | None = None,
    ) -> None:
        """Decide an approval gate. The first decision wins: repeating it is harmless, the
        opposite decision raises ApprovalConflictError, an unknown gate UnknownApprovalError."""
        check_name("workflow_id", workflow_id)
        check_name("name", name)
        check_text("comment", comment)
        check_text("decided_by", decided_by)
        status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
        row = audit.decide(
            self,
            {
                "workflow_id": workflow_id,
                "name": name,
                "status": status.value,
                "comment": comment,
                "decided_by": decided_by,
            },
        )
        if row is not None and row["decided"]:
            self.notify_work(workflow_id)
            return
        existing = self.db.fetch_one("get_approval", {"workflow_id": workflow_id, "name": name})
        if existing is None:
            raise UnknownApprovalError(workflow_id, name)
        if existing["status"] != status:
            raise ApprovalConflictError(workflow_id, name, existing["status"])

    def _expire_approvals(self) -> int:
        """Decide timed-out gates by their default and wake their workflows (the worker
        calls this on every round)."""
        return self.db.execute("expire_approvals", {})

    def raise_budget(
        self,
        workflow_id: str,
        *,
        dollars: float | None = None,
        tokens: int | None = None,
        steps: int | None = None,
        seconds: float | None = None,
        decided_by: str | None = None,
    ) -> dict[str, Any]:
        """Add to the limits of the budget `workflow_id` draws from, and let every workflow
        paused at one of its budget gates continue (the gate is approved). Returns the
        ledger. Unlimited dimensions stay unlimited."""
        check_name("workflow_id", workflow_id)
        Budget(dollars=dollars, tokens=tokens, steps=steps, seconds=seconds)  # zero or more
        row = self.db.fetch_one("budget_of", {"workflow_id": workflow_id})
        if row is None:
            raise WorkflowNotFoundError(workflow_id)
        if row["budget_id"] is None:
            raise InvalidBudgetError(
                f"workflow {workflow_id!r} has no budget to raise: declare one with "
                "@durable.workflow(budget=durable.Budget(...))"
            )
        budget_id = row["budget_id"]
        raised = audit.raise_budget(
            self,
            workflow_id,
            {
                "budget_id": budget_id,
                "dollars": dollars_exact(dollars),
                "tokens": tokens,
                "steps": steps,
                "seconds": seconds,
            },
        )
        if raised is None:
            raise InvalidBudgetError(f"workflow {workflow_id!r}: its budget row is missing")
        for gate in self.db.fetch_all("waiting_budget_gates", {"budget_id": budget_id}):
            self.decide(
                gate["workflow_id"],
                gate["name"],
                True,
                comment="budget raised",
                decided_by=decided_by,
            )
        return Ledger.from_row(raised).as_dict()

    # -- schedules, retention, the cluster ---------------------------------------------

    def schedule(
        self,
        name: str,
        fn: Callable[..., Any],
        cron: str,
        *,
        timezone: str = "UTC",
        catch_up: int = 0,
    ) -> None:
        """Store (or update) a cron schedule of workflow `fn`, which is called with each tick.

        Any worker that has the workflow fires it, each tick exactly once. The cron is read
        on `timezone`'s wall clock; at a daylight-saving change a repeated time fires once,
        at its first occurrence, and a skipped one when the jump lands (see
        `durable.scheduled`). Invalid cron or timezone raise InvalidScheduleError and nothing
        is stored."""
        defn = workflow_def(fn)
        schedule = Schedule.build(name, defn.name, defn.version, cron, timezone, catch_up)
        audit.set_schedule(self, schedule.row())

    def pause_schedule(self, name: str, paused: bool = True) -> None:
        """Stop (or, with paused=False, restart) firing a schedule. On restart, ticks missed
        while paused follow the schedule's missed-tick policy."""
        check_name("name", name)
        if audit.pause_schedule(self, name, paused) is None:
            raise UnknownScheduleError(name)

    def delete_schedule(self, name: str) -> None:
        """Delete stored schedule `name` (UnknownScheduleError if none): it fires no more.
        The runs its ticks started are kept. One declared in code (`durable.scheduled`)
        is stored again by the next engine launched with that code: remove it there too."""
        check_name("name", name)
        if audit.delete_schedule(self, name) is None:
            raise UnknownScheduleError(name)

    def backfill_schedule(
        self,
        name: str,
        start: dt.datetime,
        end: dt.datetime,
        *,
        registry: Registry | None = None,
    ) -> list[WorkflowHandle]:
        """Run schedule `name`'s ticks from `start` (included) to `end` (excluded), as if it
        had fired them: each tick's run gets its tick's id, so a tick that already ran (or
        was backfilled before) starts nothing new. A naive datetime is a wall time of the
        schedule's timezone, read as a tick is (a repeated time: its first occurrence).
        Returns a handle per tick, oldest first (any worker runs them). The workflow's code
        must be imported here (`registry`: where it is registered, default an Engine's own
        registry, else the default one): UnknownWorkflowError otherwise."""
        code = registry or self.registry
        ids, _ = backfill(self, name, start, end, self.default_durability, code)
        return [self.handle(workflow_id) for workflow_id in ids]

    def trigger_schedule(
        self,
        name: str,
        *,
        workflow_id: str | None = None,
        registry: Registry | None = None,
    ) -> WorkflowHandle:
        """Run schedule `name`'s workflow now, with the current time as its tick, as a run
        of its own: its id is `workflow_id`, else a new one, never a tick's, so triggering
        twice runs twice (unless both give the same id) and the tick it falls on still
        runs. From workflow code the run is a child, journaled at its position like any
        start there (a replay does not trigger it again; its id is derived unless given).
        UnknownWorkflowError if the workflow's code is not imported here."""
        code = registry or self.registry
        defn, chosen, started = trigger(self, name, workflow_id, self.default_durability, code)
        if not started:
            self.existing(defn, chosen)  # the same id again: its run, if it is this one's
        return self.handle(chosen)

    def prune(
        self,
        policy: RetentionPolicy | None = None,
        *,
        dry_run: bool = False,
        progress: PruneProgress | None = None,
    ) -> PruneReport:
        """Apply a retention policy once (this engine's, if none is given). Safe while
        workers run: only finished workflows and old effects of finished work are deleted.
        `progress(what, done, total)` is called after each batch."""
        chosen = policy or self.config.retention
        if chosen is None:
            raise ConfigurationError(
                "prune() needs a policy: pass durable.RetentionPolicy(...) (or give "
                "Engine(retention=...))"
            )
        report = prune(self.db, chosen, dry_run=dry_run, progress=progress)
        if not dry_run and (report.workflows or report.effects):
            logger.info(
                "pruned %d finished workflows (%d journal rows) and %d effect records",
                report.workflows,
                report.steps,
                report.effects,
            )
        return report

    def prune_executors(self, stale_seconds: float = 600.0) -> int:
        """Forget executors silent for `stale_seconds` that own nothing; returns how many."""
        return self.db.execute("prune_executors", {"stale_seconds": stale_seconds})

    def distribute_citus(self) -> int:
        """Distribute durable's tables over the Citus cluster this client is connected to
        (its coordinator): per-workflow tables by workflow id, colocated; small shared
        tables as reference tables. See docs/scaling.md. Returns how many were distributed;
        raises ConfigurationError where there is no citus extension."""
        return self.db.distribute_citus()
