"""Pause and unpause (Client.pause, Client.unpause): a paused run stops at its next step
boundary and holds no slot; unpaused, it goes on where it stopped and no step runs twice.

The world is `ran`: how many times each step's code ran. The operator is a Client of its
own (another process's view): its pause reaches the worker through the database, as the
worker's heartbeat reads it."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
import threading
import time
from collections import Counter

import psycopg
import pytest

import durable
from durable import errors
from durable._base.models import WorkflowStatus

# Longer than the heartbeat's poll for requests (half a second at most): a pause asked
# before it has been read by the worker.
SEEN = 1.0


def wait_status(client: durable.Client, workflow_id: str, status: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while client.get_workflow(workflow_id).status != status:
        assert time.monotonic() < deadline, client.get_workflow(workflow_id)
        time.sleep(0.02)


def wait_for(condition: threading.Event) -> None:
    assert condition.wait(20)


class World(Counter[str]):
    """How many times each step's code ran; `started`: the first step is under way;
    `gate`: what it waits for before it returns."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.gate = threading.Event()


def stepper_app(kind: str) -> tuple[durable.Registry, durable.Queue, object, object, World]:
    """A workflow of three steps whose first waits for `gate`, and another workflow, both
    on a queue of one slot."""
    reg = durable.Registry()
    solo = durable.Queue("solo", concurrency=1, registry=reg)
    ran = World()
    started, gate = ran.started, ran.gate

    if kind == "async":

        @durable.step(registry=reg, name="a")
        async def a() -> int:
            ran["a"] += 1
            started.set()
            await asyncio.to_thread(gate.wait, 20)
            return 1

        @durable.step(registry=reg, name="b")
        async def b() -> int:
            ran["b"] += 1
            return 2

        @durable.step(registry=reg, name="c")
        async def c() -> int:
            ran["c"] += 1
            return 3

        @durable.workflow(registry=reg, name="stepper")
        async def stepper() -> int:
            return await a() + await b() + await c()

    else:

        @durable.step(registry=reg, name="a")
        def a() -> int:
            ran["a"] += 1
            started.set()
            gate.wait(20)
            return 1

        @durable.step(registry=reg, name="b")
        def b() -> int:
            ran["b"] += 1
            return 2

        @durable.step(registry=reg, name="c")
        def c() -> int:
            ran["c"] += 1
            return 3

        @durable.workflow(registry=reg, name="stepper")
        def stepper() -> int:
            return a() + b() + c()

    @durable.step(registry=reg, name="o")
    def o() -> str:
        ran["o"] += 1
        return "other"

    @durable.workflow(registry=reg, name="other")
    def other() -> str:
        return o()

    return reg, solo, stepper, other, ran


@pytest.mark.parametrize(
    ("kind", "claims"), [("sync", "skip-locked"), ("async", "skip-locked"), ("sync", "cas")]
)
def test_a_paused_run_stops_at_its_boundary_frees_its_slot_and_goes_on_once_unpaused(
    database_url: str, monkeypatch: pytest.MonkeyPatch, kind: str, claims: str
) -> None:
    monkeypatch.setenv("DURABLE_CLAIMS", claims)
    reg, solo, stepper, other, ran = stepper_app(kind)
    with (
        durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine,
        durable.Client(database_url) as operator,
    ):
        engine.enqueue(solo, stepper, workflow_id="p1")
        wait_for(ran.started)
        engine.enqueue(solo, other, workflow_id="o1")
        # Running: asked, it goes on to its boundary (the step in flight finishes).
        assert operator.pause("p1") is WorkflowStatus.RUNNING
        assert operator.get_workflow("p1").pause_requested
        assert operator.pause("p1") is WorkflowStatus.RUNNING  # asked already: no change
        time.sleep(SEEN)
        ran.gate.set()
        wait_status(operator, "p1", "PAUSED")
        # The queue's one slot is free: the other entry runs while p1 is paused.
        assert engine.retrieve("o1").result(timeout=20) == "other"
        time.sleep(0.3)  # several claim rounds: none takes the paused run
        assert operator.get_workflow("p1").status is WorkflowStatus.PAUSED
        assert ran == {"a": 1, "o": 1}  # the step after the boundary did not run
        assert [s.step_name for s in operator.steps("p1")] == ["a"]
        listed = operator.list_workflows(status="PAUSED")
        assert [i.workflow_id for i in listed] == ["p1"]
        assert operator.pause("p1") is WorkflowStatus.PAUSED  # paused already: no change

        assert operator.unpause("p1") is WorkflowStatus.PENDING
        assert engine.retrieve("p1").result(timeout=20) == 6
    assert ran == {"a": 1, "b": 1, "c": 1, "o": 1}  # each step ran exactly once
    with durable.Client(database_url) as operator:
        actions = [r["action"] for r in operator.audit_log("p1")]
        assert actions == ["unpause", "pause"]  # newest first; the repeats changed nothing


def test_a_sleeping_or_waiting_run_paused_does_not_wake_until_unpaused(database_url: str) -> None:
    """A suspended run is PAUSED at once; its wake-up time passing, or the message it
    waits for arriving, wakes nothing. The message is kept: unpaused, the run gets it."""
    reg = durable.Registry()
    ran: Counter[str] = Counter()

    @durable.step(registry=reg, name="after")
    def after(what: str) -> str:
        ran[what] += 1
        return what

    @durable.workflow(registry=reg, name="sleeper")
    def sleeper() -> str:
        durable.sleep(3600)
        return after("slept")

    @durable.workflow(registry=reg, name="listener")
    def listener() -> str:
        return after(str(durable.recv("go")))

    clock = durable.FakeClock(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    with (
        durable.Engine(
            database_url, registry=reg, worker=True, poll_interval=0.05, clock=clock
        ) as engine,
        durable.Client(database_url, clock=clock) as operator,
    ):
        engine.submit(sleeper, workflow_id="s1")
        engine.submit(listener, workflow_id="l1")
        wait_status(operator, "s1", "SUSPENDED")
        wait_status(operator, "l1", "SUSPENDED")
        assert operator.pause("s1") is WorkflowStatus.PAUSED
        assert operator.pause("l1") is WorkflowStatus.PAUSED
        clock.advance(7200)  # past the wake-up
        operator.send("l1", "hello", topic="go")
        time.sleep(0.5)  # several rounds of wake-ups and claims
        assert operator.get_workflow("s1").status is WorkflowStatus.PAUSED
        assert operator.get_workflow("l1").status is WorkflowStatus.PAUSED
        assert ran == {}
        assert operator.unpause("s1") is WorkflowStatus.PENDING
        assert operator.unpause("l1") is WorkflowStatus.PENDING
        assert engine.retrieve("s1").result(timeout=20) == "slept"
        assert engine.retrieve("l1").result(timeout=20) == "hello"
    assert ran == {"slept": 1, "hello": 1}


def test_a_paused_run_cancelled_ends_cancelled_and_is_never_claimed_again(
    database_url: str,
) -> None:
    reg, _solo, stepper, other, ran = stepper_app("sync")
    with durable.Client(database_url, migrate=True) as operator:
        # Never started: paused before any worker, then cancelled at once.
        operator.submit(other, workflow_id="never")
        assert operator.pause("never") is WorkflowStatus.PAUSED
        assert operator.cancel("never") is WorkflowStatus.CANCELLED
        with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
            # Started: paused at its boundary, then cancelled: a worker stops it.
            engine.submit(stepper, workflow_id="p2")
            wait_for(ran.started)
            operator.pause("p2")
            time.sleep(SEEN)
            ran.gate.set()
            wait_status(operator, "p2", "PAUSED")
            operator.cancel("p2")
            with pytest.raises(errors.WorkflowCancelledError):
                engine.retrieve("p2").result(timeout=20)
            time.sleep(0.3)  # claim rounds after the end
        assert operator.get_workflow("p2").status is WorkflowStatus.CANCELLED
        assert operator.get_workflow("never").status is WorkflowStatus.CANCELLED
        assert ran == {"a": 1}  # neither ran anything more
        # A finished workflow is neither paused nor unpaused, and says why.
        with pytest.raises(errors.WorkflowNotPausableError, match="finished \\(CANCELLED\\)"):
            operator.pause("p2")
        with pytest.raises(errors.WorkflowNotPausableError) as info:
            operator.unpause("never")
        assert info.value.status == "CANCELLED"
        assert isinstance(info.value, errors.StateError)
        with pytest.raises(errors.WorkflowNotFoundError):
            operator.pause("nobody")
        # Unpausing what is not paused changes nothing.
        operator.submit(other, workflow_id="waits")
        assert operator.unpause("waits") is WorkflowStatus.PENDING
        assert [r["action"] for r in operator.audit_log("p2")] == ["cancel", "pause"]
        assert operator.audit_log("waits") == []


def test_a_queued_entry_paused_goes_back_to_its_queue_and_the_cli_pauses_lists_unpauses(
    database_url: str,
) -> None:
    reg = durable.Registry()
    lane = durable.Queue("lane", registry=reg)

    @durable.workflow(registry=reg, name="noop")
    def noop() -> int:
        return 1

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "durable.cli", "workflows", *args, "--database-url",
             database_url], capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    with durable.Client(database_url, migrate=True) as client:
        client.enqueue(lane, noop, workflow_id="q1")
        out = cli("pause", "q1")
        assert out.returncode == 0, out.stderr
        assert "paused q1" in out.stdout
        listed = cli("list", "--status", "paused")
        assert "q1" in listed.stdout and "PAUSED" in listed.stdout
        out = cli("unpause", "q1")
        assert out.returncode == 0, out.stderr
        assert client.get_workflow("q1").status is WorkflowStatus.ENQUEUED  # its place kept
        client.cancel("q1")
        refused = cli("pause", "q1")
        assert refused.returncode != 0
        assert "cannot be paused" in refused.stderr
        assert [r["action"] for r in client.audit_log("q1")] == ["cancel", "unpause", "pause"]


def _lapsed(url: str, workflow_id: str, *, paused: bool) -> None:
    """The row a worker leaves when it dies holding the workflow: RUNNING, its lease run
    out; `paused`: a pause had been asked of that run before it reached its boundary."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable.workflows SET status = 'RUNNING', owner = 'gone', epoch = 1,"
            " lease_expires_at = now() - interval '1 minute',"
            " paused_at = CASE WHEN %s THEN now() END WHERE workflow_id = %s",
            [paused, workflow_id],
        )


def test_a_pause_asked_of_a_run_whose_worker_died_holds_its_next_run_or_lands_at_once(
    database_url: str,
) -> None:
    """Asked before the worker died: the run that recovers the workflow replays and stops at
    its first new step. Asked after: nothing runs it to stop it, it is PAUSED at once (its
    epoch bumped, so the dead run's writes are refused should it be alive after all)."""
    reg, _solo, stepper, other, ran = stepper_app("sync")
    ran.gate.set()
    with durable.Client(database_url, migrate=True) as operator:
        operator.submit(stepper, workflow_id="asked-before")
        operator.submit(other, workflow_id="asked-after")
        _lapsed(database_url, "asked-before", paused=True)
        _lapsed(database_url, "asked-after", paused=False)
        assert operator.pause("asked-after") is WorkflowStatus.PAUSED
        assert operator.get_workflow("asked-after").epoch == 2
        with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05):
            wait_status(operator, "asked-before", "PAUSED")
            time.sleep(0.3)
            assert ran == {}  # the recovering run stopped before its first step
            assert operator.get_workflow("asked-after").status is WorkflowStatus.PAUSED
            operator.unpause("asked-before")
            operator.unpause("asked-after")
            wait_status(operator, "asked-before", "SUCCESS")
            wait_status(operator, "asked-after", "SUCCESS")
    assert ran == {"a": 1, "b": 1, "c": 1, "o": 1}
