"""An app for the record-outage test (tests/acceptance/test_record_outage_worker.py), run
by `durable worker --app tests.apps.outage_app`.

Each workflow's first step writes its side effect to the `world` table
(tests/apps/counter_app.py, outside durable), then holds until the file named by
OUTAGE_MARKER exists: the test cuts the database off while every step is held, then
creates the file, so each step returns, and its record is sent, during the outage. The
second step writes to `world` too, so a test counts every call that ran.
"""

from __future__ import annotations

import asyncio
import os
import time

import durable
from tests.apps.counter_app import World

registry = durable.Registry()


def _held() -> None:
    marker = os.environ["OUTAGE_MARKER"]
    while not os.path.exists(marker):
        time.sleep(0.02)


@durable.step(registry=registry, name="outage.charge")
def charge(workflow_id: str) -> str:
    World.record(workflow_id, "charge")
    _held()
    return "charged"


@durable.step(registry=registry, name="outage.after")
def after(workflow_id: str, value: str) -> str:
    World.record(workflow_id, "after")
    return value + "!"


@durable.workflow(registry=registry, name="outage.flow")
def flow(workflow_id: str, /) -> str:
    return after(workflow_id, charge(workflow_id))


@durable.step(registry=registry, name="outage.charge_async")
async def charge_async(workflow_id: str) -> str:
    await asyncio.to_thread(World.record, workflow_id, "charge")
    await asyncio.to_thread(_held)
    return "charged"


@durable.step(registry=registry, name="outage.after_async")
async def after_async(workflow_id: str, value: str) -> str:
    await asyncio.to_thread(World.record, workflow_id, "after")
    return value + "!"


@durable.workflow(registry=registry, name="outage.flow_async")
async def flow_async(workflow_id: str, /) -> str:
    return await after_async(workflow_id, await charge_async(workflow_id))
