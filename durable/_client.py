"""The Client: everything that reads or changes stored workflows, and nothing that runs them.

A Client is a connection pool and the named statements: no threads, no heartbeat, no
executor row (while a stream reader or watcher waits, one thread reads the client's one
LISTEN connection: see `_listen.py`). It records workflows for workers to run (submit,
enqueue), hands out handles, reads journals and ledgers, and carries every operator
action (cancel, resume, fork, send, decide, raise a budget, schedules, prune). The CLI is
a Client; so is any process that only starts or inspects work. The Engine is a Client
that also runs workflows (see `_engine.py`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from durable import _labels as labels
from durable import _lifecycle as lifecycle
from durable import _protocol as protocol
from durable import _tracing as tracing
from durable._clock import Clock
from durable._config import Config
from durable._context import current_run, workflow_code_run
from durable._decorators import workflow_def
from durable._driver import drive
from durable._driver_async import drive_async
from durable._handles import AsyncWorkflowHandle, WorkflowHandle
from durable._listen import Listener, Subscription
from durable._migrate import MigrationProgress
from durable._models import (
    ApprovalStatus,
    Budget,
    Ledger,
    StepKind,
    StepRecord,
    WorkflowInfo,
    WorkflowStatus,
    dollars_exact,
)
from durable._names import check_name, check_text
from durable._protocol import Run, decode_error, encode_error
from durable._queues import Queue
from durable._registry import WorkflowDef
from durable._retention import PruneProgress, PruneReport, RetentionPolicy, prune
from durable._schedules import Schedule
from durable._systemdb import SystemDB, Tx, is_unique_violation
from durable.errors import (
    ApprovalConflictError,
    AsyncInSyncError,
    BlockingCallError,
    ConfigurationError,
    DatabaseUnavailableError,
    EngineNotRunningError,
    ForkAfterUndoError,
    InvalidBudgetError,
    InvalidWaitError,
    PayloadTooLargeError,
    QueueDedupError,
    SerializationError,
    UnknownApprovalError,
    UnknownScheduleError,
    WorkflowArgumentsError,
    WorkflowCancelledError,
    WorkflowConflictError,
    WorkflowFailedError,
    WorkflowNotFoundError,
    WorkflowNotResumableError,
    WorkflowTimeoutError,
)
from durable.serialization import (
    JSONSerializer,
    PickleSerializer,
    Serializer,
    check_faithful,
    dumps_checked,
    parameter_types,
    rebuild,
)

if TYPE_CHECKING:
    import concurrent.futures

logger = logging.getLogger("durable.client")

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")


# The longest wait or delay accepted (100 years): beyond it a timestamp overflows.
MAX_WAIT_SECONDS = 100 * 365.25 * 86400

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


def libpq_url(url: str) -> str:
    """psycopg does not understand SQLAlchemy's `postgresql+psycopg://` prefix."""
    if url.startswith("postgresql+"):
        return "postgresql://" + url.split("://", 1)[1]
    return url


class Client:
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
      clock: where time is read (default the system clock, or DURABLE_FAKE_CLOCK's).

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
    ) -> None:
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
            )
        )

    def _configure(self, config: Config) -> None:
        """Take the resolved settings (the environment was read there, once)."""
        self.config = config
        self._database_url = config.database_url
        self.schema = config.schema
        self.migrate_on_launch = config.migrate
        self.serializer: Serializer = config.serializer
        self.serializer_name = (
            "pickle"
            if isinstance(self.serializer, PickleSerializer)
            else (
                "json"
                if isinstance(self.serializer, JSONSerializer)
                else type(self.serializer).__name__
            )
        )
        self.max_payload_bytes = config.max_payload_bytes
        self.connect_timeout = config.connect_timeout
        self.clock: Clock = config.clock
        # LISTEN/NOTIFY wake-ups (workers, stream readers, watchers). Off (listen=False, or
        # DURABLE_LISTEN=0) everything polls: for a pooler in transaction mode, or a
        # distributed PostgreSQL without LISTEN.
        self.listen = config.listen
        self._db: SystemDB | None = None
        self._listener: Listener | None = None
        self._listener_lock = threading.Lock()
        # Versions of the migrations this client applied when it connected (migrate=True),
        # and who hears of each as it is applied (`durable migrate` shows them).
        self.applied_migrations: list[int] = []
        self._migration_progress: MigrationProgress | None = None

    # -- connection --------------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        if self._database_url is None:
            from durable import _embedded

            # This project's own database on the shared embedded server.
            self._database_url = _embedded.project_url()
        return libpq_url(self._database_url)

    @property
    def db(self) -> SystemDB:
        if self._db is None:
            raise EngineNotRunningError()
        return self._db

    @property
    def running(self) -> bool:
        return self._db is not None

    def _open_db(self, max_size: int, create_database: bool = False) -> SystemDB:
        db = SystemDB(
            self.database_url,
            self.schema,
            max_size=max_size,
            clock=self.clock,
            listen=self.listen,
            claims=self.config.claims,
        )
        db.open(timeout=self.connect_timeout, create_database=create_database)
        try:
            if self.migrate_on_launch:
                self.applied_migrations = db.migrate(self._migration_progress)
            else:
                db.check_schema()
        except BaseException:
            db.close()
            raise
        return db

    def connect(self) -> None:
        """Open the pool and check (or, with migrate=True, apply) the schema."""
        if self._db is None:
            self._db = self._open_db(max_size=4)

    def close(self) -> None:
        if self._db is not None:
            self.close_listener()
            self._db.close()
            self._db = None

    @property
    def listener(self) -> Listener:
        """This client's one LISTEN connection, shared by its stream readers, watchers and
        worker (see _listen.py); opened by the first of them to wait."""
        db = self.db
        with self._listener_lock:
            if self._listener is None or self._listener.db is not db:
                self._listener = Listener(db, (self.notify_channel, self.stream_channel))
            return self._listener

    def close_listener(self) -> None:
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def handle(
        self, workflow_id: str, future: concurrent.futures.Future[Any] | None = None
    ) -> WorkflowHandle:
        return WorkflowHandle(self, workflow_id, future)

    # -- recording workflows -----------------------------------------------------------------

    def encode_inputs(
        self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> str:
        """The stored form of a call's arguments. The call is bound to the function's
        signature first (WorkflowArgumentsError), and each argument must read back as it
        was given (SerializationError), so nothing unusable is ever stored."""
        signature, hints = parameter_types(defn.fn)
        if signature is not None:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise WorkflowArgumentsError(defn.name, str(signature), str(exc)) from None
            for name, value in bound.arguments.items():
                kind = signature.parameters[name].kind
                label = f"argument {name!r} of workflow {defn.name!r}"
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    for item in value:
                        check_faithful(self.serializer, item, None, label)
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    for item in value.values():
                        check_faithful(self.serializer, item, None, label)
                else:
                    check_faithful(self.serializer, value, hints.get(name), label)
        try:
            return dumps_checked(
                self.serializer,
                {"args": list(args), "kwargs": dict(kwargs)},
                f"the inputs of workflow {defn.name!r}",
                self.max_payload_bytes,
            )
        except PayloadTooLargeError:
            raise
        except SerializationError:
            # Name the argument that failed, so the message points at the caller's mistake.
            labelled = [(f"argument {i}", v) for i, v in enumerate(args)]
            labelled += [(f"argument {k!r}", v) for k, v in kwargs.items()]
            for label, value in labelled:
                dumps_checked(
                    self.serializer,
                    value,
                    f"{label} of workflow {defn.name!r} (the inputs of workflow {defn.name!r})",
                    self.max_payload_bytes,
                )
            raise

    def decode_inputs(
        self, text: str, defn: WorkflowDef | None = None
    ) -> tuple[list[Any], dict[str, Any]]:
        """Stored inputs as the run sees them, first run and replay alike (rebuilt as the
        parameters' annotations when pydantic is installed)."""
        data = self.serializer.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("args"), list):
            raise SerializationError(
                "the stored inputs are not {'args': [...], 'kwargs': {...}}: they were not "
                "written by this serializer",
                what="the stored inputs",
                type_name=type(data).__qualname__,
            )
        args, kwargs = list(data["args"]), dict(data.get("kwargs") or {})
        if defn is None:
            return args, kwargs
        signature, hints = parameter_types(defn.fn)
        if signature is None or not hints:
            return args, kwargs
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs  # the run reports the mismatch as the workflow's error
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if name in hints and kind not in (
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            ):
                bound.arguments[name] = rebuild(value, hints[name])
        return list(bound.args), dict(bound.kwargs)

    def workflow_params(
        self,
        defn: WorkflowDef,
        workflow_id: str,
        inputs: str,
        parent: tuple[str, int] | None,
        durability: str,
    ) -> dict[str, Any]:
        return {
            "workflow_id": workflow_id,
            "name": defn.name,
            "version": defn.version,
            "inputs": inputs,
            "serializer": self.serializer_name,
            "durability": defn.durability or durability,
            "parent_id": parent[0] if parent else None,
            "parent_step_seq": parent[1] if parent else None,
            "timeout_seconds": defn.timeout,
            "budget_id": _budget_for(defn, workflow_id, parent),
            "trace_context": tracing.start_context(defn.name, workflow_id),
        }

    @property
    def default_durability(self) -> str:
        return "sync"

    def existing(self, defn: WorkflowDef, workflow_id: str) -> WorkflowInfo:
        info = self.get_workflow(workflow_id)
        if info.name != defn.name:
            raise WorkflowConflictError(workflow_id, info.name, defn.name)
        return info

    @staticmethod
    def _workflow_id(kwargs: dict[str, Any]) -> str | None:
        workflow_id: str | None = kwargs.pop("workflow_id", None)
        check_name("workflow_id", workflow_id, optional=True)  # "" is refused, not "none"
        return workflow_id

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> WorkflowHandle:
        """Record `fn(*args, **kwargs)` as runnable for any worker (`durable worker`), without
        running it here. `workflow_id=` (popped from kwargs) chooses the id: ids are
        idempotency keys, so an existing id returns its handle."""
        workflow_id = self._workflow_id(kwargs) or str(uuid.uuid4())
        defn = workflow_def(fn)
        inputs = self.encode_inputs(defn, args, kwargs)
        params = self.workflow_params(defn, workflow_id, inputs, None, self.default_durability)
        row = self.db.fetch_one("insert_workflow_pending", params)
        if row is None:
            self.existing(defn, workflow_id)
        else:
            self.notify_work(workflow_id)
        return self.handle(workflow_id)

    def enqueue(
        self, queue: Queue, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowHandle:
        """Put `fn(*args, **kwargs)` on `queue`; a worker starts it when the queue's limits
        allow. Popped from kwargs: `workflow_id=` (an existing id returns its handle),
        `dedup_key=` (QueueDedupError while another entry with it is queued or unfinished),
        `priority=` (lower first; queues declared with priority=True) and `delay=` (seconds
        before it may start). Inside a workflow the entry is journaled as a child, so a
        replay does not enqueue it again."""
        workflow_id, dedup_key, priority, delay = self._enqueue_options(queue, kwargs)
        defn = workflow_def(fn)
        run, parent, workflow_id, journaled = place_child(defn, workflow_id)
        if journaled:
            return self.handle(workflow_id)
        self._enqueue(queue, defn, workflow_id, parent, args, kwargs, dedup_key, priority, delay)
        if run is not None and parent is not None:
            drive(run, protocol.record_child_started(run, parent[1], defn.name, workflow_id))
        return self.handle(workflow_id)

    def _enqueue_options(
        self, queue: Queue, kwargs: dict[str, Any]
    ) -> tuple[str | None, str | None, int | None, float | None]:
        """enqueue's own keyword arguments, popped from `kwargs` and checked."""
        if not isinstance(queue, Queue):
            raise ConfigurationError(f"queue={queue!r}: give a durable.Queue")
        workflow_id = self._workflow_id(kwargs)
        dedup_key = kwargs.pop("dedup_key", None)
        priority = kwargs.pop("priority", None)
        delay = kwargs.pop("delay", None)
        check_name("dedup_key", dedup_key, optional=True)
        if priority is not None:
            if not queue.priority:
                raise ConfigurationError(
                    f"priority={priority!r} given, but queue {queue.name!r} orders by age: "
                    f"declare it with durable.Queue({queue.name!r}, priority=True)"
                )
            if not isinstance(priority, int) or isinstance(priority, bool):
                raise ConfigurationError(f"priority={priority!r}: give an integer (lower first)")
        if delay is not None and (
            not isinstance(delay, int | float)
            or isinstance(delay, bool)
            or not 0 <= delay <= MAX_WAIT_SECONDS
        ):
            raise InvalidWaitError(
                f"delay={delay!r}: give zero or more seconds (at most {MAX_WAIT_SECONDS:.0f})"
            )
        return workflow_id, dedup_key, priority, delay

    def _enqueue(
        self,
        queue: Queue,
        defn: WorkflowDef,
        workflow_id: str,
        parent: tuple[str, int] | None,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        dedup_key: str | None,
        priority: int | None,
        delay: float | None,
    ) -> None:
        inputs = self.encode_inputs(defn, args, kwargs)
        params = self.workflow_params(defn, workflow_id, inputs, parent, self.default_durability)
        params.update(
            queue_name=queue.name,
            priority=priority or 0,
            dedup_key=dedup_key,
            delay_seconds=float(delay or 0.0),
        )
        if dedup_key is None:
            row = self.db.fetch_one("enqueue_workflow", params)
        else:
            row = self.db.atomically(lambda tx: _enqueue_deduplicated(tx, params), "enqueue")
        if row is None:
            self.existing(defn, workflow_id)
        else:
            self.notify_work(workflow_id)

    def notify_work(self, payload: str = "") -> None:
        """Wake idle workers (they also poll, so a lost notification only delays)."""
        try:
            self.db.execute("notify_work", {"channel": self.notify_channel, "payload": payload})
        except DatabaseUnavailableError:
            pass

    @property
    def notify_channel(self) -> str:
        return f"{self.schema}_work"

    @contextmanager
    def notifications(self) -> Iterator[Callable[[float], list[str]]]:
        """For watchers: LISTEN on the work channel (the client's shared listener), yielding
        `wait(seconds)`, which returns the payloads (mostly workflow ids: woken, decided,
        sent to, cancelled, resumed) notified since the last call, waiting up to `seconds`
        for one; [] when none came. Journal writes send no notification (a step costs one
        round trip), so watchers poll too; without a LISTEN connection `wait` only sleeps."""
        subscription = self.listener.subscribe(self.notify_channel)
        try:
            yield subscription.wait
        finally:
            subscription.close()

    # -- operator actions --------------------------------------------------------------------

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
        rows = _run_ops(self.db, protocol.cancel_tree(workflow_id, reason, error))
        asked = {r["workflow_id"]: WorkflowStatus(r["status"]) for r in rows}
        running = [
            (r["workflow_id"], int(r["epoch"]))
            for r in rows
            if asked[r["workflow_id"]] is WorkflowStatus.RUNNING
        ]
        if running:
            self._cancel_requested(running, reason)
        if any(status is WorkflowStatus.PENDING for status in asked.values()):
            self.notify_work(workflow_id)
        return asked

    def _cancel_requested(self, runs: list[tuple[str, int]], reason: str) -> None:
        """Hook: the Engine makes its own runs see the request at once."""

    def resume(self, workflow_id: str) -> WorkflowHandle:
        """Run a stopped workflow again from its journal: completed steps replay, the rest
        run. Resumes a CANCELLED, ERROR or MAX_RECOVERY_ATTEMPTS_EXCEEDED workflow (and one
        waiting for a worker); any worker with its code picks it up. Returns its handle.

        A workflow that is still going is left as it is, and so is one that succeeded
        (nothing runs, nothing is written: its handle gives its result, as DBOS's
        resume_workflow does). One whose undo ran raises WorkflowNotResumableError (fork
        it instead): COMPENSATED, COMPENSATION_FAILED, and CANCELLED after its
        compensations ran, since a replay would redo its effects on top of their undo and
        undo them again under new keys."""
        self._resume(workflow_id)
        return self.handle(workflow_id)

    resume_workflow = resume

    def _resume(self, workflow_id: str) -> bool:
        """resume(); True when this call made the workflow runnable (a status read after
        it cannot tell: a worker may have claimed, or finished, the workflow since)."""
        check_name("workflow_id", workflow_id)
        row = self.db.fetch_one("resume_workflow", {"workflow_id": workflow_id})
        if row is None:
            info = self.get_workflow(workflow_id)  # WorkflowNotFoundError if none
            if info.status in _NOT_RESUMABLE:
                raise WorkflowNotResumableError(workflow_id, info.status.value)
            if _compensated(info):
                raise WorkflowNotResumableError(
                    workflow_id, "CANCELLED after its compensations ran"
                )
            return False
        self.notify_work(workflow_id)
        return True

    def fork(
        self, workflow_id: str, *, from_step: int, new_id: str | None = None
    ) -> WorkflowHandle:
        """Start a new workflow with the same inputs that reuses the journal before position
        `from_step` (their outputs, charges and tool records) and runs the rest anew. Any
        worker with its code runs it. Returns the fork's handle.

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
        self._refuse_fork_after_undo(workflow_id, from_step)
        new_id = new_id or str(uuid.uuid4())
        params = {
            "workflow_id": workflow_id,
            "new_id": new_id,
            "before_seq": from_step,
            "trace_context": tracing.start_context("fork", new_id),
            "event_prefix": labels.EVENT_PREFIX,
        }
        try:
            created = self.db.fork(params)
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
        workflow does not change."""
        info = self.get_workflow(workflow_id)  # WorkflowNotFoundError if none
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
        row = self.db.fetch_one(
            "decide_approval",
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

    def send(
        self,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """Send a message to a workflow (from anywhere); it wakes if it waits in recv().
        Sending twice with the same idempotency_key delivers once."""
        check_name("topic", topic, optional=True)
        check_name("idempotency_key", idempotency_key, optional=True)
        self.get_workflow(workflow_id)  # WorkflowNotFoundError before anything is stored
        payload = dumps_checked(self.serializer, message, "the message", self.max_payload_bytes)
        self.db.execute(
            "send_message",
            {
                "workflow_id": workflow_id,
                "message_id": idempotency_key or str(uuid.uuid4()),
                "topic": topic or "",
                "payload": payload,
            },
        )
        self.notify_work(workflow_id)

    def get_event(self, workflow_id: str, key: str, timeout: float = 0.0) -> Any:
        """The latest value a workflow published under `key`, waiting up to `timeout`
        seconds for it to appear; None if it did not."""
        check_name("workflow_id", workflow_id)
        check_name("key", key)

        def perform(op: lifecycle.Op) -> Any:
            match op:
                case lifecycle.ReadEvent():
                    return self._event(op.workflow_id, op.key)
                case lifecycle.Now():
                    return time.monotonic()
                case lifecycle.Sleep():
                    time.sleep(op.seconds)
                    return None
            raise AssertionError(f"get_event does not ask for {op!r}")

        return lifecycle.drive(lifecycle.event(workflow_id, key, timeout), perform)

    def _event(self, workflow_id: str, key: str) -> tuple[bool, Any]:
        row = self.db.fetch_one("get_event", {"workflow_id": workflow_id, "key": key})
        return (False, None) if row is None else (True, self.serializer.loads(row["value"]))

    # -- streams -------------------------------------------------------------------------------

    @property
    def stream_channel(self) -> str:
        return f"{self.schema}_streams"

    def read_stream(
        self, workflow_id: str, key: str, offset: int = 0, *, poll_interval: float = 1.0
    ) -> Iterator[Any]:
        """The values of a workflow's stream `key` from `offset` on, in order, each once,
        following it live until it is closed (or the workflow finished and nothing more is
        there). Waits for new values on the client's one LISTEN connection (shared by all
        its readers), looking again every `poll_interval` seconds in case a notification
        was lost or no LISTEN connection could be had. Reconnecting from the offset after
        the last value seen continues where a reader left off."""
        start = self._stream_args(workflow_id, key, offset)
        subscription: Subscription | None = None
        try:
            while True:
                rows, start, ended = self._stream_rows(workflow_id, key, start)
                yield from rows
                if ended:
                    return
                if rows:
                    continue
                if subscription is None:  # listen, then look once more: nothing falls between
                    subscription = self.listener.subscribe(self.stream_channel, workflow_id)
                    continue
                subscription.wait(poll_interval)
        finally:
            if subscription is not None:
                subscription.close()

    async def read_stream_async(
        self, workflow_id: str, key: str, offset: int = 0, *, poll_interval: float = 1.0
    ) -> AsyncIterator[Any]:
        """read_stream, as an async iterator (no thread is held while it waits)."""
        start = self._stream_args(workflow_id, key, offset)
        subscription: Subscription | None = None
        try:
            while True:
                rows, start, ended = await asyncio.to_thread(
                    self._stream_rows, workflow_id, key, start
                )
                for value in rows:
                    yield value
                if ended:
                    return
                if rows:
                    continue
                if subscription is None:
                    subscription = await self.listener.subscribe_async(
                        self.stream_channel, workflow_id
                    )
                    continue
                await subscription.wait_async(poll_interval)
        finally:
            if subscription is not None:
                subscription.close()

    def _stream_args(self, workflow_id: str, key: str, offset: int) -> int:
        check_name("workflow_id", workflow_id)
        check_name("key", key)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigurationError(f"offset={offset!r}: give a whole number >= 0")
        self.get_workflow(workflow_id)  # WorkflowNotFoundError for a wrong id
        return offset

    def _stream_rows(self, workflow_id: str, key: str, start: int) -> tuple[list[Any], int, bool]:
        """One look: (values from `start` on, the next offset, whether the stream ended).
        The status is read before the rows: a workflow seen finished has written all."""
        finished = WorkflowStatus(
            (self.db.fetch_one("get_workflow_status", {"workflow_id": workflow_id}) or {}).get(
                "status", "SUCCESS"
            )
        ).is_terminal
        rows = self.db.fetch_all(
            "read_stream",
            {"workflow_id": workflow_id, "key": key, "offset": start, "limit": 1000},
        )
        values: list[Any] = []
        for row in rows:
            if row["closed"]:
                return values, start, True
            values.append(self.serializer.loads(row["value"]))
            start = int(row["offset"]) + 1
        return values, start, finished and not rows

    # -- for async code: the same calls, awaited (no thread is held while waiting) ---------------

    async def send_async(
        self,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """send, awaited."""
        await asyncio.to_thread(self.send, workflow_id, message, topic, idempotency_key)

    async def get_event_async(self, workflow_id: str, key: str, timeout: float = 0.0) -> Any:
        """get_event, awaited: between looks it sleeps on the event loop."""
        check_name("workflow_id", workflow_id)
        check_name("key", key)

        async def perform(op: lifecycle.Op) -> Any:
            match op:
                case lifecycle.ReadEvent():
                    return await asyncio.to_thread(self._event, op.workflow_id, op.key)
                case lifecycle.Now():
                    return time.monotonic()
                case lifecycle.Sleep():
                    await asyncio.sleep(op.seconds)
                    return None
            raise AssertionError(f"get_event_async does not ask for {op!r}")

        return await lifecycle.drive_async(lifecycle.event(workflow_id, key, timeout), perform)

    async def retrieve_async(self, workflow_id: str) -> AsyncWorkflowHandle:
        """retrieve, awaited: an AsyncWorkflowHandle."""
        await asyncio.to_thread(self.get_workflow, workflow_id)
        return AsyncWorkflowHandle(self, workflow_id)

    async def enqueue_async(
        self, queue: Any, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> AsyncWorkflowHandle:
        """enqueue, awaited: an AsyncWorkflowHandle. Inside an async workflow the entry is
        journaled as a child at the position of this call."""
        workflow_id, dedup_key, priority, delay = self._enqueue_options(queue, kwargs)
        defn = workflow_def(fn)
        run, parent, workflow_id, journaled = place_child(defn, workflow_id, asynchronous=True)
        if not journaled:
            await asyncio.to_thread(
                self._enqueue,
                queue,
                defn,
                workflow_id,
                parent,
                args,
                kwargs,
                dedup_key,
                priority,
                delay,
            )
            if run is not None and parent is not None:
                gen = protocol.record_child_started(run, parent[1], defn.name, workflow_id)
                await drive_async(run, gen)
        return AsyncWorkflowHandle(self, workflow_id)

    def events(self, workflow_id: str) -> dict[str, Any]:
        """Every event the workflow published (durable.set_event), by key: latest values."""
        check_name("workflow_id", workflow_id)
        rows = self.db.fetch_all("list_events", {"workflow_id": workflow_id})
        return {r["key"]: self.serializer.loads(r["value"]) for r in rows}

    def list_approvals(
        self, workflow_id: str | None = None, *, waiting_only: bool = True, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Approval gates (waiting ones by default), as dicts of their stored columns."""
        return self.db.fetch_all(
            "list_approvals",
            {"workflow_id": workflow_id, "waiting_only": waiting_only, "limit": limit},
        )

    def expire_approvals(self) -> int:
        """Decide timed-out gates by their default and wake their workflows (the worker
        calls this on every round)."""
        return self.db.execute("expire_approvals", {})

    # -- schedules ---------------------------------------------------------------------------

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

        Any worker that has the workflow fires it, each tick exactly once. Invalid cron or
        timezone raise InvalidScheduleError and nothing is stored."""
        defn = workflow_def(fn)
        schedule = Schedule.build(name, defn.name, defn.version, cron, timezone, catch_up)
        self.db.execute("upsert_schedule", schedule.row())

    def list_schedules(self) -> list[dict[str, Any]]:
        """Stored schedules, as dicts of their columns."""
        return self.db.fetch_all("list_schedules", {})

    def pause_schedule(self, name: str, paused: bool = True) -> None:
        """Stop (or, with paused=False, restart) firing a schedule. On restart, ticks missed
        while paused follow the schedule's missed-tick policy."""
        check_name("name", name)
        row = self.db.fetch_one("set_schedule_paused", {"schedule_name": name, "paused": paused})
        if row is None:
            raise UnknownScheduleError(name)

    # -- reading -----------------------------------------------------------------------------

    def retrieve(self, workflow_id: str) -> WorkflowHandle:
        """A handle to an existing workflow; raises WorkflowNotFoundError if there is none."""
        self.get_workflow(workflow_id)
        return self.handle(workflow_id)

    def get_workflow(self, workflow_id: str) -> WorkflowInfo:
        check_name("workflow_id", workflow_id)
        row = self.db.fetch_one("get_workflow", {"workflow_id": workflow_id})
        if row is None:
            raise WorkflowNotFoundError(workflow_id)
        return WorkflowInfo.from_row(row)

    def list_workflows(
        self,
        status: WorkflowStatus | str | None = None,
        *,
        name: str | None = None,
        limit: int = 100,
        id_prefix: str | None = None,
        created_from: dt.datetime | None = None,
        created_to: dt.datetime | None = None,
        after: tuple[dt.datetime, str] | None = None,
    ) -> list[WorkflowInfo]:
        """Stored workflows, newest first (at most `limit`, 1 to 100,000), optionally only
        those whose id starts with `id_prefix` or created in [created_from, created_to).
        Page with `after`: the (created_at, workflow_id) of the last row of the page before
        (a keyset, so a page costs the same at any depth)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise ConfigurationError(f"limit={limit!r}: give a whole number from 1 to 100,000")
        check_name("name", name, optional=True)
        check_name("id_prefix", id_prefix, optional=True)
        if status is not None:
            try:
                status = WorkflowStatus(status)
            except ValueError:
                raise ConfigurationError(
                    f"status={status!r}: use one of {', '.join(s.value for s in WorkflowStatus)}"
                ) from None
        after_at, after_id = after if after is not None else (None, None)
        check_name("after", after_id, optional=True)
        rows = self.db.fetch_all(
            "list_workflows",
            {
                "status": None if status is None else str(status),
                "name": name,
                "id_from": id_prefix,
                "id_to": None if id_prefix is None else _prefix_end(id_prefix),
                "created_from": created_from,
                "created_to": created_to,
                "after_at": after_at,
                "after_id": after_id,
                "limit": limit,
            },
        )
        return [WorkflowInfo.from_row(r) for r in rows]

    def steps(self, workflow_id: str) -> list[StepRecord]:
        """The journal of one workflow, in call order."""
        check_name("workflow_id", workflow_id)
        return [
            StepRecord.from_row(r)
            for r in self.db.fetch_all("load_journal", {"workflow_id": workflow_id})
        ]

    def effects(self, workflow_id: str) -> list[dict[str, Any]]:
        """The effect ledger of one workflow: key, status, result or error, in order."""
        check_name("workflow_id", workflow_id)
        return self.db.fetch_all("list_effects", {"workflow_id": workflow_id})

    def executors(self) -> list[dict[str, Any]]:
        """Executors (engines and workers) with their last heartbeat."""
        return self.db.fetch_all("list_executors", {})

    def queues(self) -> list[dict[str, Any]]:
        """Every queue with entries: how many wait for a slot, hold one, have finished."""
        return self.db.fetch_all("queue_depths", {})

    def distribute_citus(self) -> int:
        """Distribute durable's tables over the Citus cluster this client is connected to
        (its coordinator): per-workflow tables by workflow id, colocated; small shared
        tables as reference tables. See docs/scaling.md. Returns how many were distributed;
        raises ConfigurationError where there is no citus extension."""
        return self.db.distribute_citus()

    def prune_executors(self, stale_seconds: float = 600.0) -> int:
        """Forget executors silent for `stale_seconds` that own nothing; returns how many."""
        return self.db.execute("prune_executors", {"stale_seconds": stale_seconds})

    def waiting_for_worker(
        self, stale_seconds: float = 120, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Runnable workflows no live executor can run (its code is nowhere registered)."""
        return self.db.fetch_all(
            "waiting_for_worker", {"stale_seconds": stale_seconds, "limit": limit}
        )

    def finished(self, workflow_id: str) -> tuple[bool, Any]:
        """(True, its value) if the workflow finished (raising what it finished with, as
        outcome does), else (False, None): one look, for the handles' waits."""
        row = self.db.fetch_one("get_workflow_status", {"workflow_id": workflow_id})
        if row is None:
            raise WorkflowNotFoundError(workflow_id)
        status = WorkflowStatus(row["status"])
        if not status.is_terminal:
            return False, None
        return True, self.outcome(workflow_id, status, row["output"], row["error"])

    def outcome(
        self, workflow_id: str, status: WorkflowStatus, output: str | None, error: str | None
    ) -> Any:
        """The value of a finished workflow, or the error it finished with."""
        if status is WorkflowStatus.SUCCESS:
            return None if output is None else self.serializer.loads(output)
        if status is WorkflowStatus.CANCELLED:
            row = self.db.fetch_one("get_cancel_request", {"workflow_id": workflow_id}) or {}
            if error is not None and decode_error(error)[0].endswith("WorkflowTimeoutError"):
                raise WorkflowTimeoutError(workflow_id, row.get("timeout_seconds"))
            raise WorkflowCancelledError(workflow_id, row.get("cancel_reason"))
        if error is not None:
            error_type, message, trace = decode_error(error)
            raise WorkflowFailedError(workflow_id, error_type, message, trace)
        raise WorkflowFailedError(workflow_id, status.value, f"ended as {status.value}")

    # -- budgets, state, tools, retention ----------------------------------------------------

    def budget(self, workflow_id: str) -> dict[str, Any] | None:
        """The budget ledger workflow `workflow_id` draws from: limits, spent, and every
        charge in order (None if it has no budget)."""
        check_name("workflow_id", workflow_id)
        row = self.db.fetch_one("budget_of", {"workflow_id": workflow_id})
        if row is None:
            raise WorkflowNotFoundError(workflow_id)
        if row["budget_id"] is None:
            return None
        ledger_row = self.db.fetch_one("get_budget", {"budget_id": row["budget_id"]})
        if ledger_row is None:
            return None
        ledger = Ledger.from_row(ledger_row)
        charges = self.db.fetch_all("list_charges", {"budget_id": ledger.budget_id})
        return {
            "budget_id": ledger.budget_id,
            **ledger.as_dict(),
            "exhausted": ledger.exhausted(),
            "charges": [
                {
                    "workflow_id": c["workflow_id"],
                    "step_seq": c["step_seq"],
                    "step_name": c["step_name"],
                    "dollars": float(c["dollars"]),
                    "tokens": int(c["tokens"]),
                }
                for c in charges
            ],
        }

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
        raised = self.db.fetch_one(
            "raise_budget",
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

    def tool_calls(self, workflow_id: str) -> list[dict[str, Any]]:
        """An agent's tool calls in order: name, arguments, result (or error), latency, cost."""
        check_name("workflow_id", workflow_id)
        rows = self.db.fetch_all("list_tool_calls", {"workflow_id": workflow_id})
        loads = self.serializer.loads
        return [
            {
                "step_seq": r["step_seq"],
                "tool": r["tool_name"],
                "arguments": loads(r["arguments"]),
                "result": None if r["output"] is None else loads(r["output"]),
                "error": None if r["error"] is None else decode_error(r["error"])[1],
                "latency_ms": r["latency_ms"],
                "dollars": float(r["dollars"]),
                "tokens": int(r["tokens"]),
            }
            for r in rows
        ]

    def get_state(self, workflow_id: str, at_step: int | None = None) -> Any:
        """The workflow's durable.state: the latest, or as it was when the workflow reached
        step position `at_step` (what a fork from that step starts with)."""
        check_name("workflow_id", workflow_id)
        before = 2**31 - 1 if at_step is None else at_step
        row = self.db.fetch_one("latest_state", {"workflow_id": workflow_id, "before_seq": before})
        return None if row is None else self.serializer.loads(row["output"])

    def state_text(self, workflow_id: str) -> str | None:
        """The latest durable.state as stored (serialized), or None."""
        check_name("workflow_id", workflow_id)
        row = self.db.fetch_one(
            "latest_state", {"workflow_id": workflow_id, "before_seq": 2**31 - 1}
        )
        return None if row is None else str(row["output"])

    def conversation(self, workflow_id: str) -> list[dict[str, Any]]:
        """The turns the workflow appended with durable.append_turn, oldest first."""
        check_name("workflow_id", workflow_id)
        rows = self.db.fetch_all("list_turns", {"workflow_id": workflow_id})
        return [self.serializer.loads(r["output"]) for r in rows]

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
        chosen = policy or self._retention_policy()
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

    def _retention_policy(self) -> RetentionPolicy | None:
        return None


def _run_ops(db: SystemDB, gen: protocol.Gen[T]) -> T:
    """Run a protocol generator that asks only for statements (Execute), outside any run:
    each on a pooled connection, its own transaction."""
    answer: Any = None
    while True:
        try:
            op = gen.send(answer)
        except StopIteration as stop:
            result: T = stop.value
            return result
        if not isinstance(op, protocol.Execute):
            raise TypeError(f"{op!r} needs a run")
        if op.fetch == "count":
            answer = db.execute(op.name, op.params)
        elif op.fetch == "one":
            answer = db.fetch_one(op.name, op.params)
        else:
            answer = db.fetch_all(op.name, op.params)


def _prefix_end(prefix: str) -> str:
    """The least string above every string starting with `prefix`, in byte (code point)
    order: the prefix with its last character incremented (surrogates are not text)."""
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if code == 0xD800:
            code = 0xE000
        if code <= 0x10FFFF:
            return prefix[:i] + chr(code)
    return prefix + "\U0010ffff"  # only U+10FFFF characters: nothing sorts above; unreachable


def place_child(
    defn: WorkflowDef, workflow_id: str | None, *, asynchronous: bool = False
) -> tuple[Run | None, tuple[str, int] | None, str, bool]:
    """Where a workflow started or enqueued now goes: inside a workflow (not a step) it is
    a child at the next position, with a deterministic id, and a replay finds the id
    journaled there (True: nothing to start). Returns (run, parent, id, journaled).
    From an async workflow only the awaited forms (start_async, enqueue_async) can
    journal it; from a plain-def one only the plain ones."""
    run = workflow_code_run()
    if run is None:
        return None, None, workflow_id or str(uuid.uuid4()), False
    if run.is_async != asynchronous:
        if run.is_async:
            raise BlockingCallError(
                f"starting {defn.name!r} from async workflow {run.name!r} would block its "
                "event loop: use `await engine.start_async(...)` / `enqueue_async(...)`"
            )
        raise AsyncInSyncError(
            f"start_async/enqueue_async of {defn.name!r} in plain-def workflow "
            f"{run.name!r}: use engine.start(...) / enqueue(...)"
        )
    seq, journaled = protocol.child_started(run, defn.name)
    if journaled is not None:
        return run, None, journaled, True
    parent = (run.workflow_id, seq)
    return run, parent, workflow_id or labels.child_id(run.workflow_id, seq), False


def _budget_for(defn: WorkflowDef, workflow_id: str, parent: tuple[str, int] | None) -> str | None:
    """The budget a new workflow draws from: its parent's if the parent has one (a child
    spends from its root's ledger), else its own if its code declares one."""
    if parent is not None:
        run = current_run.get()
        if run is not None and run.workflow_id == parent[0] and run.budget_id is not None:
            return run.budget_id
    return workflow_id if defn.budget is not None else None


def _enqueue_deduplicated(tx: Tx, params: dict[str, Any]) -> dict[str, Any] | None:
    """Enqueue holding a dedup key: take the key (or find its holder, locked), and refuse
    while the holder is queued or unfinished; a finished holder's key passes to this
    workflow. One transaction, run again from the start after a conflict."""
    key = {k: params[k] for k in ("queue_name", "dedup_key", "workflow_id")}
    taken = tx.fetch_one("take_dedup", key)
    assert taken is not None
    holder = str(taken["workflow_id"])
    if holder != params["workflow_id"]:
        active = tx.fetch_one("dedup_holder_active", {"holder": holder})
        if active is not None and active["active"]:
            raise QueueDedupError(params["queue_name"], str(params["dedup_key"]), holder)
        tx.execute("pass_dedup", key)
    return tx.fetch_one("enqueue_workflow", params)
