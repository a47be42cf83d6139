"""Async agents that fan their model calls out under asyncio.gather, under a budget. Every
call that reaches the (fake) model vendor is written to `vendor_calls` before the step
charges for it, so a test can compare what the world saw with what the ledger recorded.

    fan_<limit>(workflow_id, n, how): n parallel steps; each awaits its call, then
    charges $0.30 and 100 tokens.
    how = "charge" (charge after the call), "reserve" (reserve $0.30 first, then call and
    charge) or "plain" (no charge: for a steps= limit).
"""

from __future__ import annotations

import asyncio
import os
import random

import psycopg

import durable

registry = durable.Registry()
URL = os.environ.get("DURABLE_DATABASE_URL", "")


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS vendor_calls (id bigserial PRIMARY KEY,"
            " workflow_id text, i int)"
        )


async def _call_vendor(workflow_id: str, i: int) -> None:
    await asyncio.sleep(random.random() * 0.05)  # the model call's latency
    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO vendor_calls (workflow_id, i) VALUES (%s, %s)", [workflow_id, i]
        )


@durable.step(registry=registry)
async def think(workflow_id: str, i: int, how: str) -> int:
    if how == "reserve":
        with durable.reserve(dollars=0.3, tokens=100):
            await _call_vendor(workflow_id, i)
            durable.charge(dollars=0.3, tokens=100)
        return i
    await _call_vendor(workflow_id, i)
    if how == "charge":
        durable.charge(dollars=0.3, tokens=100)
    return i


async def _fan(workflow_id: str, n: int, how: str) -> list[int]:
    return list(await asyncio.gather(*(think(workflow_id, i, how) for i in range(n))))


@durable.workflow(registry=registry, budget=durable.Budget(dollars=1.0))
async def fan_dollars(workflow_id: str, /, n: int, how: str) -> list[int]:
    return await _fan(workflow_id, n, how)


@durable.workflow(registry=registry, budget=durable.Budget(tokens=300))
async def fan_tokens(workflow_id: str, /, n: int, how: str) -> list[int]:
    return await _fan(workflow_id, n, how)


@durable.workflow(registry=registry, budget=durable.Budget(steps=3))
async def fan_steps(workflow_id: str, /, n: int, how: str) -> list[int]:
    return await _fan(workflow_id, n, how)


@durable.step(registry=registry)
async def slow_call(workflow_id: str, i: int) -> int:
    await asyncio.sleep(1.5)  # still running when its sibling parks the workflow
    await _call_vendor(workflow_id, i)
    return i


async def _wait(how: str) -> str:
    if how == "sleep":
        await durable.sleep_async(2.0)  # long enough to suspend, not to sleep in place
        return "slept"
    if how == "recv":
        return str(await durable.recv_async("go", timeout=30))
    decision = await durable.approval_async("ship", {"what": "the order"})
    return "approved" if decision.approved else "denied"


@durable.workflow(registry=registry)
async def call_while_waiting(workflow_id: str, /, how: str) -> list[object]:
    """One branch calls the vendor for 1.5 s, another parks the workflow meanwhile."""
    return list(await asyncio.gather(slow_call(workflow_id, 0), _wait(how)))
