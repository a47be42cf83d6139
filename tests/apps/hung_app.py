"""An app for the hung-database test (tests/acceptance/test_hung_database.py), run by
`durable worker --app tests.apps.hung_app`.

Each step of `hung.steps` (and of its `async def` twin) takes a moment, then writes
(workflow, step, pid) to the `world` table (tests/apps/counter_app.py) through a
connection of its own to HUNG_WORLD_URL, the database itself: the worker's own connections
go through a proxy the test freezes, the world's do not, so the table shows every step
that ran, by whom, even while the worker's database hangs.
"""

from __future__ import annotations

import asyncio
import os
import time

import psycopg

import durable

registry = durable.Registry()


def _run(workflow_id: str, label: str) -> str:
    time.sleep(0.1)
    with psycopg.connect(os.environ["HUNG_WORLD_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO world (workflow_id, what, pid) VALUES (%s, %s, %s)",
            [workflow_id, label, os.getpid()],
        )
    return label


@durable.step(registry=registry, name="hung.step")
def step(workflow_id: str, label: str) -> str:
    return _run(workflow_id, label)


@durable.workflow(registry=registry, name="hung.steps")
def steps(workflow_id: str, /, n: int) -> int:
    return len([step(workflow_id, f"s{i}") for i in range(n)])


@durable.step(registry=registry, name="hung.step_async")
async def step_async(workflow_id: str, label: str) -> str:
    return await asyncio.to_thread(_run, workflow_id, label)


@durable.workflow(registry=registry, name="hung.steps_async")
async def steps_async(workflow_id: str, /, n: int) -> int:
    return len([await step_async(workflow_id, f"s{i}") for i in range(n)])
