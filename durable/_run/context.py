"""Context variables: which engine is active and which workflow run is executing.

ContextVars (not thread-locals or globals) keep concurrent runs in one process apart, and
carry over to asyncio tasks. The engine is seen through the small protocol below, so this
module (and everything the decorators reach) does not import the engine; so is a run's
host, by either driver (`Host`, `LoopHost`: what each asks of the Runner or of an event
loop's AsyncHost, beyond what both ask, `RunHost`).

What both drivers read through them lives here too, once: the context a run's body runs
in (`running`), the run a durable call of the workflow function belongs to
(`workflow_run`, and for a decorated call `sync_run`, `async_run`), and where a decorated
call made outside any workflow goes (`engine_for`, `check_effect_key`), with the errors
that say what to do instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from durable._base.registry import WorkflowDef
from durable._core import Run, StepScope
from durable._run.active import RunsHere
from durable._run.active_async import AsyncRunsHere
from durable.errors import (
    AsyncInSyncError,
    BlockingCallError,
    ConfigurationError,
    EffectOutsideWorkflowError,
    NoEngineError,
)

if TYPE_CHECKING:
    import asyncio

    import psycopg
    import sqlalchemy
    import sqlalchemy.ext.asyncio

    from durable._base.registry import StepDef
    from durable._core import RunChild
    from durable._io.durability import AsyncWriter
    from durable._io.systemdb import SystemDB


class ActiveEngine(RunsHere, AsyncRunsHere, Protocol):
    """What code outside a run needs from the engine of `with durable.Engine():` (its
    direct run and application connection, in both forms: `_run/active_async.py`)."""

    def enqueue(self, queue: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any: ...

    @property
    def client(self) -> Any: ...  # its durable.Client (a debouncer records through it)


class RunHost(Protocol):
    """What a run's driver needs from whatever runs it, in either driver (the Runner, an
    event loop's AsyncHost): the system database, the background writer of async
    durability, and the engine the run's code sees as active."""

    @property
    def db(self) -> SystemDB: ...

    @property
    def writer(self) -> AsyncWriter | None: ...

    @property
    def active(self) -> ActiveEngine: ...


class Host(RunHost, Protocol):
    """What a sync run needs from the process that runs it (the engine's Runner), beyond
    RunHost: the application database of its @transaction steps, and its child runs."""

    def app_connection(
        self, isolation_level: str | None = None
    ) -> AbstractContextManager[sqlalchemy.Connection]: ...

    def run_child(self, op: RunChild) -> Any: ...


class LoopHost(RunHost, Protocol):
    """What an async run needs from the event loop that runs it (`_async_host`), beyond
    RunHost: the loop's pool of the system database, the application database, its child
    runs, and a watch on the tasks of its steps (a cancel of the workflow interrupts them)."""

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...

    def app_connection(
        self, isolation_level: str | None = None
    ) -> AbstractAsyncContextManager[sqlalchemy.ext.asyncio.AsyncConnection]: ...

    async def run_child(self, op: RunChild) -> Any: ...

    def watch(self, run: Run, task: asyncio.Task[Any]) -> None: ...

    def unwatch(self, run: Run, task: asyncio.Task[Any]) -> bool: ...


current_engine: ContextVar[ActiveEngine | None] = ContextVar("durable_engine", default=None)
current_run: ContextVar[Run | None] = ContextVar("durable_run", default=None)
current_step: ContextVar[StepScope | None] = ContextVar("durable_step", default=None)
# The attempt of the current step whose code is running here (durable.heartbeat() names it:
# a given-up attempt's thread, still running, is told apart from the next attempt's).
current_attempt: ContextVar[int | None] = ContextVar("durable_attempt", default=None)


@contextmanager
def running(run: Run, engine: ActiveEngine) -> Iterator[None]:
    """The context of a run's body: the run is current, with no step (a workflow started
    inside a step is a run of its own) and its engine active; afterwards, all three as
    they were."""
    run_token = current_run.set(run)
    step_token = current_step.set(None)
    engine_token = current_engine.set(engine)
    try:
        yield
    finally:
        current_run.reset(run_token)
        current_step.reset(step_token)
        current_engine.reset(engine_token)


def workflow_code_run() -> Run | None:
    """The run whose workflow function (not one of its steps) is calling, if any: where a
    decorated call is journaled. Inside a step's code, decorated calls are plain calls."""
    run = current_run.get()
    if run is None or current_step.get() is not None:
        return None
    return run


def refuse_in_workflow(what: str) -> None:
    """ConfigurationError if workflow code (not a step) calls `what`, a call made from
    outside workflows whose writes a replay would not know it made."""
    if workflow_code_run() is not None:
        raise ConfigurationError(
            f"{what} is not made from workflow code: start the workflow there with "
            "durable.start_child (or a client's submit) and send to it with durable.send"
        )


def workflow_run(what: str, is_async: bool = False) -> Run:
    """The run of the calling workflow function (not of a step), for `what`, a durable call
    only a workflow makes (`is_async`: its awaited twin); else NoEngineError. From a
    workflow of the other kind, the error names the twin to call instead."""
    run = workflow_code_run()
    if run is None:
        where = "awaited in" if is_async else "called from"
        raise NoEngineError(f"{what} must be {where} a workflow (not a step)")
    if run.is_async != is_async:
        if is_async:
            raise AsyncInSyncError(
                f"{what} is for async workflows; in the plain-def workflow {run.name!r} call "
                f"{what.replace('_async', '')} instead"
            )
        twin = what.replace("()", "_async()")
        raise BlockingCallError(
            f"{what} would block the event loop of async workflow {run.name!r}: "
            f"write `await {twin}`"
        )
    return run


def refuse_on_loop(run: Run, what: str) -> None:
    """BlockingCallError for a sync call `what` ("durable.send()") made on a running event
    loop by a step's code (an async step): the call would hold the loop, and every workflow
    on it, until it returns. The error names the awaited twin."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return  # a thread of its own: a sync step
    twin = what.replace("()", "_async(...)")
    raise BlockingCallError(
        f"{what} in a step of async workflow {run.name!r} would block its event loop: "
        f"write `await {twin}`"
    )


def sync_run(what: str) -> Run | None:
    """The sync run whose workflow code is calling, None outside one. From an async
    workflow this would block its event loop: BlockingCallError, with the fix."""
    run = workflow_code_run()
    if run is not None and run.is_async:
        raise BlockingCallError(
            f"{what} is a plain def called from async workflow {run.name!r}, where it would "
            "block the event loop: write `await durable.to_thread(fn, ...)`"
        )
    return run


def async_run(what: str) -> Run | None:
    """The async run whose workflow code is calling, None outside one; a sync run here is
    a sync workflow that cannot await (AsyncInSyncError)."""
    run = workflow_code_run()
    if run is not None and not run.is_async:
        raise AsyncInSyncError(
            f"{what} is async, but the workflow calling it ({run.name!r}) is a plain def: "
            "make that workflow `async def` and `await` the call"
        )
    return run


def engine_for(defn: WorkflowDef | StepDef, is_async: bool = False) -> ActiveEngine:
    """The engine a decorated workflow or transaction called outside any workflow code
    goes to: in a step's code, its run's; else the one of the enclosing `with
    durable.Engine(...)`. Without one, NoEngineError says where to call it from (in the
    words of an awaited call, `is_async`)."""
    outer = current_run.get()
    engine = outer.host.active if outer is not None else current_engine.get()
    if engine is not None:
        return engine
    within = "async with" if is_async else "with"
    if isinstance(defn, WorkflowDef):
        start = "await engine.start_async" if is_async else "engine.start"
        raise NoEngineError(
            f"workflow {defn.name!r} was called with no active engine: wrap the call in "
            f"`{within} durable.Engine(...) as engine:` or use {start}(fn, ...)"
        )
    raise NoEngineError(
        f"transaction {defn.name!r} needs a database connection: call it inside "
        f"`{within} durable.Engine(...):`"
    )


def check_effect_key(defn: StepDef, kwargs: Mapping[str, Any]) -> None:
    """An effect called outside any workflow runs plainly, under the key its caller passes;
    without one, EffectOutsideWorkflowError."""
    if "idempotency_key" not in kwargs:
        raise EffectOutsideWorkflowError(
            f"effect {defn.name!r} was called outside a workflow without a key: call it "
            "from a workflow, or pass idempotency_key=... yourself"
        )
