"""The Runner: runs claimed workflows, the executing half of an Engine.

A claim (`_host/claims.py`) bumps the workflow's epoch, leases it to this executor and loads
its journal; the Runner builds the run's state (`_core.Run`) and hands it to the
driver on a thread of its pool. It is also the driver's host: the system database, the
background writer of async durability, the application database of @transaction steps,
and child runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from durable._base.urls import check_url, redact, same_database
from durable._client.client_base import libpq_url
from durable._core import Run, RunChild, Settings, lifecycle
from durable._host.claims import Claims, Slots
from durable._io.durability import AsyncWriter
from durable._io.local import Claimed, LocalRun
from durable._io.runio_base import watch_statements
from durable._io.systemdb import SystemDB, app_error_fault
from durable._run import driver as _driver
from durable._run.context import current_run
from durable._run.host_sync import LifeHost, new_run, outcome_of
from durable.errors import (
    DatabaseUnavailableError,
    EngineNotRunningError,
    WorkflowInterrupted,
    WorkflowSuspended,
)

if TYPE_CHECKING:
    import sqlalchemy

    from durable._base.registry import Registry
    from durable._client.client import Client
    from durable._io.config import Config
    from durable._io.ownership import Ownership
    from durable._run.context import ActiveEngine

logger = logging.getLogger("durable.runner")


class AsyncSide(Protocol):
    """Where async def workflows run (`_async_host.AsyncHosts`): event loops, not threads."""

    def submit(self, claimed: Claimed) -> concurrent.futures.Future[Any]: ...

    def run_inline(self, create: lifecycle.Create) -> Any: ...

    def interrupt(self, workflow_ids: Iterable[str]) -> None: ...

    # What ended the engine's own event loop, if it died (no async workflow runs here then).
    @property
    def failure(self) -> BaseException | None: ...

    def forget(self, workflow_ids: Iterable[str]) -> None: ...

    def close(self, wait: bool, grace_seconds: float) -> None: ...


class Runner:
    """Claims and runs workflows for one engine (see module docstring)."""

    def __init__(
        self,
        config: Config,
        registry: Registry,
        client: Client,
        active: ActiveEngine,
        ownership: Ownership,
        claims: Claims,
    ) -> None:
        self.config = config
        self.registry = registry
        self.client = client
        self.active = active
        self.ownership = ownership
        self.claims = claims
        self.writer: AsyncWriter | None = None
        self.app_is_system_db = True
        self._db: SystemDB | None = None
        self._app_engine: sqlalchemy.Engine | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # The runs launched here; async ones hold no thread of the pool, so they do not
        # count against max_workers (see max_async).
        self.slots = Slots()
        self.async_side: AsyncSide | None = None
        self.app_url = ""
        self._lock = threading.Lock()
        self._crash_points = config.crash_points
        self._crash_counts: dict[str, int] = {}
        self.settings: Settings | None = None
        # Workflows this engine started (or enqueued) and has not seen finish: an engine
        # that is not a worker still resumes these when they wait (see _recovery.keep).
        self._own: set[str] = set()

    def hold(self, claimed: Claimed) -> None:
        self.ownership.hold(claimed.workflow_id, claimed.epoch)
        if claimed.pause_requested:  # asked of the run before, whose lease lapsed
            self.ownership.ask_pause(claimed.workflow_id, claimed.epoch, True)

    def let_go(self, claimed: Claimed) -> None:
        self.ownership.let_go(claimed.workflow_id, claimed.epoch)

    def set_cancel_requests(self, requests: dict[str, tuple[int, str]]) -> None:
        """Replace the requests; async steps of newly asked runs are cancelled at once."""
        new = self.ownership.replace_cancel_requests(requests)
        if new and self.async_side is not None:
            self.async_side.interrupt(new)

    def remember(self, workflow_id: str) -> None:
        with self._lock:
            self._own.add(workflow_id)

    def own(self) -> list[str]:
        with self._lock:
            return list(self._own)

    def forget(self, workflow_ids: list[str]) -> None:
        with self._lock:
            self._own.difference_update(workflow_ids)
        if self.async_side is not None:
            self.async_side.forget(workflow_ids)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def db(self) -> SystemDB:
        if self._db is None:
            raise EngineNotRunningError()
        return self._db

    def open(self, db: SystemDB) -> None:
        import sqlalchemy
        import sqlalchemy.exc

        config, system_url = self.config, self.client.database_url
        self._db = db
        db.records.crash_point = db.finishes.crash_point = self.crash_point
        self.writer = AsyncWriter(db)
        app_url = libpq_url(config.app_database_url or system_url)
        check_url(app_url)
        self.app_url = app_url
        self.app_is_system_db = config.app_database_url is None or same_database(
            app_url, system_url
        )
        # SQLAlchemy never parses the URL: psycopg connects with it as libpq does, so any
        # URL that works for the system database (multi-host, key=value) works here too.
        self._app_engine = sqlalchemy.create_engine(
            "postgresql+psycopg://",
            creator=lambda: psycopg.connect(app_url, fallback_application_name="durable-app"),
            pool_size=config.max_workers,
            max_overflow=4,
        )
        watch_statements(self._app_engine)
        if not self.app_is_system_db:
            try:
                db.migrate_app(self._app_engine)
            except sqlalchemy.exc.DBAPIError as exc:
                self._app_engine.dispose()
                self._app_engine = None
                detail = str(exc.orig or exc).strip().splitlines()[0]
                raise DatabaseUnavailableError(
                    f"cannot use the application database at {redact(app_url)}: {detail}; "
                    "check app_database_url"
                ) from None
        self.settings = Settings(
            serializer=config.serializer,
            max_payload_bytes=config.max_payload_bytes,
            clock=config.clock,
            app_separate=not self.app_is_system_db,
            compensation_of=self.registry.compensation,
            crash_point=self.crash_point,
            cancel_request=self.ownership.cancel_request,
            pause_request=self.ownership.pause_requested,
            handing_over=self.ownership.handing_over,
            classify_app_error=app_error_fault,
            stream_channel=f"{config.schema}_streams",
            work_channel=f"{config.schema}_work",
            executor_id=config.executor_id,
            lease_seconds=config.lease_seconds,
            callback_secret=config.callback_secret,
            callback_base_url=config.callback_base_url,
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.max_workers, thread_name_prefix="durable-workflow"
        )

    def close(self, wait: bool, grace_seconds: float = 30.0) -> None:
        """Stop running: with `wait`, give running workflows up to `grace_seconds` to
        finish; never longer (what is still running is released by the engine and fenced
        off by the next claim's epoch)."""
        if self.async_side is not None:
            # Async runs first: they may wait on this pool (a sync child of an async run).
            self.async_side.close(wait, grace_seconds)
        if self._pool is not None:
            if wait:
                running = self.slots.threads()
                _, pending = concurrent.futures.wait(running, timeout=grace_seconds)
                if pending:
                    logger.warning(
                        "%d workflows still running after %.1f s; releasing them",
                        len(pending),
                        grace_seconds,
                    )
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.writer is not None:
            # A clean shutdown writes everything still queued; an abrupt one only stops the
            # thread (what it held is what a crash would lose: plain steps, re-run).
            self.writer.stop(flush=wait)
            self.writer = None
        if self._app_engine is not None:
            self._app_engine.dispose()
            self._app_engine = None
        self._db = None

    def crash_point(self, name: str) -> None:
        """SIGKILL this process the n-th time `name` is reached, if DURABLE_CRASH_POINTS arms it.

        Crash tests use this to die at the worst moments (between an effect and its record);
        unarmed, it is one dict lookup.
        """
        if not self._crash_points or name not in self._crash_points:
            return
        count = self._crash_counts.get(name, 0) + 1
        self._crash_counts[name] = count
        if count == self._crash_points[name]:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)

    @contextmanager
    def app_connection(self, isolation_level: str | None = None) -> Iterator[sqlalchemy.Connection]:
        if self._app_engine is None:
            raise EngineNotRunningError()
        with self._app_engine.connect() as conn:
            if isolation_level is not None:
                conn = conn.execution_options(isolation_level=isolation_level)
            yield conn

    # -- runs ----------------------------------------------------------------------------------

    def execute(
        self, claimed: Claimed, conn: psycopg.Connection[Any] | None = None, run: Run | None = None
    ) -> Any:
        self.hold(claimed)
        run = new_run(self, claimed) if run is None else run
        try:
            return _driver.execute_run(self, run, claimed.defn, claimed.args, claimed.kwargs, conn)
        except (Exception, WorkflowSuspended, WorkflowInterrupted):
            raise
        except BaseException:
            # SystemExit or KeyboardInterrupt out of the workflow's code: this process may
            # be going down, and the run is unfinished. Give it up now (counted as a
            # recovery attempt), rather than keep renewing a lease nothing works under.
            try:
                self.db.execute(
                    "abandon_workflow",
                    {"workflow_id": claimed.workflow_id, "epoch": claimed.epoch},
                )
            except Exception:
                logger.warning("could not give up workflow %s", claimed.workflow_id)
            raise
        finally:
            self.let_go(claimed)

    def submit(self, claimed: Claimed) -> concurrent.futures.Future[Any]:
        """Run a claimed workflow on the pool (an async one on an event loop); the future
        holds its value (or error)."""
        self.hold(claimed)  # a queued claim's lease is renewed too
        try:
            future = self._start(claimed)
        except BaseException:
            self.let_go(claimed)
            raise
        # Also when the run never starts (its pool shut down first).
        future.add_done_callback(lambda _: self.let_go(claimed))
        return future

    def _start(self, claimed: Claimed) -> concurrent.futures.Future[Any]:
        if claimed.defn.is_async:
            if self.async_side is None:
                raise EngineNotRunningError()
            future = self.async_side.submit(claimed)
            self.slots.add(future, asynchronous=True)
            return future
        pool = self._pool
        if pool is None:
            raise EngineNotRunningError()
        context = contextvars.Context()

        def body() -> str | None:
            run = new_run(self, claimed)
            with outcome_of(self, claimed.workflow_id, claimed.epoch):
                context.run(self.execute, claimed, None, run)
                return run.output  # what its handle hands over (see _local)
            return None

        future = LocalRun(body, lambda: self.running_count() <= self.config.max_workers)
        # A thread of the pool runs it, unless the caller waiting on it got there first.
        queued = pool.submit(future.run)
        queued.add_done_callback(lambda q: q.cancelled() and future.cancel())
        self.slots.add(future, asynchronous=False)
        return future

    def in_pool(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        """Run `fn(*args)` on this runner's threads, awaitable from an event loop."""
        if self._pool is None:
            raise EngineNotRunningError()
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def running_count(self) -> int:
        """Workflows running on this executor's threads (async ones hold none)."""
        return self.slots.threads_running()

    @property
    def loop_failure(self) -> BaseException | None:
        """What ended the event loop of this runner's async workflows, if it died."""
        return None if self.async_side is None else self.async_side.failure

    def async_running_count(self) -> int:
        return self.slots.tasks_running()

    # -- claims --------------------------------------------------------------------------------

    def claim(self, workflow_id: str) -> Claimed | None:
        """Claim one runnable workflow (see Claims.one)."""
        return self.claims.one(workflow_id)

    def submit_claim(self, workflow_id: str) -> concurrent.futures.Future[Any] | None:
        claimed = self.claims.one(workflow_id)
        return None if claimed is None else self.submit(claimed)

    # -- running here (children; a direct call: Engine._run_direct) --------------------------

    def run_child(self, op: RunChild) -> Any:
        inputs = self.client.inputs.encode(op.defn, op.args, op.kwargs)
        return self.run_inline(lifecycle.Create(op.defn, op.workflow_id, inputs, op.parent))

    def run_inline(self, create: lifecycle.Create) -> Any:
        """Run (or resume, or wait for) the workflow `create` names in the calling thread (an
        async one on the engine's event loop, waited for here)."""
        if create.defn.is_async:
            if self.async_side is None:
                raise EngineNotRunningError()
            return self.async_side.run_inline(create)
        outer = current_run.get()
        conn = None if outer is None else outer.conn  # a child's start and run: its parent's
        return LifeHost(self.client, self, here=True, conn=conn).run_here(create)
