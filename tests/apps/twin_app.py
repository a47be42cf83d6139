"""A worker app whose step can be held open, for tests of two processes sharing one executor id.

Each entry into the step and each exit from it is recorded in counter_app's `world` table
(its own autocommit connection, outside durable), with the pid of the process that ran it;
the step stays inside until the test creates its gate file.
"""

from __future__ import annotations

import os
import time

import durable
from tests.apps.counter_app import World

registry = durable.Registry()


@durable.step(registry=registry, name="twin.held")
def held(workflow_id: str, gate: str) -> str:
    World.record(workflow_id, "enter")
    while not os.path.exists(gate):
        time.sleep(0.02)
    World.record(workflow_id, "leave")
    return "done"


@durable.workflow(registry=registry, name="twin.hold")
def hold(workflow_id: str, /, gate: str) -> str:
    return held(workflow_id, gate)


@durable.step(registry=registry, name="twin.mark")
def mark(workflow_id: str) -> str:
    World.record(workflow_id, "mark")
    return workflow_id


@durable.workflow(registry=registry, name="twin.quick")
def quick(workflow_id: str, /) -> str:
    return mark(workflow_id)


@durable.workflow(registry=registry, name="twin.mark_then_hold")
def mark_then_hold(workflow_id: str, /, gate: str) -> str:
    """A finished step (it must not run again), then one held open until the gate."""
    mark(workflow_id)
    return held(workflow_id, gate)
