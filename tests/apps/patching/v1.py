"""Deploy v1 of `patching.order`: the old tax."""

from __future__ import annotations

import durable
from tests.apps.patching import WORKFLOW, run_step

registry = durable.Registry()
DEPLOY = "v1"


@durable.step(registry=registry, name="patching.a")
def step_a(order_id: str, block: dict[str, str]) -> int:
    run_step(DEPLOY, "a", order_id, block)
    return 100


@durable.step(registry=registry, name="patching.old_tax")
def old_tax(order_id: str, amount: int, block: dict[str, str]) -> int:
    run_step(DEPLOY, "old_tax", order_id, block)
    return amount * 10 // 100


@durable.step(registry=registry, name="patching.finish")
def finish(order_id: str, amount: int, tax: int, block: dict[str, str]) -> int:
    run_step(DEPLOY, "finish", order_id, block)
    return amount + tax


@durable.workflow(registry=registry, name=WORKFLOW)
def order(order_id: str, block: dict[str, str]) -> int:
    amount = step_a(order_id, block)
    tax = old_tax(order_id, amount, block)
    return finish(order_id, amount, tax, block)
