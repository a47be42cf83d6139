"""Where async def workflows run: event loops, with a connection pool each.

An async workflow started from an application's event loop (`await engine.start_async`)
runs as a task on that loop, so its steps may use the clients the application made there.
Recovered workflows, and async workflows reached from sync code, run on the engine's own
loop: one thread with one event loop. Each loop has its own `AsyncHost`: a psycopg
AsyncConnectionPool of the system database, SQLAlchemy's async engine for @transaction
steps, and the tasks of the runs it holds. A waiting async workflow holds nothing: its
task ends at the suspension, like a sync run's thread does.

Claims and status reads are the Runner's, made in a worker thread; the insert that creates
a workflow started here goes on this loop's pool (the lifecycle host, `_host_async`), and
so does the run itself (every journal read and write of its steps), awaited here.

No exception from a workflow's code ends a loop. asyncio lets two of them out of a task
and out of the loop itself: SystemExit and KeyboardInterrupt. Out of a step they unwind the
run as in a sync run (it is given up at once and counted as a recovery attempt), and the
run's task ends there without raising them again (but for a KeyboardInterrupt on the main
thread, which may be the user's Ctrl-C); one that escapes all the same (from a task or a
callback the workflow's code made) is logged, and the engine's loop runs on. If
the engine's loop dies anyway (its own machinery failed), its runs are given up and let go
(the heartbeat stops renewing them, so other workers take them over), nothing more is run
on it, and a worker stops with an error so that its supervisor restarts the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from psycopg_pool import PoolTimeout

from durable._core import Run, RunChild, lifecycle
from durable._host.runner import Runner
from durable._io.local import Claimed
from durable._io.runio_base import watch_statements
from durable._run.driver_async import execute_run_async
from durable._run.host_async import AsyncLifeHost, new_run, outcome_of
from durable.errors import (
    EngineNotRunningError,
    WorkflowAbandoned,
    WorkflowInterrupted,
    WorkflowSuspended,
)

if TYPE_CHECKING:
    import psycopg
    import sqlalchemy.ext.asyncio
    from psycopg_pool import AsyncConnectionPool

    from durable._base.registry import WorkflowDef
    from durable._io.durability import AsyncWriter
    from durable._io.systemdb import SystemDB
    from durable._run.context import ActiveEngine

logger = logging.getLogger("durable.async")


class AsyncHost:
    """One event loop's side of a runner (see the module docstring)."""

    def __init__(self, runner: Runner, loop: asyncio.AbstractEventLoop, pool_size: int) -> None:
        self.runner = runner
        self.loop = loop
        self._pool: AsyncConnectionPool = runner.db.async_pool(pool_size)
        self._pool_size = pool_size
        self._app_engine: sqlalchemy.ext.asyncio.AsyncEngine | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # Tasks now in an async step's user code, by workflow id, and those this host
        # cancelled because their workflow was cancelled (told apart from a loop's own).
        self._stepping: dict[str, set[asyncio.Task[Any]]] = {}
        self._interrupted: set[asyncio.Task[Any]] = set()
        # The claims this loop is running (given up if the loop dies under them).
        self._running: dict[str, Claimed] = {}
        self.closed = False
        self.guard: asyncio.Task[Any] | None = None

    async def open(self, timeout: float) -> None:
        try:
            await self._pool.open(wait=True, timeout=timeout)
        except PoolTimeout as exc:
            # No connection to be had: an outage, as a sync run's checkout says it (the
            # pool closed itself).
            raise self.runner.db.error("checkout", exc) from exc
        self.runner.db.watch_async_pool(self._pool, asyncio.get_running_loop())

    async def close(self, wait: bool, grace_seconds: float) -> None:
        """Let the runs of this loop finish (up to `grace_seconds`), then close its pools.
        What is still running is cancelled; its workflows are released at once."""
        if self.closed:
            return
        self.closed = True
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if not t.done() and t is not me]
        if tasks and wait:
            _, pending = await asyncio.wait(tasks, timeout=grace_seconds)
            tasks = list(pending)
            if tasks:
                logger.warning("%d async workflows still running; releasing them", len(tasks))
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self._app_engine is not None:
            await self._app_engine.dispose()
            self._app_engine = None
        # When the loop itself is ending, the pool's worker tasks were cancelled with
        # everything else and its close() stops at them: close its idle connections here.
        idle = list(getattr(self._pool, "_pool", ()))
        self.runner.db.unwatch_async_pool(self._pool)
        try:
            await self._pool.close()
        except asyncio.CancelledError:
            for conn in idle:
                await conn.close()

    # -- what the async driver asks of its host ------------------------------------------------

    @property
    def db(self) -> SystemDB:
        return self.runner.db

    @property
    def writer(self) -> AsyncWriter | None:
        return self.runner.writer

    @property
    def active(self) -> ActiveEngine:
        return self.runner.active

    def connection(self) -> Any:
        return self.db.async_connection(self._pool)

    @asynccontextmanager
    async def app_connection(
        self, isolation_level: str | None = None
    ) -> AsyncIterator[sqlalchemy.ext.asyncio.AsyncConnection]:
        if self._app_engine is None:
            self._app_engine = _async_app_engine(self.runner.app_url, self._pool_size)
        async with self._app_engine.connect() as conn:
            if isolation_level is not None:
                conn = await conn.execution_options(isolation_level=isolation_level)
            yield conn

    def watch(self, run: Run, task: asyncio.Task[Any]) -> None:
        self._stepping.setdefault(run.workflow_id, set()).add(task)

    def unwatch(self, run: Run, task: asyncio.Task[Any]) -> bool:
        """Stop watching `task`; True if this host cancelled it (its workflow's cancel)."""
        tasks = self._stepping.get(run.workflow_id)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._stepping[run.workflow_id]
        if task in self._interrupted:
            self._interrupted.discard(task)
            return True
        return False

    def interrupt(self, workflow_ids: Iterable[str]) -> None:
        """Cancel the async steps now running for these workflows (on the loop's thread)."""
        for workflow_id in workflow_ids:
            for task in list(self._stepping.get(workflow_id, ())):
                if not task.done():
                    self._interrupted.add(task)
                    task.cancel()

    async def run_child(self, op: RunChild) -> Any:
        return await self.run_here(op.defn, op.workflow_id, op.args, op.kwargs, op.parent)

    # -- runs ----------------------------------------------------------------------------------

    async def run_claimed(self, claimed: Claimed, run: Run | None = None) -> Any:
        """Run one claimed workflow on this loop (a sync one in a worker thread)."""
        runner = self.runner
        if not claimed.defn.is_async:
            # On the runner's threads (max_workers of them), not the loop's default
            # executor: a sync run holds a connection for its whole run.
            return await runner.in_pool(runner.execute, claimed)
        run = new_run(runner, claimed) if run is None else run
        run.is_async = True
        runner.hold(claimed)
        self._running[claimed.workflow_id] = claimed
        try:
            return await execute_run_async(self, run, claimed.defn, claimed.args, claimed.kwargs)
        except (Exception, WorkflowSuspended, WorkflowInterrupted):
            raise
        except asyncio.CancelledError:
            # The loop is shutting down under the run: hand the workflow back at once.
            await _quietly(runner, "release_workflow", claimed)
            raise
        except BaseException:
            await _quietly(runner, "abandon_workflow", claimed)  # as Runner.execute
            raise
        finally:
            if self._running.get(claimed.workflow_id) is claimed:
                del self._running[claimed.workflow_id]
            runner.let_go(claimed)

    def running(self) -> list[Claimed]:
        return list(self._running.values())

    async def task(self, claimed: Claimed) -> Any:
        """A claimed run as a task of its own: the Runner's bookkeeping of its end. Its
        result is the stored text of the run's output if it ended SUCCESS, for the handle
        of the process that started it (see _local), else None."""
        run = new_run(self.runner, claimed) if claimed.defn.is_async else None
        try:
            with outcome_of(self.runner, claimed.workflow_id, claimed.epoch):
                await self.run_claimed(claimed, run)
                return None if run is None else run.output
        except (SystemExit, KeyboardInterrupt) as exc:
            # Out of the workflow's code: the run was given up and logged. Raised out of
            # this task, asyncio would raise it out of the loop itself, ending every other
            # run on it (as a sync run's exit ends its thread's work, not the pool). On
            # the main thread a KeyboardInterrupt may be the user's Ctrl-C: theirs to end
            # the program with.
            if isinstance(exc, KeyboardInterrupt) and _on_main_thread():
                raise
        return None

    def spawn(self, claimed: Claimed) -> asyncio.Task[Any]:
        """Start a claimed run as a task of this loop, in a context of its own (closing the
        host waits for it, up to the grace period). Call it on the loop's thread."""
        task = self.loop.create_task(self.task(claimed), context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_settled)
        return task

    async def run_here(
        self,
        defn: WorkflowDef,
        workflow_id: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        parent: tuple[str, int] | None,
    ) -> Any:
        """Run (or resume, or wait for) workflow `workflow_id` in this task (see run_inline)."""
        inputs = self.runner.client.inputs.encode(defn, args, kwargs)
        return await self.run_inline(lifecycle.Create(defn, workflow_id, inputs, parent))

    async def run_inline(self, create: lifecycle.Create) -> Any:
        """Run (or resume, or wait for) the workflow `create` names in this task (see
        lifecycle.run_here); what touches the database, but the run itself, in a thread."""
        host = AsyncLifeHost(self.runner.client, self.runner, here=True, loop=self)
        return await host.run_here(create)


async def _awaited(task: asyncio.Task[Any]) -> Any:
    return await task


def _settled(task: asyncio.Task[Any]) -> None:
    """A run's task ended: what it raised is in the database (and was logged), so it is
    retrieved here rather than reported again as 'never retrieved'."""
    if not task.cancelled():
        task.exception()


async def _quietly(runner: Runner, statement: str, claimed: Claimed) -> None:
    params = {"workflow_id": claimed.workflow_id, "epoch": claimed.epoch}
    try:
        await asyncio.shield(asyncio.to_thread(runner.db.execute, statement, params))
    except BaseException:
        logger.warning("could not give up workflow %s", claimed.workflow_id)


def _async_app_engine(url: str, pool_size: int) -> sqlalchemy.ext.asyncio.AsyncEngine:
    """SQLAlchemy's async engine over psycopg, connecting with the URL as libpq reads it."""
    import psycopg
    from sqlalchemy.ext.asyncio import create_async_engine

    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(url, fallback_application_name="durable-app")

    engine = create_async_engine(
        "postgresql+psycopg://", async_creator=connect, pool_size=pool_size, max_overflow=4
    )
    watch_statements(engine.sync_engine)
    return engine


class AsyncHosts:
    """The event loops of one runner: the application's and the engine's own."""

    def __init__(self, runner: Runner, pool_size: int, connect_timeout: float) -> None:
        self.runner = runner
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._hosts: dict[asyncio.AbstractEventLoop, AsyncHost] = {}
        self._opening: dict[asyncio.AbstractEventLoop, asyncio.Future[AsyncHost]] = {}
        self._home: dict[str, AsyncHost] = {}  # where a workflow started here was started
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        # Futures of what was handed to our own loop, and the claim each runs (None: a run
        # waited for by a thread); failed at once if the loop dies.
        self._pending: dict[concurrent.futures.Future[Any], Claimed | None] = {}
        # What ended our own loop, if it died: nothing more is run on it.
        self.failure: BaseException | None = None
        self._dead: tuple[asyncio.AbstractEventLoop, AsyncHost | None] | None = None

    async def here(self) -> AsyncHost:
        """The host of the running loop, opened on first use."""
        loop = asyncio.get_running_loop()
        host = self._hosts.get(loop)
        if host is not None:
            return host
        opening = self._opening.get(loop)
        if opening is not None:
            return await asyncio.shield(opening)
        future: asyncio.Future[AsyncHost] = loop.create_future()
        self._opening[loop] = future
        try:
            host = AsyncHost(self.runner, loop, self.pool_size)
            await host.open(self.connect_timeout)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a failed open is raised to each waiter
            raise
        finally:
            del self._opening[loop]
        with self._lock:
            self._hosts[loop] = host
        # When the loop ends (asyncio.run cancels what is left), the host gives back its
        # connections instead of leaving them to the end of the engine.
        guard = loop.create_task(self._guard(loop, host), name="durable-async-host")
        host.guard = guard
        future.set_result(host)
        return host

    async def _guard(self, loop: asyncio.AbstractEventLoop, host: AsyncHost) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            with self._lock:
                if self._hosts.get(loop) is host:
                    del self._hosts[loop]
            await host.close(False, 0)

    def home(self, workflow_id: str, host: AsyncHost) -> None:
        with self._lock:
            self._home[workflow_id] = host

    def forget(self, workflow_ids: Iterable[str]) -> None:
        with self._lock:
            for workflow_id in workflow_ids:
                self._home.pop(workflow_id, None)

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._serve, args=(loop,), name="durable-async-loop", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """The engine's own loop, until close() stops it (see the module docstring)."""
        while True:
            try:
                loop.run_forever()
            except (SystemExit, KeyboardInterrupt) as exc:
                # Out of a task or a callback of the workflows' code: what it ended is over
                # (a task's end is in the task); the loop and the rest of its runs go on.
                logger.warning(
                    "%s raised out of a task or callback on the event loop of async "
                    "workflows; the loop goes on",
                    type(exc).__qualname__,
                )
                continue
            except BaseException as exc:
                self._died(loop, exc)
                return
            if self._stopping:
                return
            # Stopped by code on it (loop.stop()), not by close(): it goes on.

    def _died(self, loop: asyncio.AbstractEventLoop, exc: BaseException) -> None:
        """Our loop died under its runs: give them up (each counted as a recovery attempt,
        as a crash does) and let them go, so that the heartbeat no longer renews their
        leases and other workers take them over at once; whoever waits is told."""
        with self._lock:
            self.failure = exc
            pending, self._pending = self._pending, {}
            host = self._hosts.pop(loop, None)
            # Kept, never closed: closing would finalize its frozen tasks, running the
            # rest of their code (finally blocks) outside any loop, after their runs were
            # given up and while other workers take them over.
            self._dead = (loop, host)
        logger.critical(
            "the event loop of async workflows died; its runs are given up and this engine "
            "runs no more async workflows: restart the process",
            exc_info=exc,
            extra={"event": "loop_died", "error_type": type(exc).__qualname__},
        )
        claims: dict[tuple[str, int], Claimed] = {}
        if host is not None:
            host.closed = True
            claims.update(((c.workflow_id, c.epoch), c) for c in host.running())
        claims.update(((c.workflow_id, c.epoch), c) for c in pending.values() if c is not None)
        for claimed in claims.values():
            params = {"workflow_id": claimed.workflow_id, "epoch": claimed.epoch}
            try:
                self.runner.db.execute("abandon_workflow", params)
            except Exception:
                logger.warning("could not give up workflow %s", claimed.workflow_id)
            self.runner.let_go(claimed)
        reason = f"the event loop it ran on died ({type(exc).__qualname__}: {exc})"
        for future, run in pending.items():
            workflow_id = run.workflow_id if run is not None else None
            try:
                future.set_exception(WorkflowAbandoned(workflow_id, reason))
            except concurrent.futures.InvalidStateError:
                pass  # it had ended

    def _call(self, make: Any, claimed: Claimed | None = None) -> concurrent.futures.Future[Any]:
        """Run `await make(host)` on the engine's own loop; a future for its value."""

        async def call() -> Any:
            return await make(await self.here())

        self._refuse_if_dead()
        loop = self._own_loop()
        with self._lock:
            self._refuse_if_dead()
            future = asyncio.run_coroutine_threadsafe(call(), loop)
            self._pending[future] = claimed
        future.add_done_callback(self._settled)
        return future

    def _refuse_if_dead(self) -> None:
        failure = self.failure
        if failure is not None:
            raise EngineNotRunningError(
                "this engine's event loop of async workflows died "
                f"({type(failure).__qualname__}: {failure}): restart the process"
            )

    def _settled(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._pending.pop(future, None)

    def submit(self, claimed: Claimed) -> concurrent.futures.Future[Any]:
        """Run a claimed async workflow: on the loop it was started from if that loop still
        runs (its steps may use what the application made there), else on our own."""
        with self._lock:
            home = self._home.get(claimed.workflow_id)
        if (
            home is not None
            and not home.closed
            and home.loop.is_running()
            and not home.loop.is_closed()
        ):
            return asyncio.run_coroutine_threadsafe(_awaited(home.spawn(claimed)), home.loop)
        return self._call(lambda host: _awaited(host.spawn(claimed)), claimed)

    def run_inline(self, create: lifecycle.Create) -> Any:
        """From a thread (sync code): run an async workflow on our loop and wait for it."""
        if self._loop is not None and _on_loop(self._loop):
            raise EngineNotRunningError("cannot wait for an async workflow on its own loop")
        return self._call(lambda host: host.run_inline(create)).result()

    def interrupt(self, workflow_ids: Iterable[str]) -> None:
        ids = list(workflow_ids)
        with self._lock:
            hosts = list(self._hosts.values())
        for host in hosts:
            if not host.loop.is_closed():
                try:
                    host.loop.call_soon_threadsafe(host.interrupt, ids)
                except RuntimeError:
                    pass  # the loop closed meanwhile

    async def close_here(self, wait: bool, grace_seconds: float) -> None:
        """Close the running loop's host (an application leaving `async with engine`)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            host = self._hosts.pop(loop, None)
        if host is not None:
            await host.close(wait, grace_seconds)
            if host.guard is not None:
                host.guard.cancel()

    def close(self, wait: bool, grace_seconds: float) -> None:
        """Close every host whose loop still runs, then stop our own loop's thread."""
        with self._lock:
            hosts = list(self._hosts.items())
            self._hosts.clear()
        began = time.monotonic()
        for loop, host in hosts:
            if loop.is_closed() or not loop.is_running():
                continue
            if _on_loop(loop):
                continue  # closed by close_here on its own loop
            left = max(0.0, grace_seconds - (time.monotonic() - began))
            future = asyncio.run_coroutine_threadsafe(_close(host, wait, left), loop)
            try:
                future.result(timeout=left + 10)
            except Exception:
                logger.warning("could not close an event loop's connections", exc_info=True)
        if self._loop is not None:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            self._stopping = True
            if self._dead is not None and self._dead[0] is loop:
                return  # it died (see _died)
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(timeout=10)
            loop.close()


async def _close(host: AsyncHost, wait: bool, grace_seconds: float) -> None:
    await host.close(wait, grace_seconds)
    if host.guard is not None:
        host.guard.cancel()


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
