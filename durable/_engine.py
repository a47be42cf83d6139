"""The Engine: runs workflows, and holds a Client for everything else.

There is no global engine. `with engine:` launches it (connects, migrates, registers an
executor, starts the heartbeat and the runner's threads) and makes it the current engine
for direct workflow calls in that context; leaving the block shuts it down cleanly.

An Engine is made of parts: `engine.client`, a Client on the engine's own pool (every
read and operator action, `_client.py`); its Claims (`_claims.py`) and a Runner that
launches them (`_runner.py`); the Ownership of its executor id (`_ownership.py`); the
Heartbeat and, with `worker=True` or `run_worker()`, a Worker loop, else a keeper
(`_recovery.py`: LISTEN, claims, schedules, retention), given only what they use. The
Engine itself shows what an application calls: start and run workflows, and the reads and
actions used most, which it hands to its client (the rest: `engine.client`).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from durable._async_host import AsyncHosts
from durable._claims import Claims
from durable._client import Client
from durable._clock import Clock
from durable._config import Config
from durable._context import current_engine, current_run
from durable._engine_calls import EngineCalls
from durable._engine_calls_async import AsyncEngineCalls
from durable._handles import AsyncWorkflowHandle, WorkflowHandle
from durable._local import Claimed
from durable._ownership import Ownership
from durable._queues import Queue
from durable._recovery import Heartbeat, Worker, WorkerParts, keep
from durable._registry import Durability, Registry, default_registry
from durable._retention import RetentionPolicy
from durable._runner import Runner
from durable._schedules import fire
from durable._start_options import (
    enqueue_method,
    start_method,
)
from durable._urls import is_local
from durable.errors import ConfigurationError, EngineNotRunningError
from durable.serialization import Serializer

logger = logging.getLogger("durable.engine")

# What an Engine is made of (set in _apply): its only public attributes.
_PARTS = frozenset({"client", "config", "registry", "runner", "ownership"})

P = ParamSpec("P")
R = TypeVar("R")


def _client_call(
    method: Callable[Concatenate[Client, P], R],
) -> Callable[Concatenate[Engine, P], R]:
    """An Engine method that is the Client's: the same signature, types and docstring,
    called on the engine's client (so the two cannot drift apart)."""

    @functools.wraps(method)
    def call(engine: Engine, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(engine.client, *args, **kwargs)

    return call


__all__ = ["AsyncWorkflowHandle", "Engine", "WorkflowHandle"]


class Engine(EngineCalls, AsyncEngineCalls):
    """Runs workflows durably against one PostgreSQL system database.

    Arguments (all optional), besides the Client's (database_url, schema, serializer,
    max_payload_bytes, connect_timeout, clock):
      (`engine.client` is a Client with these settings on the engine's pool: every read
      and operator action is there; the engine itself offers the ones used most.)
      registry: where decorated workflows and steps were registered (default registry).
      migrate: apply migrations at launch (default True); False for locked-down
        deployments, where `durable migrate` is run separately and launch only checks.
      app_database_url: database of @transaction steps (default: the system database,
        which lets their journal row commit in the same transaction, fenced by epoch).
      lease_seconds: how long a claim lasts without a heartbeat (default 30).
      response_timeout: seconds a statement waits for an answer before the database
        counts as unreachable (default 5, or DURABLE_RESPONSE_TIMEOUT; 0: none).
      max_recovery_attempts: crashes of its worker a workflow survives (default 10); a
        workflow's own `@durable.workflow(max_recovery_attempts=N)` wins over it.
      max_workers: threads that run started workflows (default 8).
      max_async: async def workflows this process runs at once (default 1000); they hold
        no thread, only memory and, between awaits, a connection of the loop's pool.
      durability: default durability mode: "sync" (default), "async" or "exit"; see
        docs/discussions.md for what a crash can cost in each.
      executor_id: stable id of this process (default: a new UUID per engine). Give one
        (unique per process) and a restart takes back its own interrupted workflows at once
        instead of after their lease.
      worker: also run the recovery/execution loop in a background thread (default False).
      poll_interval: seconds between claims when no notification arrives (default 1).
      grace_seconds: at shutdown, how long running workflows may finish (default 30). A
        worker hands each one back at its next step boundary instead: this bounds how long
        it waits for the step under way.
      retention: a durable.RetentionPolicy the worker loop applies (default: keep all).
      create_database: create the system database if it does not exist (default: yes for
        the embedded server and for a server on this machine, no elsewhere).
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
        max_async: int = 1000,
        durability: Durability = "sync",
        executor_id: str | None = None,
        connect_timeout: float = 15.0,
        response_timeout: float | None = None,
        worker: bool = False,
        poll_interval: float = 1.0,
        grace_seconds: float = 30.0,
        clock: Clock | None = None,
        retention: RetentionPolicy | None = None,
        create_database: bool | None = None,
        listen: bool | None = None,
    ) -> None:
        config = Config.resolve(
            database_url=database_url,
            schema=schema,
            migrate=migrate,
            serializer=serializer,
            max_payload_bytes=max_payload_bytes,
            connect_timeout=connect_timeout,
            response_timeout=response_timeout,
            clock=clock,
            listen=listen,
            app_database_url=app_database_url,
            lease_seconds=lease_seconds,
            max_recovery_attempts=max_recovery_attempts,
            max_workers=max_workers,
            max_async=max_async,
            durability=durability,
            executor_id=executor_id,
            worker=worker,
            poll_interval=poll_interval,
            grace_seconds=grace_seconds,
            retention=retention,
            create_database=create_database,
        )
        self.registry = registry if registry is not None else default_registry
        self._launched = False
        self._worker_stop = threading.Event()
        self._apply(config)
        self._worker_thread: threading.Thread | None = None
        self._keeper: threading.Thread | None = None
        # Schedules that could not fire, with why: each is logged once per error.
        self._failing_schedules: dict[str, str] = {}
        self._engine_token: contextvars.Token[Any] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # Settings are Engine(...) arguments held in a frozen Config: an attribute set on
        # the engine (engine.max_workers = 2) would be read by nothing, so it is refused.
        if not name.startswith("_") and name not in _PARTS:
            raise ConfigurationError(
                f"engine.{name} cannot be set: give settings as Engine(...) arguments "
                "(engine.config holds them, frozen)"
            )
        super().__setattr__(name, value)

    def _apply(self, config: Config) -> None:
        """Take the resolved settings, and make the parts that hold them: the ownership of
        the executor id they name, the client and the runner."""
        self.config = config
        # The executor id, its incarnation and the claims held under it.
        self.ownership = Ownership(
            config.executor_id,
            explicit=config.explicit_id,
            lease_seconds=config.lease_seconds,
            on_lost=self._id_lost,
        )
        # One client for the engine's life: one taken before a CLI option changed a setting
        # is the one that reads through the engine's pool once it runs.
        client: Client | None = getattr(self, "client", None)
        if client is None:
            self.client = client = Client._from_config(config)
        else:
            client._configure(config)
        client.on_cancel_requested = self._cancel_requested
        client.registry = self.registry
        # Late-bound: the runner's database is the one opened at launch.
        self._claims = Claims(
            config, self.registry, client.inputs, self.ownership, db=lambda: self.runner.db
        )
        self.runner = Runner(config, self.registry, client, self, self.ownership, self._claims)
        self._heartbeat = Heartbeat(
            config,
            self.ownership,
            db=lambda: self.client.db,
            running=lambda: self.running,
            set_cancel_requests=self.runner.set_cancel_requests,
        )

    def _override(self, **changes: Any) -> None:
        """Change settings before launch (`durable worker --app module:engine` puts its
        options over the app's engine): the config is made again, and all that comes of
        it."""
        if self.running:
            raise ConfigurationError("an engine's settings change only before it launches")
        self._apply(dataclasses.replace(self.config, **changes))

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def executor_id(self) -> str:
        """This process's executor id (see `executor_id=`)."""
        return self.config.executor_id

    @property
    def running(self) -> bool:
        """Launched and not yet shut down."""
        return self._launched

    def launch(self) -> None:
        """Connect, migrate (or check the schema), register this executor, start threads."""
        if self.running:
            return
        config, client = self.config, self.client
        create = config.create_database
        if create is None:
            create = config.database_url is None or is_local(client.database_url)
        client.close()  # a pool the client opened itself (`with engine.client:` before launch)
        db = client._open_db(max_size=config.max_workers + 4, create_database=create)
        try:
            # The runner first: a bad application database URL must fail the launch before
            # this executor is registered (nothing is left behind).
            self.runner.open(db)
            self.runner.async_side = AsyncHosts(
                self.runner, max(4, config.max_workers), config.connect_timeout
            )
            self.ownership.take_up(db, ((d.name, d.version) for d in self.registry.workflows()))
            for schedule in self.registry.schedules():
                db.execute("upsert_schedule", schedule.row())
        except BaseException:
            self.runner.close(wait=False)
            db.close()
            raise
        client._adopt(db)
        self._launched = True
        self._heartbeat.start()
        self._worker_stop = threading.Event()
        if config.worker:
            self._worker_thread = threading.Thread(
                target=self._work,
                args=(self._worker_stop,),
                name="durable-worker",
                daemon=True,
            )
            self._worker_thread.start()
        else:
            # An engine that is not a worker still finishes what it started (see keep).
            self._keeper = threading.Thread(
                target=keep,
                args=(self._worker_parts(), self.runner.own, self.runner.forget, self._worker_stop),
                name="durable-keeper",
                daemon=True,
            )
            self._keeper.start()

    def _work(self, stop: threading.Event) -> None:
        """The in-process worker's thread. A worker that stopped with an error (the event
        loop of its async workflows died) says so in the log: the application goes on."""
        try:
            self.run_worker(stop)
        except EngineNotRunningError as exc:
            logger.critical("%s", exc)

    def shutdown(self, wait: bool = True) -> None:
        """Stop: wait for running workflows (if `wait`), release what is still owned."""
        if not self.running:
            return
        db = self.client.db
        self._worker_stop.set()
        if self._worker_thread is not None:
            self._worker_thread.join()
            self._worker_thread = None
        if self._keeper is not None:
            self._keeper.join(timeout=5)
            self._keeper = None
        if self.ownership.superseded:
            # Its leases are no longer renewed and what it holds is not its to release:
            # waiting for its runs would only let them go on past their leases.
            wait = False
        # The claims this process holds, queued ones included (closing the runner drops
        # those that never started).
        held = self.ownership.held_epochs()
        self.runner.close(wait, self.config.grace_seconds)
        held.update(self.ownership.held_epochs())
        self._heartbeat.stop()
        try:
            self.ownership.give_up(db, held if wait else None)
        except Exception:
            logger.warning("could not release workflows at shutdown", exc_info=True)
        self.client._close_listener()
        self.client._adopt(None)
        self._launched = False
        db.close()

    # -- the executor id: this process's incarnation of it ---------------------------------------

    def _id_lost(self) -> None:
        """Another process holds the id now: the worker loop stops (see Ownership.lose_id)."""
        self._worker_stop.set()

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
        self.shutdown(wait=self._leave(exc_type))

    async def __aenter__(self) -> Engine:
        """`async with durable.Engine(...)`: launched (in a worker thread, not blocking the
        loop), the current engine of this task, and this loop's connections opened."""
        await asyncio.to_thread(self.launch)
        self._engine_token = current_engine.set(self)
        await self._hosts().here()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        wait = self._leave(exc_type)
        if self.runner.async_side is not None:
            await self._hosts().close_here(wait, self.config.grace_seconds)
        await asyncio.to_thread(self.shutdown, wait)

    def _leave(self, exc_type: type[BaseException] | None) -> bool:
        """Leave the `with` (or `async with`) block: no longer the current engine. Returns
        whether to wait for running workflows at shutdown (not when the block was left by a
        KeyboardInterrupt or a cancellation)."""
        if self._engine_token is not None:
            current_engine.reset(self._engine_token)
            self._engine_token = None
        return exc_type is None or issubclass(exc_type, Exception)

    def _hosts(self) -> AsyncHosts:
        hosts = self.runner.async_side
        if not isinstance(hosts, AsyncHosts):
            raise EngineNotRunningError()
        return hosts

    # -- running -------------------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if not self.running:
            raise EngineNotRunningError()

    @enqueue_method
    def enqueue(
        self,
        queue: Queue,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        **kwargs: Any,
    ) -> WorkflowHandle:
        """Client.enqueue. An entry enqueued by a workflow this engine runs (a child) is
        run here when its queue allows, even if this engine is not a worker, so a workflow
        that enqueues children and waits for them finishes. Entries enqueued from outside
        a workflow are left to the workers."""
        in_run = current_run.get() is not None
        handle = self.client.enqueue(
            queue,
            fn,
            *args,
            workflow_id=workflow_id,
            dedup_key=dedup_key,
            priority=priority,
            delay=delay,
            partition_key=partition_key,
            **kwargs,
        )
        if in_run and self.running and not self.config.worker:  # a worker runs queues anyway
            self.runner.remember(handle.workflow_id)
        return handle

    def resume(self, workflow_id: str, *, version: str | None = None) -> WorkflowHandle:
        """Run a stopped or interrupted workflow again from its journal, or move it to
        another `version` (see Client.resume), here if nobody holds its lease and this
        registry has its code (of that version)."""
        handle = self.client.resume(workflow_id, version=version)
        self.runner.remember(workflow_id)  # if it waits again, this engine resumes it
        claimed = self._claims.one(workflow_id)
        return handle if claimed is None else self._launch([claimed])[0]

    def fork(
        self,
        workflow_id: str,
        *,
        from_step: int,
        new_id: str | None = None,
        version: str | None = None,
    ) -> WorkflowHandle:
        """Fork (see Client.fork) and run the fork here if this registry has its code (of
        `version`, when given)."""
        handle = self.client.fork(workflow_id, from_step=from_step, new_id=new_id, version=version)
        self.runner.remember(handle.workflow_id)
        claimed = self._claims.one(handle.workflow_id)
        return handle if claimed is None else self._launch([claimed])[0]

    def recover(self, limit: int = 100) -> list[WorkflowHandle]:
        """Claim up to `limit` interrupted or runnable workflows this registry can run, and
        run them in this engine's threads. Returns their handles.

        Only workflows whose (name, version) this registry has are claimed, so a worker
        never runs a workflow with the wrong code; others wait for a worker that has it.
        """
        self._ensure_running()
        return self._launch(self._claims.round(None, limit, self._worker_parts().async_room()))

    def _launch(self, claims: list[Claimed]) -> list[WorkflowHandle]:
        """Run claims (see _claims.py) on this engine's threads or event loops."""
        return [self.client.handle(c.workflow_id, self.runner.submit(c)) for c in claims]

    def flush(self) -> None:
        """Write every step record still queued by async-mode workflows. (Exit-mode
        records are written by their run at its next barrier or when it ends.)"""
        if self.runner.writer is not None:
            self.runner.writer.flush()

    def run_worker(
        self,
        stop: threading.Event | None = None,
        *,
        poll_interval: float | None = None,
        grace_seconds: float | None = None,
    ) -> None:
        """Run the recovery and execution loop until `stop` is set (blocks).

        Claims interrupted and runnable workflows whenever a slot is free, wakes on
        LISTEN/NOTIFY and polls as a fallback. When stopped it claims nothing more and each
        running workflow is handed back at its next step boundary, once the step under way
        is recorded, so that another worker takes it at once and runs none of its finished
        steps again; a workflow whose step is still under way when `grace_seconds` ends is
        released then (that step may run again).
        """
        Worker(
            self._worker_parts(),
            poll_interval=self.config.poll_interval if poll_interval is None else poll_interval,
            grace_seconds=self.config.grace_seconds if grace_seconds is None else grace_seconds,
        ).run(stop or threading.Event())

    def _worker_parts(self) -> WorkerParts:
        """What the worker loop and the keeper use of this engine (nothing more)."""
        client, runner = self.client, self.runner
        return WorkerParts(
            config=self.config,
            registry=self.registry,
            db=client.db,
            ownership=self.ownership,
            claims=self._claims,
            launch=runner.submit,
            slots=runner.slots,
            loop_failure=lambda: runner.loop_failure,
            subscribe=lambda wake: client._listener.subscribe(
                client._notify_channel, wake=wake, settle=False
            ),
            notify=client.notify_work,
            chores=(client._expire_approvals, self.fire_schedules),
            prune=client.prune,
            waiting_for_worker=lambda stale: client.waiting_for_worker(stale_seconds=stale),
        )

    def fire_schedules(self) -> int:
        """Start the due ticks of the schedules this registry can run (workers call this
        every round); returns how many workflows were started."""
        return fire(self.client, self.registry, self.config.durability, self._failing_schedules)

    # -- the client's calls used most (the rest: engine.client) ------------------------------

    @start_method
    def submit(
        self, fn: Callable[..., Any], /, *args: Any, workflow_id: str | None = None, **kwargs: Any
    ) -> WorkflowHandle:
        """Client.submit, on the engine's client: record the workflow for any worker (inside
        a workflow, journaled as a child like start)."""
        return self.client.submit(fn, *args, workflow_id=workflow_id, **kwargs)

    # (Through its typed view: Client.enqueue_async is typed as the call it makes.)
    enqueue_async = enqueue_method(_client_call(cast(Any, Client.enqueue_async)))
    """Client.enqueue_async, on the engine's client."""
    retrieve = _client_call(Client.retrieve)
    """Client.retrieve, on the engine's client."""
    retrieve_async = _client_call(Client.retrieve_async)
    """Client.retrieve_async, on the engine's client."""
    get_workflow = _client_call(Client.get_workflow)
    """Client.get_workflow, on the engine's client."""
    list_workflows = _client_call(Client.list_workflows)
    """Client.list_workflows, on the engine's client."""
    steps = _client_call(Client.steps)
    """Client.steps, on the engine's client."""
    send = _client_call(Client.send)
    """Client.send, on the engine's client."""
    send_async = _client_call(Client.send_async)
    """Client.send_async, on the engine's client."""
    get_event = _client_call(Client.get_event)
    """Client.get_event, on the engine's client."""
    get_event_async = _client_call(Client.get_event_async)
    """Client.get_event_async, on the engine's client."""
    cancel = _client_call(Client.cancel)
    """Client.cancel, on the engine's client."""
    decide = _client_call(Client.decide)
    """Client.decide, on the engine's client."""
    list_approvals = _client_call(Client.list_approvals)
    """Client.list_approvals, on the engine's client."""
    read_stream = _client_call(Client.read_stream)
    """Client.read_stream, on the engine's client."""
    read_stream_async = _client_call(Client.read_stream_async)
    """Client.read_stream_async, on the engine's client."""
    budget = _client_call(Client.budget)
    """Client.budget, on the engine's client."""
    raise_budget = _client_call(Client.raise_budget)
    """Client.raise_budget, on the engine's client."""
    get_state = _client_call(Client.get_state)
    """Client.get_state, on the engine's client."""
    schedule = _client_call(Client.schedule)
    """Client.schedule, on the engine's client."""

    # -- the client's hook ------------------------------------------------------------------------

    def _cancel_requested(self, runs: list[tuple[str, int]], reason: str) -> None:
        # Seen at once by runs in this process; others see it at their next poll.
        asked = {workflow_id: (epoch, reason) for workflow_id, epoch in runs}
        self.runner.set_cancel_requests({**self.ownership.cancel_requests, **asked})
