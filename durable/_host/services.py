"""The engine's parts and their life: what an Engine is made of, wired together once.

An Engine shows what an application calls; what makes those calls work is here, so the
facade reads as a list of calls and this module as the one place where the parts meet:
the Ownership of the executor id, the engine's Client, its Claims and the Runner that
launches them, the Heartbeat, and the thread that runs either the Worker loop (`worker=True`)
or the keeper (an engine that is not a worker still finishes what it started). Launch
opens them in the order that leaves nothing behind when one fails; shutdown closes them
in the order that hands every claim back. The worker loop and the keeper are given only
what they use of the parts (WorkerParts), never the parts themselves.

Settings changed before launch (`durable worker --app module:engine`) make a new
Services; the engine keeps its Client across them (see `Services.__init__`).
"""

from __future__ import annotations

import logging
import threading

from durable._base.registry import Registry
from durable._base.urls import is_local
from durable._client.client import Client
from durable._client.schedules import fire
from durable._host.async_host import AsyncHosts
from durable._host.claims import Claims
from durable._host.recovery import Heartbeat, Worker, WorkerParts, keep
from durable._host.runner import Runner
from durable._io.config import Config
from durable._io.local import Claimed
from durable._io.ownership import Ownership
from durable._run.context import ActiveEngine
from durable._run.handles import WorkflowHandle
from durable.errors import EngineNotRunningError
from durable.triggers._consumer import Consumers
from durable.triggers._trigger import Trigger

logger = logging.getLogger("durable.engine")


class Services:
    """The parts of one engine (for one Config) and the threads that run them."""

    def __init__(
        self, config: Config, registry: Registry, client: Client | None, active: ActiveEngine
    ) -> None:
        """Make the parts that hold `config`. `client` is the engine's client if it has one:
        one client for the engine's life, so one taken before a CLI option changed a
        setting is the one that reads through the engine's pool once it runs. `active` is
        the engine, which the runner makes the current engine of the runs it drives."""
        self.config = config
        self.registry = registry
        self.running = False
        # The executor id, its incarnation and the claims held under it.
        self.ownership = Ownership(
            config.executor_id,
            explicit=config.explicit_id,
            lease_seconds=config.lease_seconds,
            on_lost=self._id_lost,
        )
        if client is None:
            client = Client._from_config(config)
        else:
            client._configure(config)
        client.on_cancel_requested = self._cancel_requested
        client.on_pause_requested = self.ownership.ask_pause
        client.registry = registry
        self.client = client
        # Late-bound: the runner's database is the one opened at launch.
        self.claims = Claims(
            config, registry, client.inputs, self.ownership, db=lambda: self.runner.db
        )
        self.runner = Runner(config, registry, client, active, self.ownership, self.claims)
        self.heartbeat = Heartbeat(
            config,
            self.ownership,
            db=lambda: self.client.db,
            running=lambda: self.running,
            set_cancel_requests=self.runner.set_cancel_requests,
        )
        self._stop = threading.Event()  # stops the worker loop or the keeper
        self._thread: threading.Thread | None = None  # the one running either
        # Schedules that could not fire, with why: each is logged once per error.
        self._failing_schedules: dict[str, str] = {}

    # -- life ---------------------------------------------------------------------------------

    def launch(self) -> None:
        """Connect, migrate (or check the schema), register this executor, start threads."""
        if self.running:
            return
        config, client = self.config, self.client
        self.claims.check_queues()  # before connecting: a misspelt queue name leaves nothing
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
        self.running = True
        self.heartbeat.start()
        self._stop = threading.Event()
        if config.worker:
            self._thread = threading.Thread(
                target=self._work, args=(self._stop,), name="durable-worker", daemon=True
            )
        else:
            # An engine that is not a worker still finishes what it started (see keep).
            self._thread = threading.Thread(
                target=keep,
                args=(self.worker_parts(), self.runner.own, self.runner.forget, self._stop),
                name="durable-keeper",
                daemon=True,
            )
        self._thread.start()

    def _work(self, stop: threading.Event) -> None:
        """The in-process worker's thread. A worker that stopped with an error (the event
        loop of its async workflows died) says so in the log: the application goes on."""
        try:
            self.run_worker(stop, None, None)
        except EngineNotRunningError as exc:
            logger.critical("%s", exc)

    def shutdown(self, wait: bool) -> None:
        """Stop: wait for running workflows (if `wait`), release what is still owned."""
        if not self.running:
            return
        db = self.client.db
        self._stop.set()
        if self._thread is not None:
            # The worker loop hands its runs back first (it is joined to the end); the
            # keeper only watches, so it is not waited for long.
            self._thread.join(timeout=None if self.config.worker else 5)
            self._thread = None
        if self.ownership.superseded:
            # Its leases are no longer renewed and what it holds is not its to release:
            # waiting for its runs would only let them go on past their leases.
            wait = False
        # The claims this process holds, queued ones included (closing the runner drops
        # those that never started).
        held = self.ownership.held_epochs()
        self.runner.close(wait, self.config.grace_seconds)
        held.update(self.ownership.held_epochs())
        self.heartbeat.stop()
        try:
            self.ownership.give_up(db, held if wait else None)
        except Exception:
            logger.warning("could not release workflows at shutdown", exc_info=True)
        self.client._close_listener()
        self.client._adopt(None)
        self.running = False
        db.close()

    def _id_lost(self) -> None:
        """Another process holds the id now: the worker loop stops (see Ownership.lose_id)."""
        self._stop.set()

    def _cancel_requested(self, runs: list[tuple[str, int]], reason: str) -> None:
        """The client's hook: a cancel recorded through it is seen at once by runs in this
        process; others see it at their next poll."""
        asked = {workflow_id: (epoch, reason) for workflow_id, epoch in runs}
        self.runner.set_cancel_requests({**self.ownership.cancel_requests, **asked})

    # -- claiming and running -----------------------------------------------------------------

    def launch_claims(self, claims: list[Claimed]) -> list[WorkflowHandle]:
        """Run claims (see _host/claims.py) on this engine's threads or event loops."""
        return [self.client.handle(c.workflow_id, self.runner.submit(c)) for c in claims]

    def run_here(self, handle: WorkflowHandle) -> WorkflowHandle:
        """A workflow just made runnable (resumed, forked): run it here if nobody holds its
        lease and this registry has its code; remembered either way, so that if it waits
        again this engine resumes it."""
        self.runner.remember(handle.workflow_id)
        claimed = self.claims.one(handle.workflow_id)
        return handle if claimed is None else self.launch_claims([claimed])[0]

    def recover(self, limit: int) -> list[WorkflowHandle]:
        """One claim round of up to `limit` workflows, run here."""
        return self.launch_claims(self.claims.round(None, limit, self.worker_parts().async_room()))

    def run_worker(
        self, stop: threading.Event, poll_interval: float | None, grace_seconds: float | None
    ) -> None:
        """The worker loop on this thread until `stop` is set (see Engine.run_worker)."""
        config = self.config
        consumers = self.consume(stop)
        try:
            Worker(
                self.worker_parts(),
                poll_interval=config.poll_interval if poll_interval is None else poll_interval,
                grace_seconds=config.grace_seconds if grace_seconds is None else grace_seconds,
            ).run(stop)
        finally:
            if consumers is not None:
                consumers.close()

    def consume(self, stop: threading.Event) -> Consumers | None:
        """Consume the registry's triggers (durable.triggers) until `stop`: each message's
        workflow recorded for any worker, then the message acknowledged."""
        triggers = self.registry.triggers()
        if not triggers:
            return None
        client = self.client

        def submit(trigger: Trigger, value: object, workflow_id: str) -> None:
            client.submit(trigger.fn, value, workflow_id=workflow_id)

        for trigger in triggers:
            trigger.source.attach(client.db)
        consumers = Consumers(triggers, submit, crash_point=self.runner.crash_point)
        consumers.start(stop)
        return consumers

    def worker_parts(self) -> WorkerParts:
        """What the worker loop and the keeper use of this engine (nothing more)."""
        client, runner = self.client, self.runner
        return WorkerParts(
            config=self.config,
            registry=self.registry,
            db=client.db,
            ownership=self.ownership,
            claims=self.claims,
            launch=runner.submit,
            slots=runner.slots,
            loop_failure=lambda: runner.loop_failure,
            subscribe=lambda wake: client._listener.subscribe(
                client._notify_channel, wake=wake, settle=False
            ),
            notify=client.notify_work,
            # An application database's outbox (conn= there) drains into this one.
            chores=(client._expire_approvals, self.fire_schedules)
            + ((client._drain_outbox_round,) if self.config.outbox_url else ()),
            drain_outbox=client._drain_outbox_round if self.config.outbox_url else None,
            prune=client.prune,
            waiting_for_worker=lambda stale: client.waiting_for_worker(stale_seconds=stale),
        )

    def fire_schedules(self) -> int:
        """Start the due ticks of the schedules this registry can run."""
        return fire(self.client, self.registry, self.config.durability, self._failing_schedules)
