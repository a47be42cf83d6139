"""A crash inside one process: the crash matrices of tests/acceptance, without a process.

A run dies where `DURABLE_CRASH_POINTS` would SIGKILL a worker: the engine's crash hook
(Runner.crash_point, the one the protocol calls at each worst moment) is armed on a
simulated process (tests/sim/faults.py). At the n-th pass of the point the process dies
as SIGKILL leaves it, seen from the database: its backends are terminated (an open
transaction rolls back), every later round trip of it raises `Crash` (no clean-up of the
dead process writes anything), and its lease is left to run out. A second engine then
moves the shared FakeClock past that lease and claims the run, as a fresh worker does.

What a case asserts is the world the run touched (the counter app's tables, the vendor's
rows, the journal), never a log line.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import durable
from tests.sim import faults
from tests.sim.faults import Crash

T0 = dt.datetime(2027, 1, 4, 9, 0, tzinfo=dt.UTC)
LEASE = 5.0


@dataclass
class Node:
    """One simulated process: its fault handle and its engine."""

    proc: faults.Process
    engine: durable.Engine
    crashed_at: list[str] = field(default_factory=list)

    def busy(self) -> int:
        slots = self.engine.runner.slots
        return slots.threads_running() + slots.tasks_running()

    def wait_dead(self, timeout: float = 60) -> None:
        """Until the armed point has killed the process and its runs have ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.dead and self.busy() == 0:
                return
            time.sleep(0.01)
        raise AssertionError(f"{self.proc.name} never reached its crash point")


def _arm(node: Node, crash: str) -> None:
    """Arm `point:nth` on the runner (what DURABLE_CRASH_POINTS does), dying in-process."""
    point, _, nth = crash.partition(":")
    at = int(nth or "1")
    counts: dict[str, int] = {}

    def crash_point(name: str) -> None:
        if node.proc.dead:
            raise Crash(node.proc.name)
        if name != point:
            return
        counts[name] = counts.get(name, 0) + 1
        if counts[name] == at:
            node.crashed_at.append(f"{name}:{at}")
            node.proc.kill()
            raise Crash(node.proc.name)

    # Read by Runner.open into the run settings and the record writers.
    node.engine.runner.crash_point = crash_point  # type: ignore[method-assign]


@contextlib.contextmanager
def process(
    url: str,
    registry: durable.Registry,
    clock: durable.FakeClock,
    *,
    crash: str | None = None,
    worker: bool = True,
    **options: object,
) -> Iterator[Node]:
    """A process (an Engine on connections named for it) that works the database; with
    `crash`, it dies at that point. On leaving, a dead process's lease is run out on the
    clock; a live one shuts down cleanly."""
    proc = faults.new_process(url)
    engine = durable.Engine(
        f"{url} application_name={proc.name}",
        registry=registry,
        clock=clock,
        listen=False,
        worker=worker,
        poll_interval=0.05,
        lease_seconds=LEASE,
        **options,  # type: ignore[arg-type]
    )
    node = Node(proc, engine)
    if crash:
        _arm(node, crash)
    engine.launch()
    engine.runner.db._sim_process = proc.name  # type: ignore[attr-defined]
    try:
        yield node
    finally:
        if node.proc.dead:
            # Nothing of a dead process reaches the database; its threads end on Crash.
            with contextlib.suppress(BaseException):
                engine.shutdown(wait=False)
            with contextlib.suppress(BaseException):
                engine.client.db.close()
            clock.advance(LEASE + 1)  # nobody renews its lease: it runs out
        else:
            with contextlib.suppress(Crash):
                engine.shutdown(wait=True)
        faults.forget(proc)


def crash_then_recover(
    url: str,
    registry: durable.Registry,
    crash: str,
    submit: Callable[[durable.Client], object],
    *,
    clock: durable.FakeClock | None = None,
    **options: Any,
) -> tuple[durable.Client, durable.FakeClock]:
    """Submit through `submit(client)`, let a process die at `crash`, and return the
    client (and clock) for a second process to recover with."""
    clock = clock or durable.FakeClock(T0)
    client = durable.Client(url, clock=clock)
    client.connect()
    submit(client)
    with process(url, registry, clock, crash=crash, **options) as node:
        node.wait_dead()
    assert node.crashed_at, f"{crash} was never reached"
    return client, clock
