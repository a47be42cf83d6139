"""The async driver: performs what the protocol's generators ask, with `await`.

The same generators as `_run/driver.py` (every decision is in `_core`); only the I/O
differs. Statements run on psycopg's AsyncConnection, checked out of the event loop's
pool for a run of consecutive statements and given back before user code runs, so a
workflow that awaits a slow model call or a durable sleep holds no connection and no
thread. User code is awaited when it is `async def`; a sync function (a sync step reached
through `durable.to_thread`, a sync compensation) runs in a worker thread. An async
step's attempt can be cancelled: by its `timeout`, and when its workflow is cancelled (at
its next await, not only at the next step).

The decorators' async entry points live here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from durable import _core as protocol
from durable._core import TIMEOUT_REASON, Gen, Outcome, Run, ops
from durable._io.runio_async import AsyncAppTransaction
from durable._run import methods, tracing
from durable._run.context import (
    LoopHost,
    async_run,
    check_effect_key,
    current_attempt,
    current_step,
    engine_for,
    running,
    workflow_code_run,
)
from durable.errors import (
    BranchOrderError,
    WorkflowInterrupted,
    WorkflowSuspended,
)

if TYPE_CHECKING:
    import psycopg

    from durable._base.registry import StepDef, WorkflowDef
    from durable._io.systemdb import SystemDB

T = TypeVar("T")


class _Lease:
    """The system-database connection of a stretch of consecutive statements: checked out
    at the first, given back before anything that may wait (user code, a pause, a child),
    and at once when something raised while it was held."""

    def __init__(self, host: LoopHost) -> None:
        self._host = host
        self._cm: AbstractAsyncContextManager[psycopg.AsyncConnection[Any]] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None

    @property
    def held(self) -> bool:
        return self._cm is not None

    async def get(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None:
            cm = self._host.connection()
            self._conn = await cm.__aenter__()
            self._cm = cm
        return self._conn

    async def release(self, error: BaseException | None = None) -> None:
        """Give the connection back. `error`, what raised while it was held, goes to its
        checkout as a sync run's error goes to its own (SystemDB.connection): after an
        outage the connection is closed, not pooled for the next run to meet."""
        cm, self._cm, self._conn = self._cm, None, None
        if cm is None:
            return
        if error is None:
            await cm.__aexit__(None, None, None)
        else:
            await cm.__aexit__(type(error), error, error.__traceback__)

    async def release_after(self, error: BaseException) -> BaseException:
        """Give the connection back after `error` was raised while it was held (see
        release). Returns what the run is to see: `error`, or what giving it back raised."""
        try:
            await self.release(error)
        except BaseException as later:
            return later
        return error


async def drive_async(run: Run, gen: Gen[T]) -> T:
    """Run a protocol generator to its end on this event loop; return what it returns."""
    host: LoopHost = run.host
    db = host.db
    branches, task = _enter(run)
    lease = _Lease(host)
    app: AsyncAppTransaction | None = None
    value: Any = None
    error: BaseException | None = None
    parking = False  # this call holds the run's turn to park it
    escaping: BaseException | None = None
    try:
        while True:
            before = run.journal.next_seq
            try:
                op = gen.send(value) if error is None else gen.throw(error)
            except StopIteration as stop:
                branches.took(run, task, before)
                result: T = stop.value  # what the generator returned, typed by Gen[T]
                return result
            value = error = None
            try:
                branches.took(run, task, before)
            except BranchOrderError as refused:
                error = refused  # thrown into the call before anything of it runs
                continue
            try:
                # Statements and the writer's queue: on the lease, nothing waits. A
                # statement is handed on by its operation's `op.name` (never SQL text).
                match op:
                    case ops.Execute(serial=True):
                        if branches.serial.locked():
                            await lease.release()  # the branch whose turn it is may need it
                        async with branches.serial:
                            conn = await lease.get()
                            value = await db.run_on_async(conn, op.name, op.params, op.fetch)
                        continue
                    case ops.Execute():
                        conn = await lease.get()
                        value = await db.run_on_async(conn, op.name, op.params, op.fetch)
                        continue
                    case ops.WriteSteps(rows=rows, finish=finish):
                        conn = await lease.get()
                        value = await db.write_steps_async(conn, rows, finish)
                        continue
                    case ops.Enqueue(row=row):
                        assert host.writer is not None
                        host.writer.put(row)
                        continue
                    case ops.Call() | ops.AppCall():
                        if run.parked:  # a sibling parked the run: its record would be refused
                            raise WorkflowSuspended(run.workflow_id)
                        await _prove_claim(run, db, lease)
                await lease.release()  # what follows may wait: hold no connection meanwhile
                match op:
                    case ops.Call(body=True):
                        branches.body = task
                        with branches.idle(task):  # waits on its branches, runs none itself
                            value = await _call(run, op)
                    case ops.Call():
                        value = await _call(run, op)
                        if run.settings.observe_step is not None:
                            run.settings.observe_step(op.scope, value)
                    case ops.Park():
                        with branches.idle(task):
                            value = await branches.park(run, task)
                        parking = not value
                    case ops.AwaitWriter():
                        if host.writer is not None:
                            await asyncio.to_thread(host.writer.wait, run.workflow_id, run.epoch)
                    case ops.Pause(seconds=seconds):
                        await asyncio.sleep(seconds)
                    case ops.LeaseClock():
                        value = (time.monotonic(), db.outage.renewed_at)
                    case ops.RunChild():
                        try:
                            value = Outcome(await host.run_child(op))
                        except Exception as exc:
                            value = Outcome(None, exc)
                    case ops.AppBegin(isolation_level=isolation_level):
                        app = AsyncAppTransaction(db, host.app_connection(isolation_level))
                        await app.begin()
                    case ops.AppExecute():
                        assert app is not None and app.conn is not None
                        value = await db.app_run_async(app.conn, op.name, op.params, op.fetch)
                    case ops.AppCall(args=args):
                        assert app is not None
                        value = await _call(run, op, (app.conn, *args))
                        if run.settings.observe_step is not None:
                            run.settings.observe_step(op.scope, value)
                    case ops.AppEnd(commit=commit, last=last):
                        if app is not None:
                            ending, app = app, None
                            value = await ending.end(commit, last)
                    case ops.Join():
                        with branches.idle(task):
                            await _join(run)
                    case _:  # pragma: no cover - a protocol bug
                        raise TypeError(f"unknown protocol operation {op!r}")
            except BaseException as exc:
                error = await lease.release_after(exc) if lease.held else exc
    except BaseException as exc:
        escaping = exc
        if isinstance(exc, WorkflowSuspended | WorkflowInterrupted):
            branches.ending_run(task)
        raise
    finally:
        branches.leave(task, parking)
        try:
            await lease.release(escaping)
        finally:
            if app is not None:
                await app.end(False)


class _Branches:
    """The tasks of one async run that made durable calls (its branches: the body's task
    and the tasks of asyncio.gather), and which of them are inside a durable call now.

    A task is busy while one of its durable calls is in progress, except while it waits
    for others: the body waiting on its branches, a Join, a Park. Parking the workflow
    waits until no other task is busy, and one branch at a time holds the turn to park
    it; the others then join its suspension (Park). `serial` sends the run's ledger
    statements one at a time (Execute.serial)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.busy: dict[asyncio.Task[Any], int] = {}
        self.turn: asyncio.Task[Any] | None = None
        self.changed = asyncio.Event()
        self.serial = asyncio.Lock()
        # The task running the workflow body (its host's), and the other tasks whose
        # durable call raised the run's end (its suspension or its stop).
        self.body: asyncio.Task[Any] | None = None
        self.ended_run: set[asyncio.Task[Any]] = set()
        # The last journal position each branch took (the body's are not checked: it
        # waits for its branches, so what they take in between is not timing).
        self.last_taken: dict[asyncio.Task[Any], int] = {}

    def took(self, run: Run, task: asyncio.Task[Any] | None, before: int) -> None:
        """Note the positions the calling task's last step of a generator took (from
        `before` to the journal's next position now: a step of a generator runs without
        awaiting, so no sibling took any of them), after checking a branch takes them right
        after its previous ones (protocol.check_branch_order)."""
        after = run.journal.next_seq
        if after == before or task is None or task is self.body:
            return
        protocol.check_branch_order(run, self.last_taken.get(task), before)
        self.last_taken[task] = after - 1

    def enter(self, task: asyncio.Task[Any]) -> None:
        if task not in self.tasks:
            self.tasks.add(task)
            task.add_done_callback(self._ended)
        self.busy[task] = self.busy.get(task, 0) + 1

    def leave(self, task: asyncio.Task[Any] | None, parking: bool) -> None:
        if task is None:
            return
        if task in self.busy:
            self.busy[task] -= 1
        if parking and self.turn is task:
            self.turn = None
        self.changed.set()

    def ending_run(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None and task is not self.body:
            self.ended_run.add(task)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if task in self.ended_run:
            self.ended_run.discard(task)
            if not task.cancelled():
                # A branch made with asyncio.create_task that the body never awaited ends
                # with the run's suspension or stop: nobody's to read (the run is over),
                # and not an error for asyncio to log as never retrieved.
                task.exception()
        self.tasks.discard(task)
        self.busy.pop(task, None)
        if self.turn is task:
            self.turn = None
        self.changed.set()

    @contextlib.contextmanager
    def idle(self, task: asyncio.Task[Any] | None) -> Iterator[None]:
        """The task waits for other tasks of the run: it does not hold a park back."""
        if task is None or task not in self.busy:
            yield
            return
        self.busy[task] -= 1
        self.changed.set()
        try:
            yield
        finally:
            self.busy[task] += 1

    async def park(self, run: Run, task: asyncio.Task[Any] | None) -> bool:
        """Wait for the turn to park the run (no other task busy, no other turn held):
        False, this task parks it; True once a sibling has parked it."""
        while True:
            if run.parked:
                return True
            if self.turn is None and not any(
                n > 0 for t, n in self.busy.items() if t is not task and not t.done()
            ):
                self.turn = task
                return False
            self.changed.clear()
            await self.changed.wait()


def _enter(run: Run) -> tuple[_Branches, asyncio.Task[Any] | None]:
    """Count the calling task among the run's branches (until it ends), busy for the
    durable call that begins."""
    branches: _Branches | None = run.branches
    if branches is None:
        branches = run.branches = _Branches()
    task = asyncio.current_task()
    if task is not None:
        branches.enter(task)
    return branches, task


async def _join(run: Run) -> None:
    """Wait for the run's other branches (gather branches still making durable calls after
    the workflow body returned or raised)."""
    me = asyncio.current_task()
    while True:
        branches: _Branches | None = run.branches
        others = [t for t in (branches.tasks if branches else ()) if t is not me and not t.done()]
        if not others:
            return
        await asyncio.wait(others)


async def _prove_claim(run: Run, db: SystemDB, lease: _Lease) -> None:
    """The sync driver's _prove_claim, on the lease's connection."""
    outage = db.outage
    check = protocol.reclaim(run, outage.doubts, outage.renewed_at, time.monotonic())
    if check is not None:
        row = await db.run_on_async(await lease.get(), check.name, check.params, check.fetch)
        protocol.proven(run, check, row)


async def _call(run: Run, op: ops.Call | ops.AppCall, args: Sequence[Any] | None = None) -> Outcome:
    """Await user code (a sync function runs in a worker thread). A step's (or a
    transaction's) attempt is watched: its workflow's cancellation cancels it at its next
    await, and past its timeout it is cancelled and fails with StepTimeoutError."""
    fn = op.fn
    call_args = op.args if args is None else args
    scope = op.scope
    timeout = op.timeout if isinstance(op, ops.Call) else None
    host: LoopHost = run.host
    task = asyncio.current_task()
    began = time.perf_counter()
    token = current_step.set(scope) if scope is not None else None
    # An attempt that may be given up (a sync one's thread runs on) names itself to its
    # heartbeats; any other is the step's live attempt while it runs.
    attempt = (
        current_attempt.set(scope.live)
        if scope is not None and (timeout is not None or scope.heartbeat_timeout)
        else None
    )
    # A step's or a transaction's attempt may be cut short; an effect's call is not (the
    # outside world may be half-way through it: it finishes and is settled).
    watched = (
        task is not None and scope is not None and (scope.charging or isinstance(op, ops.AppCall))
    )
    if watched:
        host.watch(run, task)  # type: ignore[arg-type]
    span = tracing.step_span(run, scope)
    traced = span.__enter__()
    try:
        if watched:
            # A cancel that arrived before this attempt was watched (during a backoff, or
            # between the step's check and here) is seen now, not after the attempt.
            reason = protocol.stop_reason(run)
            if reason is not None:
                raise WorkflowInterrupted(run.workflow_id, reason, reason == TIMEOUT_REASON)
        if not _is_async(fn):
            # A sync function in a thread; a sync durable function called by the workflow
            # itself (a compensation) is journaled through this driver, in call order. A
            # step's thread given up is left to run on: its result is dropped.
            hop = to_thread if scope is None else asyncio.to_thread
            code = hop(fn, *call_args, **op.kwargs)
        else:
            code = fn(*call_args, **op.kwargs)
        left = _until_deadline(run) if watched else None
        beats = None if scope is None or not watched else scope.heartbeat_timeout
        limit = min((t for t in (timeout, left, beats) if t is not None), default=None)
        if limit is None:
            value = await code
        else:
            assert scope is not None
            started = scope.beat_at = time.monotonic()
            window = asyncio.timeout(limit)
            if beats is not None:
                scope.on_beat = _rescheduler(window, scope, started, timeout, left)
            try:
                async with window:
                    value = await code
            except TimeoutError:
                if not window.expired():
                    raise  # the step's own TimeoutError
                now = time.monotonic()
                if left is not None and now >= started + left - 0.01:
                    # The workflow's deadline passed during the step: it stops now.
                    raise WorkflowInterrupted(run.workflow_id, TIMEOUT_REASON, True) from None
                # (a timer may fire a clock tick early: the deadline is reached)
                ends = protocol.attempt_deadline(scope, started, timeout)
                assert ends is not None
                error = protocol.give_up(scope, started, timeout, max(now, ends[0]))
                assert error is not None
                traced(error)
                return Outcome(None, error, time.perf_counter() - began)
            finally:
                scope.on_beat = None
    except Exception as exc:
        traced(exc)
        return Outcome(None, exc, time.perf_counter() - began)
    except WorkflowInterrupted:
        # Raised by the step's code at a heartbeat (its workflow's cancel). A cancellation
        # the host sent the task meanwhile, still to be delivered, is spent here rather
        # than at the driver's next await.
        if watched and host.unwatch(run, task):  # type: ignore[arg-type]
            watched = False
            task.uncancel()  # type: ignore[union-attr]
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)
        raise
    except asyncio.CancelledError as exc:
        traced(exc)
        if watched and host.unwatch(run, task):  # type: ignore[arg-type]
            watched = False
            # Cancelled by this run's cancellation (not by the loop): the workflow stops.
            task.uncancel()  # type: ignore[union-attr]
            reason = protocol.stop_reason(run) or "cancelled"
            raise WorkflowInterrupted(run.workflow_id, reason, reason == TIMEOUT_REASON) from None
        raise
    finally:
        span.__exit__(None, None, None)
        if watched:
            host.unwatch(run, task)  # type: ignore[arg-type]
        if attempt is not None:
            current_attempt.reset(attempt)
        if token is not None:
            current_step.reset(token)
    return Outcome(value, None, time.perf_counter() - began)


def _rescheduler(
    window: asyncio.Timeout,
    scope: ops.StepScope,
    started: float,
    timeout: float | None,
    left: float | None,
) -> Callable[[], None]:
    """What a heartbeat of the attempt does: move its window's end to its new deadline
    (from the step's code on the loop, or from its thread)."""
    loop = asyncio.get_running_loop()

    def move() -> None:
        ends = protocol.attempt_deadline(scope, started, timeout)
        candidates = [] if ends is None else [ends[0]]
        if left is not None:
            candidates.append(started + left)
        if candidates:
            with contextlib.suppress(RuntimeError):  # the window was left meanwhile
                window.reschedule(loop.time() + (min(candidates) - time.monotonic()))

    def on_beat() -> None:
        if threading.get_ident() == loop_thread:
            move()
        else:
            loop.call_soon_threadsafe(move)

    loop_thread = threading.get_ident()
    return on_beat


def _until_deadline(run: Run) -> float | None:
    """Seconds left before the workflow's timeout, when the clock is the system's (a test's
    fake clock moves only when told, so it cannot arm a timer)."""
    clock = run.settings.clock
    if run.deadline is None or run.stopping or not clock.is_system:
        return None  # (a stopping run's compensations are not cut short)
    return max(0.0, (run.deadline - clock.now()).total_seconds())


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object whose __call__ is async def
    )


async def execute_run_async(
    host: LoopHost, run: Run, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """Run one claimed async workflow on this loop: the body, then its outcome."""
    run.host = host
    with running(run, host.active), tracing.run_span(run):
        return await drive_async(run, protocol.workflow(run, defn, args, kwargs))


# -- entry points of the decorators (async def functions) --------------------------------------


async def call_workflow(defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    run = async_run(f"workflow {defn.name!r}")
    if run is not None:
        return await drive_async(run, protocol.child(run, defn, args, kwargs))
    return await engine_for(defn, is_async=True)._run_direct_async(defn, args, kwargs)


async def call_step(defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    run = async_run(f"step {defn.name!r}")
    if run is None:
        return await defn.fn(*args, **kwargs)
    replayed = protocol.replayed_step(run, defn)
    if replayed is not protocol.NOT_JOURNALED:
        return replayed
    return await drive_async(run, protocol.step(run, defn, args, kwargs))


async def call_transaction(defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    run = async_run(f"transaction {defn.name!r}")
    if run is None:
        engine = engine_for(defn, is_async=True)
        async with engine.app_connection_async(defn.isolation_level) as conn:
            async with conn.begin():
                return await defn.fn(conn, *args, **kwargs)
    return await drive_async(run, protocol.transaction(run, defn, args, kwargs))


async def call_effect(defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    run = async_run(f"effect {defn.name!r}")
    if run is None:
        check_effect_key(defn, kwargs)
        return await defn.fn(*args, **kwargs)
    return await drive_async(run, protocol.effect(run, defn, args, kwargs))


async def to_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run a sync function in a worker thread from async code, without blocking the loop.

    From an async workflow's code, a sync @step, @tool, @effect or @transaction (or a sync
    workflow, as a child) is journaled like an awaited async one: its position is taken
    here, in call order, and only its user code runs in the thread. Anything else is
    `asyncio.to_thread`."""
    run = workflow_code_run()
    if run is None or not run.is_async:
        return await asyncio.to_thread(fn, *args, **kwargs)
    # A bound method's object (or class) is the first argument of its definition's call.
    call_args: Sequence[Any] = (fn.__self__, *args) if inspect.ismethod(fn) else args
    step_defn = getattr(fn, "__durable_step__", None)
    if step_defn is not None:
        gen = {
            "transaction": protocol.transaction,
            "effect": protocol.effect,
        }.get(step_defn.kind.value, protocol.step)
        step_defn, call_args = methods.bind(step_defn, call_args)
        return await drive_async(run, gen(run, step_defn, call_args, kwargs))
    workflow_defn = getattr(fn, "__durable_workflow__", None)
    if workflow_defn is not None:
        return await drive_async(run, protocol.child(run, workflow_defn, call_args, kwargs))
    return await asyncio.to_thread(fn, *args, **kwargs)
