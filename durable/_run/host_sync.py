# Generated from durable/_run/host_async.py by tools/async_to_sync.py: do not edit.
# Edit the source, then run `python tools/async_to_sync.py`
# (tests/unit/test_generated_sync.py fails while this file is out of date).
"""The host of a workflow's life around its run: one `perform` for every operation of
`_lifecycle` (create or attach, run here, look, claim again, launch, wait, read an event).

Every caller of a lifecycle generator performs it through one host class: a run here
(a workflow called as a function, a child run inline: `Runner.run_inline`,
`AsyncHost.run_inline`), a start (`Engine.start`, `start_async`), a handle's wait
(`WorkflowHandle.result` and its awaited form) and a wait for an event (`get_event`). A
host is made with what differs between these callers, not with a perform of its own: the
client it reads through, the runner that creates, claims and runs (none for a handle or
an event), whether it runs the workflow here, the run it waits for.

It is written once, as async code (`durable/_run/host_async.py`: `AsyncLifeHost`,
`drive_async`); `durable/_run/host_sync.py` (`LifeHost`, `drive`) is generated from it by
tools/async_to_sync.py. Where the two sides really differ, the source says so in an
`if True:  # ASYNC ... else:` block:

- A run here on a thread sends the insert that creates the workflow on the connection its
  run then uses (an outer run's, for a child), and gives it back before anything else;
  on an event loop the run checks out a connection for each stretch of statements itself.
- A run on an event loop goes through the loop's host (`_async_host.AsyncHost`); on a
  thread, the runner runs it in a copy of the caller's context.
- Launch: an async def workflow started from an event loop runs as a task of that loop
  (and, should it wait, resumes there: `home`); on a thread every run goes to the
  engine's pool.
- WaitLocal: a thread waiting with no time limit runs a run no thread has begun itself.

What differs by a call alone (a blocking call off the loop, a sleep, a wait for a future,
a thread's future made awaitable) goes through `durable/_run/acompat.py`.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from durable._base.models import WorkflowStatus
from durable._core import Run, lifecycle
from durable._io.local import Claimed, LocalRun, ended, inline
from durable._io.ownership import say_who_holds
from durable._run.acompat import (
    CancelledError,
    Future,
    monotonic,
    sleep,
    to_thread,
    wait,
    waitable,
)
from durable.errors import (
    DatabaseUnavailableError,
    EngineNotRunningError,
    NondeterminismError,
    StaleOwnerError,
    WorkflowCancelledError,
    WorkflowConflictError,
    WorkflowHandedOver,
    WorkflowPaused,
    WorkflowSuspended,
)

if TYPE_CHECKING:
    import concurrent.futures
    from types import TracebackType

    from durable._base.models import WorkflowInfo
    from durable._base.registry import Registry, WorkflowDef
    from durable._core import Settings
    from durable._io.config import Config
    from durable._io.ownership import Ownership
    from durable._io.systemdb import SystemDB, Tx

T = TypeVar("T")

logger = logging.getLogger("durable.runner")


class Reader(Protocol):
    """What a host reads through a client: how a workflow ended, what it published."""

    def finished(self, workflow_id: str) -> tuple[bool, Any]: ...

    def outcome(
        self, workflow_id: str, status: WorkflowStatus, output: str | None, error: str | None
    ) -> Any: ...

    def published(self, workflow_id: str, key: str) -> tuple[bool, Any]: ...


class Stored(Protocol):
    """How a workflow's inputs are stored (`_inputs.Inputs`)."""

    def decode(
        self, text: str, defn: WorkflowDef | None = None, registry: Registry | None = None
    ) -> tuple[list[Any], dict[str, Any]]: ...

    def row(
        self,
        defn: WorkflowDef,
        workflow_id: str,
        inputs: str,
        parent: tuple[str, int] | None,
        durability: str,
    ) -> dict[str, Any]: ...


class Starter(Reader, Protocol):
    """A runner's client: also how inputs are stored and the workflows a start attaches to."""

    @property
    def inputs(self) -> Stored: ...

    def existing(
        self, defn: WorkflowDef, workflow_id: str, inputs: str | None = None
    ) -> WorkflowInfo: ...


class Creates(Protocol):
    """How a creation is claimed (`_claims.Claims`, which imports what imports this)."""

    def insert_params(
        self, defn: WorkflowDef, workflow_id: str, inputs: str, parent: tuple[str, int] | None
    ) -> tuple[dict[str, Any], int, float]: ...

    def inserted(
        self,
        defn: WorkflowDef,
        params: dict[str, Any],
        row: dict[str, Any] | None,
        doubts: int,
        claimed_at: float,
    ) -> Claimed | None: ...


class Runs(Protocol):
    """What a host asks of the runner (`_runner.Runner`) that creates, claims and runs."""

    @property
    def client(self) -> Starter: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def config(self) -> Config: ...

    @property
    def ownership(self) -> Ownership: ...

    @property
    def claims(self) -> Creates: ...

    @property
    def db(self) -> SystemDB: ...

    @property
    def settings(self) -> Settings | None: ...

    def claim(self, workflow_id: str) -> Claimed | None: ...

    def execute(self, claimed: Claimed, conn: Any = None) -> Any: ...

    def remember(self, workflow_id: str) -> None: ...

    def forget(self, workflow_ids: list[str]) -> None: ...

    def submit(self, claimed: Claimed) -> concurrent.futures.Future[Any]: ...

    def crash_point(self, name: str) -> None: ...

    def submit_claim(self, workflow_id: str) -> concurrent.futures.Future[Any] | None: ...


class Performs(Protocol):
    """What a drive performs a lifecycle's operations with (a host, or a test's script)."""

    def perform(self, op: lifecycle.Op) -> Any: ...


def drive(life: lifecycle.Life[T], host: Performs) -> T:
    """Run a lifecycle generator to its end, performing each operation with the host and
    sending its answer back (or throwing what it raised into the generator)."""
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = life.throw(error) if error is not None else life.send(answer)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            answer, error = host.perform(op), None
        except BaseException as exc:  # thrown into the generator, which decides
            answer, error = None, exc


class LifeHost:
    """Performs the operations of a workflow's life for one caller (see the module
    docstring). `here`: it runs the workflow in the caller (lifecycle.run_here)."""

    def __init__(
        self,
        reader: Reader,
        runner: Runs | None = None,
        *,
        here: bool = False,
        waiter: Future[Any] | None = None,
        conn: Any = None,
    ) -> None:
        """`waiter`: the run this process started, for a handle's wait; `conn`: the
        connection of the run this one runs inside (a child's start and run go on
        its parent's)."""
        self.reader, self.runner, self.here, self.waiter = reader, runner, here, waiter
        self._conn = conn
        self._held: AbstractContextManager[Any] | None = None

    def __enter__(self) -> LifeHost:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release(exc_type, exc, tb)

    def run_here(self, create: lifecycle.Create) -> Any:
        """Run (or resume, or wait for) the workflow `create` names in the caller, to its
        end (lifecycle.run_here); a host made with here=True."""
        life = lifecycle.run_here(create.defn, create.workflow_id, create.inputs, create.parent)
        with self:
            return drive(life, self)

    def perform(self, op: lifecycle.Op) -> Any:
        """Perform one operation (see _lifecycle for what each asks and answers)."""
        # The start and the run here share a connection; past them the caller holds
        # none while it waits.
        if self._conn is not None and not isinstance(op, lifecycle.Create | lifecycle.RunClaimed):
            self._release()
        match op:
            case lifecycle.Now():
                return monotonic()
            case lifecycle.Sleep():
                sleep(op.seconds)
                return None
            case lifecycle.Finished():
                return to_thread(self.reader.finished, op.workflow_id)
            case lifecycle.WaitLocal():
                return self._wait_local(op)
            case lifecycle.ReadEvent():
                return to_thread(self.reader.published, op.workflow_id, op.key)
        runner = self.runner
        if runner is None:
            raise AssertionError(f"{op!r} needs a runner")
        match op:
            case lifecycle.Create():
                created = self._create(runner, op)
                return inline(created) if self.here else created
            case lifecycle.RunClaimed(claimed=claimed):
                if not op.created:
                    self._release()
                return contextvars.copy_context().run(runner.execute, claimed, self._conn)
            case lifecycle.Attach():
                existing = runner.client.existing
                return to_thread(existing, op.defn, op.workflow_id, op.inputs)
            case lifecycle.Reclaim():
                return to_thread(runner.claim, op.workflow_id)
            case lifecycle.Remember():
                runner.remember(op.workflow_id)
                return None
            case lifecycle.Forget():
                runner.forget([op.workflow_id])
                return None
            case lifecycle.Launch(claimed=claimed):
                return waitable(runner.submit(claimed))  # the engine's threads
            case lifecycle.LaunchClaim():
                launched = to_thread(runner.submit_claim, op.workflow_id)
                if launched is None:
                    lease = runner.config.lease_seconds
                    to_thread(say_who_holds, runner.db, op.workflow_id, lease)
                    return None
                return waitable(launched)
        raise AssertionError(f"no lifecycle asks for {op!r}")

    def _create(self, runner: Runs, op: lifecycle.Create) -> Claimed | None:
        """Create the workflow claimed by this executor: its claim, with the arguments as
        a replay decodes them (not as the caller passed them), or None if the id exists.
        Decoded first: what this process could not run is not stored."""
        args, kwargs = runner.client.inputs.decode(op.inputs, op.defn, runner.registry)
        params, doubts, claimed_at = runner.claims.insert_params(
            op.defn, op.workflow_id, op.inputs, op.parent
        )
        db = runner.db
        message = op.message
        if message is not None:  # start_or_send: one transaction, on a pooled connection
            name = op.defn.name

            def work(tx: Tx) -> dict[str, Any] | None:
                return create_and_send(tx, False, params, name, message)

            row = to_thread(db.atomically, work, "start_or_send")
            runner.crash_point("after_start_or_send")
        else:
            row, doubts, claimed_at = self._insert(runner, params, doubts, claimed_at)
        created = runner.claims.inserted(op.defn, params, row, doubts, claimed_at)
        return None if created is None else created._replace(args=args, kwargs=kwargs)

    def _insert(
        self, runner: Runs, params: dict[str, Any], doubts: int, claimed_at: float
    ) -> tuple[Any, int, float]:
        """insert_workflow's row, and the doubts and time of the claim it makes."""
        db = runner.db
        if self.here:
            row = db.run_on(self._connection(runner), "insert_workflow", params, "one")
        else:
            row = db.fetch_one("insert_workflow", params)
        return row, doubts, claimed_at

    def _wait_local(self, op: lifecycle.WaitLocal) -> tuple[bool, Any] | None:
        """Wait for the run this process started, but never raise what it raised (a
        SystemExit in a step must not end the caller's process): the database says how it
        ended, unless it ended SUCCESS here."""
        waiter = self.waiter
        if waiter is None:
            raise AssertionError("no local run to wait for")
        if op.timeout is None and isinstance(waiter, LocalRun):
            waiter.run_on_caller()  # no thread has begun it: run it here
        if not wait(waiter, op.timeout):
            return None
        return local_end(self.reader, op.workflow_id, waiter)

    def _connection(self, runner: Runs) -> Any:
        """The connection the start and the run here share, checked out now if the
        caller has none."""
        if self._conn is None:
            self._held = runner.db.connection()
            self._conn = self._held.__enter__()
        return self._conn

    def _release(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> None:
        """Give back the connection checked out for the start (an outer run keeps
        its own)."""
        held, self._held, self._conn = self._held, None, None
        if held is not None:
            held.__exit__(exc_type, exc, tb)


def local_end(reader: Reader, workflow_id: str, future: Any) -> tuple[bool, Any]:
    """lifecycle.WaitLocal's answer for a local run that ended (a future of either kind):
    its value if it left the text of a SUCCESS output, else (False, None)."""
    output = ended(future)
    if output is None:
        return False, None
    return True, reader.outcome(workflow_id, WorkflowStatus.SUCCESS, output, None)


def new_run(runner: Runs, claimed: Claimed) -> Run:
    """The state a claimed workflow's run starts with, on either side."""
    settings = runner.settings
    if settings is None:
        raise EngineNotRunningError()
    return Run(
        settings,
        claimed.workflow_id,
        claimed.defn.name,
        claimed.epoch,
        claimed.journal,
        mode=claimed.defn.durability or runner.config.durability,
        host=runner,
        deadline=claimed.deadline,
        cancel_reason=claimed.cancel_reason,
        budget_id=claimed.budget_id,
        first_run=claimed.first_run,
        trace_context=claimed.trace_context,
        doubts_seen=claimed.doubts if claimed.doubts >= 0 else runner.db.outage.doubts,
        proven_at=claimed.claimed_at or monotonic(),
        parent_id=claimed.parent_id,
        deciding=threading.Lock(),
    )


def create_and_send(
    tx: Tx, pending: bool, params: dict[str, Any], name: str, message: dict[str, Any]
) -> dict[str, Any] | None:
    """start_or_send in the transaction `tx`: create the workflow (insert_workflow, or
    insert_workflow_pending for a worker when `pending`) and deliver `message` to it with
    send_message. Returns the insert's row; None when the id existed (a creation under way
    elsewhere is waited for by the insert), and the message went to that workflow, unless
    it runs another function: WorkflowConflictError, which rolls both back."""
    if pending:
        row = tx.fetch_one("insert_workflow_pending", params)
    else:
        row = tx.fetch_one("insert_workflow", params)
    if row is None:
        workflow_id = str(params["workflow_id"])
        existing = tx.fetch_one("get_workflow", {"workflow_id": workflow_id})
        if existing is not None and existing["name"] != name:
            raise WorkflowConflictError(workflow_id, str(existing["name"]), name)
    tx.execute("send_message", message)
    return None if row is None else dict(row)


@contextmanager
def outcome_of(runner: Runs, workflow_id: str, epoch: int) -> Iterator[None]:
    """What a run's end means to this executor, on either side: a suspension or a lost
    claim ends it quietly (the with-block's caller then returns None), an outage hands it
    back later, a failure is logged; a finished run is forgotten."""
    try:
        yield
    except (WorkflowSuspended, WorkflowPaused):
        return  # still this engine's to resume (if it started it), once it is runnable
    except CancelledError:
        # Its event loop ended under it (the run released the workflow): still this
        # engine's to finish, on another loop.
        raise
    except (StaleOwnerError, WorkflowCancelledError, WorkflowHandedOver):
        # Lost, cancelled, or handed over by a stopping worker: another worker's now.
        runner.forget([workflow_id])
        return
    except DatabaseUnavailableError:
        # The outage itself is said once (SystemDB.outage); each run is a detail.
        logger.debug("workflow %s interrupted by a database outage", workflow_id)
        runner.db.outage.note_interrupted()
        runner.ownership.interrupted(workflow_id, epoch)
        raise
    except BaseException as exc:
        runner.forget([workflow_id])
        _log_failure(workflow_id, exc)
        raise
    runner.forget([workflow_id])


def _log_failure(workflow_id: str, exc: BaseException) -> None:
    """One line per workflow that ended in an error (a nondeterminism error is louder:
    it means the code changed under a running workflow)."""
    fields = {"workflow_id": workflow_id, "error_type": type(exc).__qualname__}
    if isinstance(exc, NondeterminismError):
        logger.error(
            "workflow %s: %s",
            workflow_id,
            exc,
            extra={"event": "nondeterminism", "step_seq": exc.step_seq, **fields},
        )
    elif isinstance(exc, Exception):
        extra = {"event": "failed", **fields}
        logger.warning("workflow %s failed: %s", workflow_id, _safe_repr(exc), extra=extra)
    else:
        extra = {"event": "abandoned", **fields}
        logger.warning("workflow %s gave up: %s", workflow_id, _safe_repr(exc), extra=extra)


def _safe_repr(exc: BaseException) -> str:
    try:
        return repr(exc)
    except Exception:  # a repr that raises must not break the log line
        return f"<{type(exc).__qualname__}>"
