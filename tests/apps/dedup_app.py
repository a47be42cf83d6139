"""A workflow that enqueues a child under a dedup key, takes another branch when the key is
held (the refusal is an outcome of that call), then waits in a step for a marker file, so a
test can SIGKILL its worker there. Every child step and every branch taken is recorded in
the `world` table."""

from __future__ import annotations

import os
import time

import durable
from durable import errors
from tests.apps.counter_app import World

registry = durable.Registry()
queue = durable.Queue("dedup.q", registry=registry)


@durable.step(registry=registry, name="dedup.kid_step")
def kid_step(n: int) -> int:
    World.record(f"kid-{n}", "ran")
    return n


@durable.workflow(registry=registry, name="dedup.kid")
def kid(n: int) -> int:
    return kid_step(n)


@durable.step(registry=registry, name="dedup.hold_here")
def hold_here(taken: str, marker: str) -> None:
    World.record("parent", taken)
    while not os.path.exists(marker):  # SIGKILLed here
        time.sleep(0.05)


@durable.workflow(registry=registry, name="dedup.parent")
def parent(marker: str) -> str:
    try:
        taken = f"enqueued {queue.enqueue(kid, 2, dedup_key='k').workflow_id}"
    except errors.QueueDedupError as refused:
        taken = f"refused: {refused.workflow_id} holds {refused.dedup_key}"
    hold_here(taken, marker)
    return taken
