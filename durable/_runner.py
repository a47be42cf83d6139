"""The Runner: claims workflows and runs them, the executing half of an Engine.

A claim bumps the workflow's epoch and leases it to this executor; the Runner loads the
journal, builds the run's state (`_protocol.Run`) and hands it to the driver on a thread
of its pool. It is also the driver's host: the system database, the background writer of
async durability, the application database of @transaction steps, and child runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from durable import _driver
from durable import _labels as labels
from durable import _lifecycle as lifecycle
from durable._client_base import libpq_url
from durable._context import current_run
from durable._durability import AsyncWriter
from durable._host_sync import LifeHost, Starter, new_run, outcome_of
from durable._local import Claimed, LocalRun
from durable._models import StepRecord, WorkflowStatus
from durable._protocol import Journal, Run, RunChild, Settings, encode_error
from durable._registry import WorkflowDef
from durable._runio_base import watch_statements
from durable._systemdb import SystemDB, app_error_fault
from durable._urls import check_url, redact, same_database
from durable.errors import (
    DatabaseUnavailableError,
    EngineNotRunningError,
    SerializationError,
    UnknownInstanceError,
    UnknownWorkflowError,
    WorkflowInterrupted,
    WorkflowSuspended,
)

if TYPE_CHECKING:
    import sqlalchemy

    from durable._config import Config
    from durable._context import ActiveEngine
    from durable._inputs import Inputs
    from durable._ownership import Ownership
    from durable._registry import Registry

logger = logging.getLogger("durable.runner")


class Reader(Starter, Protocol):
    """What the runner reads through the client of its engine: where the system database
    is, how inputs are stored, and the stored workflows its starts attach to (the host's
    Starter). The runner never imports the Client (nor anything above it)."""

    @property
    def inputs(self) -> Inputs: ...

    @property
    def database_url(self) -> str: ...


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
        client: Reader,
        active: ActiveEngine,
        ownership: Ownership,
    ) -> None:
        self.config = config
        self.registry = registry
        self.client = client
        self.active = active
        self.ownership = ownership
        self.writer: AsyncWriter | None = None
        self.app_is_system_db = True
        self._db: SystemDB | None = None
        self._app_engine: sqlalchemy.Engine | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._futures: set[concurrent.futures.Future[Any]] = set()
        # Async workflows running on an event loop: they hold no thread of the pool, so
        # they do not count against max_workers (see max_async).
        self._async_futures: set[concurrent.futures.Future[Any]] = set()
        self.async_side: AsyncSide | None = None
        self.app_url = ""
        self._lock = threading.Lock()
        self.slot_freed = threading.Event()
        # Set too when a workflow ends, while the worker loop waits with queue entries left.
        self.wake_on_free: threading.Event | None = None
        self._crash_points = config.crash_points
        self._crash_counts: dict[str, int] = {}
        self.settings: Settings | None = None
        # Workflows this engine started (or enqueued) and has not seen finish: an engine
        # that is not a worker still resumes these when they wait (see Engine._keep).
        self._own: set[str] = set()

    def hold(self, claimed: Claimed) -> None:
        self.ownership.hold(claimed.workflow_id, claimed.epoch)

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
            cancel_request=self._cancel_request,
            handing_over=self.ownership.handing_over,
            classify_app_error=app_error_fault,
            stream_channel=f"{config.schema}_streams",
            work_channel=f"{config.schema}_work",
            executor_id=config.executor_id,
            lease_seconds=config.lease_seconds,
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
                with self._lock:
                    running = list(self._futures)
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

    def _cancel_request(self, workflow_id: str, epoch: int) -> str | None:
        return self.ownership.cancel_request(workflow_id, epoch)

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
            with self._lock:
                self._async_futures.add(future)
            future.add_done_callback(self._forget)
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
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._futures.discard(future)
            self._async_futures.discard(future)
        self.slot_freed.set()
        wake = self.wake_on_free
        if wake is not None:
            wake.set()

    def in_pool(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        """Run `fn(*args)` on this runner's threads, awaitable from an event loop."""
        if self._pool is None:
            raise EngineNotRunningError()
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def running_count(self) -> int:
        """Workflows running on this executor's threads (async ones hold none)."""
        with self._lock:
            return len(self._futures)

    @property
    def loop_failure(self) -> BaseException | None:
        """What ended the event loop of this runner's async workflows, if it died."""
        return None if self.async_side is None else self.async_side.failure

    def async_running_count(self) -> int:
        with self._lock:
            return len(self._async_futures)

    # -- claims --------------------------------------------------------------------------------

    def claim_free(self, workflow_ids: list[str] | None, limit: int) -> list[tuple[str, Any]]:
        """Claim and start what there is room for: sync workflows up to `limit` (threads),
        async ones up to the engine's max_async less those running (they hold no thread)."""
        defs = self.registry.workflows()
        started: list[tuple[str, Any]] = []
        if limit > 0 and any(not d.is_async for d in defs):
            started += self.start_claimed(self.claim_rows(workflow_ids, limit, False))
        room = self.config.max_async - self.async_running_count()
        if room > 0 and self.loop_failure is None and any(d.is_async for d in defs):
            started += self.start_claimed(self.claim_rows(workflow_ids, room, True))
        return started

    def claim_rows(
        self, workflow_ids: list[str] | None, limit: int, asynchronous: bool | None = None
    ) -> list[dict[str, Any]]:
        """Claim up to `limit` runnable workflows this registry has the code of (only the
        async def ones, or only the others, when `asynchronous` says so)."""
        config = self.config
        # Sleepers whose time has come become claimable here, by whoever claims next.
        self.db.wake_due()
        doubts, claimed_at = self.db.outage.doubts, time.monotonic()  # before the claim
        defs = [
            d
            for d in self.registry.workflows()
            if asynchronous is None or d.is_async == asynchronous
        ]
        rows = self.db.claim_batch(
            {
                "workflow_ids": workflow_ids,
                "owner": config.executor_id,
                "incarnation": self.ownership.incarnation,
                "lease_seconds": config.lease_seconds,
                "max_attempts": config.max_recovery_attempts,
                "names": [d.name for d in defs],
                "versions": [d.version or "" for d in defs],
                "journal_version": labels.JOURNAL_VERSION,
                "limit": limit,
            },
        )
        for row in rows:
            row["doubts"], row["claimed_at"] = doubts, claimed_at
        return rows

    def claim(self, workflow_id: str) -> Claimed | None:
        """Claim one runnable workflow and load its journal, or None if someone holds it."""
        rows = self.claim_rows([workflow_id], 1)
        if not rows or rows[0]["status"] != WorkflowStatus.RUNNING:
            return None
        row = rows[0]
        records = [
            StepRecord.from_row(r)
            for r in self.db.fetch_all("load_journal", {"workflow_id": row["workflow_id"]})
        ]
        try:
            return self._claimed(row, records)
        except Exception as exc:
            self._fail_unstartable(row, exc)
            return None

    def _fail_unstartable(self, row: dict[str, Any], exc: Exception) -> None:
        """A claimed workflow that cannot even start (its stored inputs do not decode, its
        journal is corrupt): it ends ERROR with the reason, instead of failing every
        worker that claims it (a poison pill)."""
        workflow_id = row["workflow_id"]
        if isinstance(exc, UnknownInstanceError):
            # Its instance is missing here, not broken: this worker has not created it (or
            # not yet). The claim is not held, so its lease runs out and a worker that has
            # the instance takes it; should none come, its recovery attempts run out and it
            # waits as MAX_RECOVERY_ATTEMPTS_EXCEEDED for `durable workflows resume`.
            logger.warning(
                "workflow %s needs an instance this worker does not have, left for a worker "
                "that has it: %s",
                workflow_id,
                exc,
                extra={"event": "instance_missing", "workflow_id": workflow_id},
            )
            return
        logger.error("workflow %s cannot be started, marking it ERROR: %s", workflow_id, exc)
        error = SerializationError(
            f"workflow {workflow_id!r} cannot be started: its stored inputs (or journal) "
            f"cannot be decoded: {exc}",
            what="the stored inputs",
            type_name=type(exc).__qualname__,
        )
        try:
            self.db.execute(
                "finish_workflow",
                {
                    "workflow_id": workflow_id,
                    "epoch": int(row["epoch"]),
                    "status": WorkflowStatus.ERROR.value,
                    "output": None,
                    "error": encode_error(error),
                },
            )
        except DatabaseUnavailableError:
            raise
        except Exception:
            logger.exception("could not mark workflow %s as failed", workflow_id)

    def _claimed(self, row: dict[str, Any], records: list[StepRecord]) -> Claimed:
        defn = self.registry.get_workflow(row["name"], row["version"])
        if defn is None:
            raise UnknownWorkflowError(row["name"], row["version"])
        args, kwargs = self.client.inputs.decode(row["inputs"], defn, self.registry)
        return Claimed(
            defn,
            row["workflow_id"],
            int(row["epoch"]),
            args,
            kwargs,
            Journal.from_records(row["workflow_id"], records),
            row["deadline_at"],
            row["cancel_reason"],
            row["budget_id"],
            trace_context=row.get("trace_context"),
            doubts=row.get("doubts", -1),
            claimed_at=row.get("claimed_at", 0.0),
            parent_id=row.get("parent_id"),
        )

    def submit_claim(self, workflow_id: str) -> concurrent.futures.Future[Any] | None:
        claimed = self.claim(workflow_id)
        if claimed is None:
            return None
        return self.submit(claimed)

    def start_claimed(
        self, rows: list[dict[str, Any]]
    ) -> list[tuple[str, concurrent.futures.Future[Any]]]:
        """Load the journals of claimed rows in one query and run them on the pool."""
        runnable = []
        for row in rows:
            fields = {"workflow_id": row["workflow_id"], "workflow": row["name"]}
            if row["status"] != WorkflowStatus.RUNNING:
                logger.error(
                    "workflow %s crashed its worker %d times; it is left as %s for an "
                    "operator (`durable workflows resume` retries it)",
                    row["workflow_id"],
                    row.get("max_recovery_attempts") or self.config.max_recovery_attempts,
                    row["status"],
                    extra={"event": "gave_up", "status": row["status"], **fields},
                )
                continue
            attempts = int(row.get("recovery_attempts") or 0)
            # A crash's recovery, not a workflow that was waiting (a sleep, a message, a
            # queue slot) and is due: recovery_attempts counts every crash of its life.
            if row.get("lease_expired"):
                logger.info(
                    "recovering workflow %s (its lease expired; attempt %d)",
                    row["workflow_id"],
                    attempts,
                    extra={
                        "event": "recover",
                        "attempt": attempts,
                        "epoch": row["epoch"],
                        **fields,
                    },
                )
            else:
                logger.info(
                    "claimed workflow %s",
                    row["workflow_id"],
                    extra={"event": "claim", "epoch": row["epoch"], **fields},
                )
            runnable.append(row)
        if not runnable:
            return []
        journals: dict[str, list[StepRecord]] = {r["workflow_id"]: [] for r in runnable}
        broken: dict[str, Exception] = {}
        for step_row in self.db.fetch_all("load_journals", {"workflow_ids": list(journals)}):
            try:
                journals[step_row["workflow_id"]].append(StepRecord.from_row(step_row))
            except Exception as exc:
                broken[step_row["workflow_id"]] = exc
        started = []
        for row in runnable:
            try:
                if row["workflow_id"] in broken:
                    raise broken[row["workflow_id"]]
                claimed = self._claimed(row, journals[row["workflow_id"]])
            except DatabaseUnavailableError:
                raise
            except Exception as exc:
                self._fail_unstartable(row, exc)
                continue
            started.append((claimed.workflow_id, self.submit(claimed)))
        return started

    def dequeue(
        self, limit: int, only: list[str] | None = None
    ) -> list[tuple[str, concurrent.futures.Future[Any]]]:
        """Dequeue and start up to `limit` entries from the queues of this registry, as
        far as each queue's limits allow (`only`: among these ids)."""
        config = self.config
        started: list[tuple[str, concurrent.futures.Future[Any]]] = []
        defs = self.registry.workflows()
        if self.loop_failure is not None:
            defs = [d for d in defs if not d.is_async]  # nowhere to run them
        for queue in self.registry.queues():
            if len(started) >= limit:
                break
            params = queue.dequeue_params(
                schema=config.schema,
                owner=config.executor_id,
                lease_seconds=config.lease_seconds,
                defs=defs,
                limit=limit - len(started),
                only=only,
            )
            params["incarnation"] = self.ownership.incarnation
            doubts, claimed_at = self.db.outage.doubts, time.monotonic()  # (Claimed.doubts)
            rows = self.db.dequeue(params)
            for row in rows:
                row["doubts"], row["claimed_at"] = doubts, claimed_at
            started += self.start_claimed(rows)
        return started

    # -- running here (direct calls and children) ------------------------------------------------

    def run_direct(self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """A workflow called as a function inside `with engine:`: run it in this thread."""
        inputs = self.client.inputs.encode(defn, args, kwargs)
        return self.run_inline(lifecycle.Create(defn, str(uuid.uuid4()), inputs, None))

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
