"""Deploy v3 of `patching.order`: no run from before the patch is left, so only the new
branch remains, and the patch is deprecated where it stood."""

from __future__ import annotations

import durable
from tests.apps.patching import WORKFLOW, run_step

registry = durable.Registry()
DEPLOY = "v3"


@durable.step(registry=registry, name="patching.a")
def step_a(order_id: str, block: dict[str, str]) -> int:
    run_step(DEPLOY, "a", order_id, block)
    return 100


@durable.step(registry=registry, name="patching.new_tax")
def new_tax(order_id: str, amount: int, block: dict[str, str]) -> int:
    run_step(DEPLOY, "new_tax", order_id, block)
    return amount * 20 // 100


@durable.step(registry=registry, name="patching.audit")
def audit(order_id: str, tax: int, block: dict[str, str]) -> None:
    run_step(DEPLOY, "audit", order_id, block)


@durable.step(registry=registry, name="patching.finish")
def finish(order_id: str, amount: int, tax: int, block: dict[str, str]) -> int:
    run_step(DEPLOY, "finish", order_id, block)
    return amount + tax


@durable.workflow(registry=registry, name=WORKFLOW)
def order(order_id: str, block: dict[str, str]) -> int:
    amount = step_a(order_id, block)
    durable.deprecate_patch("fix-tax")
    tax = new_tax(order_id, amount, block)
    audit(order_id, tax, block)
    return finish(order_id, amount, tax, block)
