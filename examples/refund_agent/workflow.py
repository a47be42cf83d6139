"""The refund workflow, twice: with the effect ledger, and written naively.

`durable worker --app examples.refund_agent.workflow` runs these. The vendor's address
comes from REFUND_VENDOR_URL.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import durable
from examples.refund_agent.vendor import Client

registry = durable.Registry()


def vendor() -> Client:
    return Client(os.environ["REFUND_VENDOR_URL"])


def lookup_refund(idempotency_key: str, order_id: str, cents: int) -> dict[str, Any] | None:
    """Ask the vendor whether a key landed: its receipt, or None."""
    found = vendor().lookup(idempotency_key)
    if found is not None:
        print(f"  reconcile {order_id} -> it did happen, adopting {found['id']}", flush=True)
    else:
        print(f"  reconcile {order_id} -> never landed, retrying", flush=True)
    return found


@durable.effect(registry=registry, name="refund.issue", reconcile=lookup_refund)
def issue_refund(order_id: str, cents: int, *, idempotency_key: str) -> dict[str, Any]:
    receipt = vendor().refund(order_id, cents, idempotency_key=idempotency_key)
    print(f"  refund    {order_id} -> {receipt['id']} for {cents}", flush=True)
    return receipt


@durable.workflow(registry=registry, name="refund.orders")
def refund_orders(orders: list[list[Any]]) -> int:
    return sum(int(issue_refund(str(o), int(c))["cents"]) for o, c in orders)


# The naive version: a plain step and a fresh random key per attempt, so the key does
# nothing and a resume re-issues the refund whose record was lost.
@durable.step(registry=registry, name="refund.naive_step")
def naive_refund(order_id: str, cents: int) -> dict[str, Any]:
    receipt = vendor().refund(order_id, cents, idempotency_key=str(uuid.uuid4()))
    print(f"  refund    {order_id} -> {receipt['id']} for {cents} (random key)", flush=True)
    return receipt


@durable.workflow(registry=registry, name="refund.naive_orders")
def naive_refund_orders(orders: list[list[Any]]) -> int:
    return sum(int(naive_refund(str(o), int(c))["cents"]) for o, c in orders)
