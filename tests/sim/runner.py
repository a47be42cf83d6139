"""Run one scenario against a real PostgreSQL database, then judge it (invariants.py).

Each phase is a fresh simulated process (faults.Process + an Engine); the first starts
the workload, later ones recover what earlier ones left. A crash leaves the database as
SIGKILL would (the process's backends are terminated mid-transaction), and the lease it
held is then run out at once rather than waited for (what a minute of wall time would do,
made instant: nothing renews a dead process's leases). The drain at the end plays a
patient operator: it runs the clock forward, approves the gates, raises the budgets that
stop a run, and recovers, until every workflow has ended.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

import durable
from durable import errors
from tests.sim import faults
from tests.sim.app import App, build
from tests.sim.faults import Crash, Fault, Process
from tests.sim.invariants import TERMINAL
from tests.sim.scenario import Scenario
from tests.sim.world import Vendor

T0 = dt.datetime(2027, 1, 4, 9, 0, tzinfo=dt.UTC)
QUIET_TIMEOUT = 30.0

logging.getLogger("durable").setLevel(logging.CRITICAL)
logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)


class Stuck(AssertionError):
    """A process did not go quiet: a run hangs (a bug the simulation reports)."""


@dataclass
class Node:
    proc: Process
    engine: durable.Engine


@dataclass
class Sim:
    url: str
    scenario: Scenario
    app_url: str | None = None  # a separate application database (scenario "app": "separate")
    clock: durable.FakeClock = field(default_factory=lambda: durable.FakeClock(T0))
    vendor: Vendor = field(default_factory=Vendor)
    deployed: bool = False
    ids: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    inputs: dict[str, tuple[list[Any], str]] = field(default_factory=dict)
    faults_fired: int = 0
    trips: list[int] = field(default_factory=list)  # round trips of workflow code, per phase
    # Processes whose runs were cut off (killed, or their lease lost while paused): a plain
    # step they ran may run again; one run by any other process may not.
    cut: set[str] = field(default_factory=set)
    # Processes told to stop (SIGTERM) while a run was inside: (name, how many vendor events
    # had happened by then). From then on each run may finish the step under way only.
    stopped: list[tuple[str, int]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    _apps: dict[bool, App] = field(default_factory=dict)
    client: durable.Client | None = None

    # -- processes -------------------------------------------------------------------------

    def app(self) -> App:
        if self.deployed not in self._apps:
            assert self.client is not None
            dollars, steps = self.scenario.get("budget", [2.0, 12])
            self._apps[self.deployed] = build(
                self.vendor,
                self.client,
                deployed=self.deployed,
                budget=durable.Budget(dollars=dollars, steps=steps),
            )
        return self._apps[self.deployed]

    def launch(self) -> Node:
        proc = faults.new_process(self.url)
        engine = durable.Engine(
            f"{self.url} application_name={proc.name}",
            registry=self.app().registry,
            clock=self.clock,
            listen=False,
            durability=self.scenario.get("durability", "sync"),
            max_workers=4,
            app_database_url=self.app_url,
        )
        engine.launch()
        engine.runner.db._sim_process = proc.name  # type: ignore[attr-defined]
        return Node(proc, engine)

    def run_once(self) -> None:
        """A fresh process claims what is runnable, runs it until it is quiet, and stops."""
        node = self.launch()
        try:
            self.kick(node)
            self.quiet(node)
        finally:
            self.dispose(node)

    def busy(self, node: Node) -> int:
        slots = node.engine.runner.slots
        return slots.threads_running() + slots.tasks_running()

    def quiet(self, node: Node, *, until_paused: bool = False) -> str:
        """Wait until the process has nothing running (or a run of it is paused)."""
        deadline = time.monotonic() + QUIET_TIMEOUT
        calm = 0
        while time.monotonic() < deadline:
            if until_paused and node.proc.paused.is_set():
                return "paused"
            if self.busy(node) == 0:
                calm += 1
                if calm >= 3:
                    return "dead" if node.proc.dead else "quiet"
            else:
                calm = 0
            time.sleep(0.005)
        raise Stuck(
            f"{node.proc.name} still runs {self.busy(node)} workflows after "
            f"{QUIET_TIMEOUT:.0f} s; {self.statuses()}"
        )

    def dispose(self, node: Node) -> None:
        if node.proc.paused.is_set() and not node.proc.resumed.is_set():
            self.cut.add(node.proc.name)  # its paused run was given up (lease, grace)
        if not node.proc.dead:
            node.proc.release()
            # A run still going while the process stops may meet its fault and kill it.
            with contextlib.suppress(Crash):
                node.engine.shutdown(wait=True)
        if node.proc.dead:
            self.cut.add(node.proc.name)
            # Nothing of a dead process reaches the database; its threads end on Crash.
            with contextlib.suppress(BaseException):
                node.engine.shutdown(wait=False)
            with contextlib.suppress(BaseException):
                node.engine.client.db.close()
            self.run_out_leases(node.engine.executor_id)
        faults.forget(node.proc)

    def run_out_leases(self, executor_id: str) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name="sim_admin") as conn:
            conn.execute(
                "UPDATE durable.workflows SET lease_expires_at = '2000-01-01' "
                "WHERE owner = %s AND status = 'RUNNING'",
                (executor_id,),
            )

    # -- the schedule ----------------------------------------------------------------------

    def submit_all(self) -> None:
        """Record the workload as runnable (the first process then claims it: every run
        begins in workflow code, where the faults are counted)."""
        client = self.client
        assert client is not None
        app = self.app()
        for n, (kind, program) in enumerate(self.scenario["workflows"]):
            wid = f"w{n}"
            self.ids.append(wid)
            self.kinds.append(kind)
            self.inputs[wid] = (program, wid)
            client.submit(app.workflow(kind), program, wid, workflow_id=wid)

    def kick(self, node: Node) -> None:
        """What a worker's loop does once: claim the runnable work and dequeue. An outage
        met here (the process's connections dropped) is tried again, as the loop would."""
        for _ in range(3):
            try:
                node.engine.recover(limit=100)
                runner = node.engine.runner
                for claimed in runner.claims.dequeue(10):
                    runner.submit(claimed)
                return
            except Crash:
                return
            except errors.DatabaseUnavailableError:
                continue

    def run(self) -> None:
        self.client = durable.Client(f"{self.url} application_name=sim_op", clock=self.clock)
        self.client.connect()
        self.submit_all()
        for n, (fault, actions) in enumerate(self.scenario["phases"]):
            self.phase(n, fault, actions)
        self.drain()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def phase(self, n: int, fault: list[Any] | None, actions: list[list[Any]]) -> None:
        node = self.launch()
        kind = fault[0] if fault else None
        pausing = kind in ("pause", "zombie", "sigterm")
        if fault is not None:
            armed = "pause" if pausing else "crash_after" if kind == "two" else kind
            node.proc.arm(Fault(fault[1], str(armed)))
        stop = threading.Event()
        worker: threading.Thread | None = None
        other = self.launch() if kind == "two" else None
        try:
            self.kick(node)
            if other is not None:
                self.kick(other)
            if kind == "sigterm":
                # A worker loop, told to stop while a run is inside (it hands the runs
                # over at their next step boundary).
                worker = threading.Thread(
                    target=node.engine.run_worker,
                    args=(stop,),
                    kwargs={"poll_interval": 0.05, "grace_seconds": 20.0},
                    daemon=True,
                )
                worker.start()
            state = self.quiet(node, until_paused=pausing)
            if state == "paused" and fault is not None:
                self.log.append(f"phase {n}: paused at {fault[1]}")
                if kind == "pause":
                    self.act(fault[2])
                elif kind == "zombie":
                    self.cut.add(node.proc.name)
                    self.zombie(node)
                else:
                    self.sigterm(node, stop)
                node.proc.release()
                if worker is not None:
                    worker.join(30)
                state = self.quiet(node)
            if node.proc.fired:
                self.faults_fired += 1
            if other is not None:
                self.quiet(other)
                self.kick(other)  # what the first left when it died
                self.quiet(other)
        finally:
            stop.set()
            if worker is not None:
                worker.join(30)
            self.trips.append(node.proc.trips)
            self.dispose(node)
            if other is not None:
                self.dispose(other)
        for action in actions:
            self.act(action)

    def sigterm(self, node: Node, stop: threading.Event) -> None:
        """Tell the worker to stop while its run is paused, and let the run go on once the
        worker has begun to stop (or after a few seconds, if it shows no sign of it)."""
        stop.set()
        deadline = time.monotonic() + 3.0
        while not node.engine.ownership.handing_over() and time.monotonic() < deadline:
            time.sleep(0.005)
        self.stopped.append((node.proc.name, len(self.vendor.events)))

    def zombie(self, node: Node) -> None:
        """The paused process's lease runs out; a second process takes its workflows and
        runs them to quiet; then the first goes on (its writes must be fenced off)."""
        self.run_out_leases(node.engine.executor_id)
        self.run_once()

    # -- operator actions --------------------------------------------------------------------

    def act(self, action: list[Any]) -> None:
        client = self.client
        assert client is not None
        name = action[0]
        self.log.append(f"act {action}")
        if name == "deploy":
            self.deployed = True
            return
        if name == "advance":
            self.clock.advance(action[1])
            return
        if not self.ids:
            return
        wid = self.ids[action[1] % len(self.ids)]
        with contextlib.suppress(errors.DurableError):
            if name == "cancel":
                client.cancel(wid)
            elif name == "cancel_resume":
                client.cancel(wid)
                self.run_once()  # runs the compensations, as any worker would
                client.resume(wid)
            elif name == "resume":
                client.resume(wid)
            elif name == "resume_v":
                client.resume(wid, version="2")
            elif name == "fork":
                new_id = f"{wid}f{len(self.ids)}"
                client.fork(wid, from_step=action[2], new_id=new_id)
                self.ids.append(new_id)
                self.inputs[new_id] = self.inputs[wid]
            elif name in ("approve", "deny"):
                for gate in client.list_approvals(wid):
                    client.decide(wid, gate["name"], name == "approve")
            elif name == "raise":
                client.raise_budget(wid, dollars=1.0, steps=4)
            elif name == "send":
                client.send(wid, f"msg-{wid}-{len(self.log)}", topic="m")
            elif name == "export":
                self.move(wid)

    def move(self, wid: str) -> None:
        """Carry a workflow (and its children) out of the database and back in, as an
        operator moving it between databases does: export, delete, import. Not while a
        process runs it (its rows are in the old database for it to write to).

        The rows are locked, and found not RUNNING, before the export is read: an export
        read first is a snapshot that a run finishing before the check would make stale
        (its later steps and effects deleted, the stale rows imported and run again, the
        vendor paid twice), which is the operator's mistake, not durable's."""
        client = self.client
        assert client is not None
        with psycopg.connect(self.url, application_name="sim_admin") as conn:
            rows = conn.execute(
                "WITH RECURSIVE tree AS (SELECT workflow_id FROM durable.workflows "
                "WHERE workflow_id = %s UNION SELECT w.workflow_id FROM durable.workflows w "
                "JOIN tree t ON w.parent_id = t.workflow_id) "
                "SELECT workflow_id, status FROM durable.workflows "
                "WHERE workflow_id IN (SELECT workflow_id FROM tree) FOR UPDATE",
                (wid,),
            ).fetchall()
            if not rows or any(s == "RUNNING" for _, s in rows):
                return
            data = client.export_workflow(wid, children=True)
            ids = [row["workflow_id"] for row in data["tables"]["workflows"]]
            if sorted(ids) != sorted(w for w, _ in rows):
                return
            tables = conn.execute(
                "SELECT table_name FROM information_schema.columns WHERE table_schema = "
                "'durable' AND column_name = 'workflow_id' AND table_name <> 'workflows'"
            ).fetchall()
            for (table,) in tables:
                conn.execute(f"DELETE FROM durable.{table} WHERE workflow_id = ANY(%s)", (ids,))
            conn.execute("DELETE FROM durable.budgets WHERE budget_id = ANY(%s)", (ids,))
            conn.execute("DELETE FROM durable.workflows WHERE workflow_id = ANY(%s)", (ids,))
        client.import_workflow(json.loads(json.dumps(data)))
        self.log.append(f"moved {ids}")

    # -- the end -----------------------------------------------------------------------------

    def statuses(self) -> dict[str, str]:
        with psycopg.connect(self.url, autocommit=True, application_name="sim_admin") as conn:
            rows = conn.execute("SELECT workflow_id, status FROM durable.workflows").fetchall()
        return dict(rows)

    def drain(self, rounds: int = 12) -> None:
        client = self.client
        assert client is not None
        for _ in range(rounds):
            statuses = self.statuses()
            if all(s in TERMINAL for s in statuses.values()):
                return
            self.clock.advance(4000)
            self.deployed = True  # the last deploy: its code runs every version
            for gate in client.list_approvals():
                with contextlib.suppress(errors.DurableError):
                    if gate["name"].startswith("budget@"):
                        client.raise_budget(gate["workflow_id"], dollars=5.0, steps=20)
                    else:
                        client.decide(gate["workflow_id"], gate["name"], True)
            self.run_once()

    def replay_finished(self) -> list[str]:
        """Fork each finished root from past its last position: the fork replays the whole
        journal, must return the recorded value and must call nothing in the world."""
        out: list[str] = []
        with psycopg.connect(self.url, autocommit=True, application_name="sim_admin") as conn:
            rows = conn.execute(
                "SELECT w.workflow_id, w.output, max(s.step_seq) FROM durable.workflows w "
                "JOIN durable.steps s USING (workflow_id) WHERE w.status = 'SUCCESS' "
                "AND w.parent_id IS NULL GROUP BY 1, 2 ORDER BY 1"
            ).fetchall()
        if not rows:
            return out
        client = self.client
        assert client is not None
        before = self.vendor.snapshot()
        for wid, _, last in rows:
            client.fork(wid, from_step=last + 1, new_id=f"{wid}~replay")
        self.run_once()
        with psycopg.connect(self.url, autocommit=True, application_name="sim_admin") as conn:
            for wid, output, _ in rows:
                got = conn.execute(
                    "SELECT status, output FROM durable.workflows WHERE workflow_id = %s",
                    (f"{wid}~replay",),
                ).fetchone()
                if got is None or got[0] != "SUCCESS" or got[1] != output:
                    out.append(f"replay of {wid} ended {got}, recorded {output}")
        after = self.vendor.snapshot()
        if after != before:
            out.append(f"replays called the world: {before} -> {after}")
        return out
