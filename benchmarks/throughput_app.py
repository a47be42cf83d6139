"""The throughput benchmark's workload: 10-step workflows on a queue, in two durability
modes. Worker processes load it with `durable worker --app benchmarks.throughput_app`."""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any

import durable

registry = durable.Registry()
STEPS = 10
jobs = durable.Queue("bench.jobs", registry=registry)


@durable.step(registry=registry, name="bench.tp.step")
def work(i: int) -> dict[str, Any]:
    return {"i": i, "ok": True}


@durable.workflow(registry=registry, name="bench.tp.sync", durability="sync")
def ten_sync(n: int) -> int:
    for i in range(n):
        work(i)
    return n


@durable.workflow(registry=registry, name="bench.tp.async", durability="async")
def ten_async(n: int) -> int:
    for i in range(n):
        work(i)
    return n


WORKFLOWS = {"sync": ten_sync, "async": ten_async}


# Statements of the SystemDBs closed so far: an engine closed on the way out may be freed
# before the exit handler looks for it (a garbage collection in between frees its cycles),
# so each one's count is taken as it closes.
_closed = {"statements": 0}
_counted: weakref.WeakSet[Any] = weakref.WeakSet()


def _count_on_close() -> None:
    from durable._io.systemdb import SystemDB

    close = SystemDB.close

    def counted_close(self: SystemDB) -> None:
        if self not in _counted:
            _counted.add(self)
            _closed["statements"] += self.counters.statements
        close(self)

    SystemDB.close = counted_close  # type: ignore[method-assign]


def _write_counts(path: str) -> None:
    """At exit: the statements this worker process sent to the system database (every
    SystemDB's counter, those closed and those still open; its start-up and shutdown
    included), for the benchmark to read."""
    import gc

    from durable._io.systemdb import SystemDB

    sent = _closed["statements"] + sum(
        o.counters.statements
        for o in gc.get_objects()
        if isinstance(o, SystemDB) and o not in _counted
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(str(sent))


if os.environ.get("DURABLE_BENCH_COUNTS"):
    _count_on_close()
    atexit.register(_write_counts, os.environ["DURABLE_BENCH_COUNTS"])
