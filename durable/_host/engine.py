"""The Engine: runs workflows, and holds a Client for everything else.

There is no global engine. `with engine:` launches it (connects, migrates, registers an
executor, starts the heartbeat and the runner's threads) and makes it the current engine
for direct workflow calls in that context; leaving the block shuts it down cleanly.

An Engine is made of parts: `engine.client`, a Client on the engine's own pool (every
read and operator action, `_client/client.py`); its Claims (`_host/claims.py`) and a Runner that
launches them (`_host/runner.py`); the Ownership of its executor id (`_io/ownership.py`); the
Heartbeat and, with `worker=True` or `run_worker()`, a Worker loop, else a keeper
(`_host/recovery.py`: LISTEN, claims, schedules, retention), given only what they use. They
are made, wired, launched and shut down by its Services (`_host/services.py`). The Engine
itself shows what an application calls: start and run workflows, and the reads and
actions used most, which it hands to its client (the rest: `engine.client`).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from durable._base.clock import Clock
from durable._base.registry import Durability, Registry, default_registry
from durable._client.client import Client
from durable._client.queues import Queue
from durable._host.async_host import AsyncHosts
from durable._host.engine_calls import EngineCalls
from durable._host.engine_calls_async import AsyncEngineCalls
from durable._host.services import Services
from durable._io.config import Config
from durable._io.retention import RetentionPolicy
from durable._run.context import current_engine, current_run
from durable._run.handles import AsyncWorkflowHandle, WorkflowHandle
from durable._run.start_options import (
    enqueue_method,
    enqueue_method_async,
    start_method,
)
from durable.errors import ConfigurationError, EngineNotRunningError
from durable.serialization import Serializer

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
      outbox_url: an application database (not the system one) with an outbox
        (engine.client.install_outbox): a start, enqueue or send given `conn=` on that
        database is written to its outbox in the application's transaction, and this
        engine drains it into the system database (its worker loop, or while it waits for
        what it started there; see the README, "Starting inside your transaction").
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
      queues: the names of the queues whose entries this engine runs (default: every queue
        of its registry, or DURABLE_QUEUES="a,b"); [] runs none (an engine that only
        enqueues). Interrupted entries of other queues are left to their workers too;
        work that came from no queue is run whatever the list. A name the registry does
        not declare is refused at launch (ConfigurationError).
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        registry: Registry | None = None,
        schema: str = "durable",
        migrate: bool = True,
        app_database_url: str | None = None,
        outbox_url: str | None = None,
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
        queues: Sequence[str] | None = None,
    ) -> None:
        # Every argument but the registry is a setting, of the same name in Config.
        settings = {name: value for name, value in locals().items() if name != "self"}
        registry = settings.pop("registry")
        self.registry = registry if registry is not None else default_registry
        self._apply(Config.resolve(**settings))
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
        """Take the resolved settings, and make the parts that hold them (_host/services.py)."""
        self.config = config
        client = getattr(self, "client", None)  # one client for the engine's life
        self._services = parts = Services(config, self.registry, client, self)
        self.client, self.runner, self.ownership = parts.client, parts.runner, parts.ownership

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
        return self._services.running

    def launch(self) -> None:
        """Connect, migrate (or check the schema), register this executor, start threads."""
        self._services.launch()

    def shutdown(self, wait: bool = True) -> None:
        """Stop: wait for running workflows (if `wait`), release what is still owned."""
        self._services.shutdown(wait)

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
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle:
        """Client.enqueue (`conn=`: in the application's transaction). An entry enqueued by
        a workflow this engine runs (a child) is run here when its queue allows, even if
        this engine is not a worker, so a workflow that enqueues children and waits for
        them finishes. Entries enqueued from outside
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
            conn=conn,
            **kwargs,
        )
        if in_run and self.running and not self.config.worker:  # a worker runs queues anyway
            self.runner.remember(handle.workflow_id)
        return handle

    def resume(self, workflow_id: str, *, version: str | None = None) -> WorkflowHandle:
        """Run a stopped or interrupted workflow again from its journal, or move it to
        another `version` (see Client.resume), here if nobody holds its lease and this
        registry has its code (of that version)."""
        return self._services.run_here(self.client.resume(workflow_id, version=version))

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
        fork = self.client.fork(workflow_id, from_step=from_step, new_id=new_id, version=version)
        return self._services.run_here(fork)

    def recover(self, limit: int = 100) -> list[WorkflowHandle]:
        """Claim up to `limit` interrupted or runnable workflows this registry can run, and
        run them in this engine's threads. Returns their handles.

        Only workflows whose (name, version) this registry has are claimed, so a worker
        never runs a workflow with the wrong code; others wait for a worker that has it.
        """
        self._ensure_running()
        return self._services.recover(limit)

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
        self._services.run_worker(stop or threading.Event(), poll_interval, grace_seconds)

    def fire_schedules(self) -> int:
        """Start the due ticks of the schedules this registry can run (workers call this
        every round); returns how many workflows were started."""
        return self._services.fire_schedules()

    # -- the client's calls used most (the rest: engine.client) ------------------------------

    @start_method
    def submit(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle:
        """Client.submit, on the engine's client: record the workflow for any worker (inside
        a workflow, journaled as a child like start; `conn=`: in the application's
        transaction)."""
        return self.client.submit(fn, *args, workflow_id=workflow_id, conn=conn, **kwargs)

    # (Through its typed view: Client.enqueue_async is typed as the call it makes.)
    enqueue_async = enqueue_method_async(_client_call(cast(Any, Client.enqueue_async)))
    """Client.enqueue_async, on the engine's client."""

    # Each is the Client's method, signature and docstring included (see _client_call).
    retrieve = _client_call(Client.retrieve)
    retrieve_async = _client_call(Client.retrieve_async)
    get_workflow = _client_call(Client.get_workflow)
    list_workflows = _client_call(Client.list_workflows)
    steps = _client_call(Client.steps)
    send = _client_call(Client.send)
    send_async = _client_call(Client.send_async)
    get_event = _client_call(Client.get_event)
    get_event_async = _client_call(Client.get_event_async)
    cancel = _client_call(Client.cancel)
    decide = _client_call(Client.decide)
    list_approvals = _client_call(Client.list_approvals)
    read_stream = _client_call(Client.read_stream)
    read_stream_async = _client_call(Client.read_stream_async)
    budget = _client_call(Client.budget)
    raise_budget = _client_call(Client.raise_budget)
    get_state = _client_call(Client.get_state)
    schedule = _client_call(Client.schedule)
