"""Async workflows that fan out under asyncio.gather: ten steps, or ten children of one
step each, that finish in a random order. Every execution of a step is written to the
`calls` table with the pid of the process that ran it, so a test can tell which process
did what.

    python -m tests.apps.parallel_app steps|children WORKFLOW_ID   (prints the result)
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys

import psycopg

import durable

registry = durable.Registry()
URL = os.environ.get("DURABLE_DATABASE_URL", "")


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS calls (id bigserial PRIMARY KEY, workflow_id text,"
            " i int, pid int)"
        )


@durable.step(registry=registry)
async def answer(workflow_id: str, i: int) -> int:
    await asyncio.sleep(random.random() * 0.4)  # finish in a random order
    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO calls (workflow_id, i, pid) VALUES (%s, %s, %s)",
            [workflow_id, i, os.getpid()],
        )
    return i * i


@durable.workflow(registry=registry)
async def fan_steps(workflow_id: str, /) -> list[int]:
    return list(await asyncio.gather(*(answer(workflow_id, i) for i in range(10))))


@durable.workflow(registry=registry)
async def one(workflow_id: str, /, i: int) -> int:
    return await answer(workflow_id, i)


@durable.workflow(registry=registry)
async def fan_children(workflow_id: str, /) -> list[int]:
    return list(await asyncio.gather(*(one(workflow_id, i) for i in range(10))))


async def main(kind: str, workflow_id: str) -> None:
    fn = fan_steps if kind == "steps" else fan_children
    async with durable.Engine(URL, registry=registry, lease_seconds=1) as engine:
        handle = await engine.start_async(fn, workflow_id, workflow_id=workflow_id)
        print(json.dumps(await handle.result(timeout=60)))


if __name__ == "__main__":
    setup(URL)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
