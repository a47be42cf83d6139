"""The throughput benchmark's workload: 10-step workflows on a queue, in two durability
modes. Worker processes load it with `durable worker --app benchmarks.throughput_app`."""

from __future__ import annotations

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
