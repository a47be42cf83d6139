"""The failover test's workflows: ten journaled positions each, one of them a payment.

Three variants, so that a failover meets every path to the database: `ten` (a sync
workflow whose steps are journaled one commit each), `ten_batched` (durability="async":
its steps go through the background writer, which must hold its batch across the
outage) and `ten_async` (an `async def` workflow on the worker's event loop and its
async connection pool).

Every run of a step's code is recorded in `failover_world`, and every payment that moved
in the vendor's tables, both on a server that is not the one durable runs on (the URL in
DURABLE_VENDOR_URL), so that they show what happened across the failover.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psycopg

import durable
from tests.apps import vendor

registry = durable.Registry()
STEPS = 10
EFFECT_AT = 5
WORLD_DDL = """
CREATE TABLE IF NOT EXISTS failover_world (id bigserial PRIMARY KEY, workflow_id text,
    position int, pid int, at timestamptz NOT NULL DEFAULT clock_timestamp());
"""


def setup(world_url: str) -> None:
    with psycopg.connect(world_url, autocommit=True) as conn:
        conn.execute(WORLD_DDL)
    vendor.setup(world_url)


def _record(workflow_id: str, position: int) -> None:
    with psycopg.connect(os.environ["DURABLE_VENDOR_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO failover_world (workflow_id, position, pid) VALUES (%s, %s, %s)",
            [workflow_id, position, os.getpid()],
        )


@durable.step(registry=registry, name="failover.work")
def work(workflow_id: str, position: int) -> int:
    _record(workflow_id, position)
    time.sleep(0.02)
    return position


def lookup(idempotency_key: str, workflow_id: str, cents: int) -> dict[str, Any] | None:
    return vendor.lookup(idempotency_key)


# The vendor does not deduplicate keys: a second call would move the money twice.
@durable.effect(registry=registry, name="failover.charge", reconcile=lookup)
def charge(workflow_id: str, cents: int, *, idempotency_key: str) -> dict[str, Any]:
    _record(workflow_id, EFFECT_AT)
    return vendor.refund(workflow_id, cents, idempotency_key, dedup=False)


def _ten(tag: str) -> int:
    total = 0
    for position in range(STEPS):
        if position == EFFECT_AT:
            total += int(charge(tag, 100)["cents"])
        else:
            total += work(tag, position)
    return total


ten = durable.workflow(registry=registry, name="failover.ten")(_ten)
ten_batched = durable.workflow(registry=registry, name="failover.ten_batched", durability="async")(
    _ten
)


@durable.step(registry=registry, name="failover.work_async")
async def work_async(workflow_id: str, position: int) -> int:
    await asyncio.to_thread(_record, workflow_id, position)
    await asyncio.sleep(0.02)
    return position


@durable.effect(registry=registry, name="failover.charge_async", reconcile=lookup)
async def charge_async(workflow_id: str, cents: int, *, idempotency_key: str) -> dict[str, Any]:
    await asyncio.to_thread(_record, workflow_id, EFFECT_AT)
    return await asyncio.to_thread(vendor.refund, workflow_id, cents, idempotency_key, dedup=False)


@durable.workflow(registry=registry, name="failover.ten_async")
async def ten_async(tag: str) -> int:
    total = 0
    for position in range(STEPS):
        if position == EFFECT_AT:
            total += int((await charge_async(tag, 100))["cents"])
        else:
            total += await work_async(tag, position)
    return total
