"""The sync driver: performs what the protocol's generators ask, on a psycopg connection.

`drive(run, gen)` sends each operation's result back into the generator (or throws its
exception into it) until the generator returns: psycopg's `waiting.wait()` for our
`_core`. Every decision is in `_core`; here is only I/O: the run's connection,
the application transaction, the background writer, user code, child runs and sleeping.
An async driver runs the same generators with `await`.

The decorators' entry points live here too: a decorated call outside a run calls the
function plainly; inside a run it drives the matching protocol generator.
"""

from __future__ import annotations

import contextvars
import inspect
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, TypeVar

from durable import _core as protocol
from durable._core import (
    AppBegin,
    AppCall,
    AppEnd,
    AppExecute,
    AwaitWriter,
    Call,
    Enqueue,
    Execute,
    Finish,
    Gen,
    Join,
    LeaseClock,
    Outcome,
    Park,
    Pause,
    RecordStep,
    Run,
    RunChild,
    StepScope,
    WriteSteps,
)
from durable._io.runio import AppTransaction
from durable._io.runio_base import node_down
from durable._run import tracing
from durable._run.context import (
    Host,
    check_effect_key,
    current_attempt,
    current_run,
    current_step,
    engine_for,
    running,
    sync_run,
)
from durable.errors import AsyncInSyncError, DatabaseUnavailableError, NoEngineError

if TYPE_CHECKING:
    from durable._base.registry import StepDef, WorkflowDef
    from durable._io.systemdb import SystemDB

T = TypeVar("T")


def _call(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    scope: StepScope | None,
    run: Run,
    timeout: float | None = None,
) -> Outcome:
    if run.traced:
        with tracing.step_span(run, scope) as traced:
            return _attempt(fn, args, kwargs, scope, timeout, traced)
    return _attempt(fn, args, kwargs, scope, timeout, None)


# What a step returns most often, which no awaitable is (inspect.isawaitable asks an ABC).
_NEVER_AWAITABLE = frozenset({dict, list, str, int, float, bool, type(None), tuple, bytes})


def _attempt(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    scope: StepScope | None,
    timeout: float | None,
    traced: Callable[[BaseException | None], None] | None,
) -> Outcome:
    began = time.perf_counter()
    token = current_step.set(scope) if scope is not None else None
    try:
        if scope is not None and (timeout is not None or scope.heartbeat_timeout):
            value = _watched(fn, args, kwargs, scope, timeout)
        else:
            value = fn(*args, **kwargs)
    except Exception as exc:
        if traced is not None:
            traced(exc)
        return Outcome(None, exc, time.perf_counter() - began)
    finally:
        if token is not None:
            current_step.reset(token)
    if type(value) not in _NEVER_AWAITABLE and inspect.isawaitable(value):
        error = _awaitable_in_sync_code(fn, value)
        if traced is not None:
            traced(error)
        return Outcome(None, error, time.perf_counter() - began)
    return Outcome(value, None, time.perf_counter() - began)


def _watched(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    scope: StepScope,
    timeout: float | None,
) -> Any:
    """Run a def step's attempt that may be given up (its timeout, its heartbeat_timeout)
    in a worker thread, and wait for it no longer than the core says. A thread cannot be
    stopped: a given-up attempt's thread runs on, its heartbeats refused and its result
    dropped here (only the step's generator records, and it has moved on)."""
    context = contextvars.copy_context()  # the run and the step, as set
    context.run(current_attempt.set, scope.live)  # which attempt the thread's code is
    box: list[tuple[Any, BaseException | None]] = []
    done = threading.Event()

    def attempt() -> None:
        try:
            box.append((context.run(fn, *args, **kwargs), None))
        except BaseException as exc:  # handed to the caller: a cancel, too
            box.append((None, exc))
        finally:
            done.set()

    began = scope.beat_at = time.monotonic()
    threading.Thread(target=attempt, name=f"durable-step-{scope.name}", daemon=True).start()
    while True:
        now = time.monotonic()
        given_up = protocol.give_up(scope, began, timeout, now)
        if given_up is not None:
            raise given_up
        deadline = protocol.attempt_deadline(scope, began, timeout)
        assert deadline is not None
        if done.wait(max(0.0, deadline[0] - now)):
            break
    value, error = box[0]
    if error is not None:
        raise error
    return value


def _awaitable_in_sync_code(fn: Callable[..., Any], value: Any) -> AsyncInSyncError:
    """A sync workflow or step that handed back an awaitable (an async step or workflow
    called without `await`, which a sync function cannot do)."""
    close = getattr(value, "close", None)
    if callable(close):
        close()  # a coroutine never awaited: no RuntimeWarning at exit on top of this
    name = getattr(fn, "__qualname__", repr(fn))
    return AsyncInSyncError(
        f"{name!r} returned an awaitable ({type(value).__qualname__}): a sync workflow or "
        "step cannot await an async step, workflow or function; make the caller "
        "`async def` and `await` the call"
    )


def _prove_claim(run: Run, db: SystemDB, conn: Any) -> None:
    """Before the run's code: when its lease may have lapsed (an outage, a late
    heartbeat), prove that the claim still holds (see _core.reclaim)."""
    outage = db.outage
    check = protocol.reclaim(run, outage.doubts, outage.renewed_at, time.monotonic())
    if check is not None:
        protocol.proven(run, check, db.run_on(conn, check.name, check.params, check.fetch))


# The operations performed on the run's own connection (a Call proves the claim on it).
_ON_CONN = (Execute, WriteSteps, Call, AppCall)


def _reconnect(run: Run) -> Any:
    """A new connection for a run whose own an outage closed, kept until the run ends (see
    execute_run): a write the core sends again once the database answers goes on it."""
    checkouts: ExitStack | None = run.checkouts
    if checkouts is None:
        raise DatabaseUnavailableError("lost the run's connection to the system database")
    run.conn = checkouts.enter_context(run.host.db.connection())
    return run.conn


def _drop(run: Run, conn: Any) -> None:
    """An outage came through the run's connection: close it (a connection to a server
    turned standby still looks open, and would refuse every later write), so that the next
    statement checks out a new one rather than fail on it."""
    if conn is not None:
        conn.close()
    if run.conn is conn:
        run.conn = None


def drive(run: Run, gen: Gen[T]) -> T:
    """Run a protocol generator to its end on this thread; return what it returns."""
    host: Host = run.host
    db = host.db
    app: AppTransaction | None = None
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            op = gen.send(value) if error is None else gen.throw(error)  # StopIteration: done
            value = error = None
            # Read at every operation: a nested call (a step inside the body's Call) may
            # have replaced a connection an outage closed.
            conn = run.conn
            try:
                if conn is None and isinstance(op, _ON_CONN):
                    conn = _reconnect(run)
                # A statement is handed on by its operation's `op.name` (never SQL text).
                # This match runs once per operation: the classes are module globals, one
                # read fewer per case than the async driver's `ops.Execute`.
                match op:
                    case RecordStep():
                        # Records (and outcomes) of runs writing together share a commit;
                        # each returns once its own is committed.
                        value = db.records.record(conn, op.params)
                    case Call():
                        _prove_claim(run, db, conn)
                        value = _call(op.fn, op.args, op.kwargs, op.scope, run, op.timeout)
                        if run.settings.observe_step is not None:
                            run.settings.observe_step(op.scope, value)
                    case Finish():
                        value = db.finishes.finish(conn, op.params)
                    case Execute():
                        value = db.run_on(conn, op.name, op.params, op.fetch)
                    case WriteSteps(rows=rows, finish=finish):
                        value = db.write_steps(conn, rows, finish)
                    case Enqueue(row=row):
                        assert host.writer is not None
                        host.writer.put(row)
                    case AwaitWriter():
                        if host.writer is not None:
                            host.writer.wait(run.workflow_id, run.epoch)
                    case Pause(seconds=seconds):
                        time.sleep(seconds)
                    case LeaseClock():
                        value = (time.monotonic(), db.outage.renewed_at)
                    case RunChild():
                        try:
                            value = Outcome(host.run_child(op))
                        except Exception as exc:
                            value = Outcome(None, exc)
                        if conn is not None and conn.closed:
                            run.conn = None  # an outage in the child, which shared it
                    case AppBegin(isolation_level=isolation_level):
                        app = AppTransaction(db, host.app_connection(isolation_level))
                        app.begin()
                    case AppExecute():
                        assert app is not None and app.conn is not None
                        value = db.app_run(app.conn, op.name, op.params, op.fetch)
                    case AppCall(fn=fn, args=args, kwargs=kwargs, scope=scope):
                        assert app is not None
                        _prove_claim(run, db, conn)
                        value = _call(fn, (app.conn, *args), kwargs, scope, run)
                        if run.settings.observe_step is not None:
                            run.settings.observe_step(scope, value)
                    case AppEnd(commit=commit, last=last):
                        if app is not None:
                            ending, app = app, None
                            value = ending.end(commit, last)
                    case Join():
                        pass  # a sync run has no branches
                    case Park():
                        value = False  # nor a sibling to wait for
                    case _:  # pragma: no cover - a protocol bug
                        raise TypeError(f"unknown protocol operation {op!r}")
            except BaseException as exc:
                error = exc
                if (
                    isinstance(exc, DatabaseUnavailableError)
                    and isinstance(op, _ON_CONN)
                    and not node_down(exc)
                ):
                    _drop(run, conn)
    except StopIteration as stop:
        result: T = stop.value  # what the generator returned, typed by Gen[T]
        return result
    finally:
        if app is not None:
            app.end(False)


def execute_run(
    host: Host,
    run: Run,
    defn: WorkflowDef,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    conn: Any = None,
) -> Any:
    """Run one claimed workflow on this thread: the body, then its outcome.

    The run writes through one connection, checked out once (a checkout per step costs
    about as much as the step's own client-side work): `conn` if the caller holds one
    (it created the workflow on it), else a child called inline shares its parent's (one
    per thread, so nested runs cannot exhaust the pool), else one from the pool."""
    run.host = host
    outer = current_run.get()
    if conn is None and outer is not None and outer.conn is not None:
        conn = outer.conn
    with ExitStack() as checkouts:
        # Connections the run checks out when an outage closed the one it had (_reconnect).
        run.checkouts = checkouts
        try:
            if conn is not None:
                run.conn = conn
                return _execute(host, run, defn, args, kwargs)
            with host.db.connection() as conn:
                run.conn = conn
                return _execute(host, run, defn, args, kwargs)
        finally:
            run.checkouts = None


def _execute(
    host: Host, run: Run, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    with running(run, host.active), tracing.run_span(run):
        return drive(run, protocol.workflow(run, defn, args, kwargs))


# -- entry points of the decorators ------------------------------------------------------------


def call_workflow(defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    run = sync_run(f"workflow {defn.name!r}")
    if run is not None:
        return drive(run, protocol.child(run, defn, args, kwargs))
    return engine_for(defn)._run_direct(defn, args, kwargs)


def call_step(defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    run = current_run.get()
    if run is None or run.is_async or current_step.get() is not None:
        run = sync_run(f"step {defn.name!r}")  # (its words only when it raises)
    if run is None:
        return defn.fn(*args, **kwargs)
    replayed = protocol.replayed_step(run, defn)
    if replayed is not protocol.NOT_JOURNALED:
        return replayed
    return drive(run, protocol.step(run, defn, args, kwargs))


def call_transaction(defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    run = sync_run(f"transaction {defn.name!r}")
    if run is None:
        with engine_for(defn).app_connection(defn.isolation_level) as conn, conn.begin():
            return defn.fn(conn, *args, **kwargs)
    return drive(run, protocol.transaction(run, defn, args, kwargs))


def call_effect(defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """Run an effect exactly once per workflow position (or per user key), write-ahead."""
    run = sync_run(f"effect {defn.name!r}")
    if run is None:
        check_effect_key(defn, kwargs)
        return defn.fn(*args, **kwargs)
    return drive(run, protocol.effect(run, defn, args, kwargs))


def compensate(undo: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Register an undo (an @effect) for what the workflow just did; it runs, in reverse
    order with the others, if the workflow fails."""
    run = current_run.get()
    if run is None:
        raise NoEngineError("durable.compensate() is only meaningful inside a workflow")
    protocol.register_compensation(run, undo, args, kwargs)
