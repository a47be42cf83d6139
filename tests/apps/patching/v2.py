"""Deploy v2 of `patching.order`: the tax fixed behind a patch, with an audit step."""

from __future__ import annotations

import durable
from tests.apps.patching import WORKFLOW, run_step

registry = durable.Registry()
DEPLOY = "v2"


@durable.step(registry=registry, name="patching.a")
def step_a(order_id: str, block: dict[str, str]) -> int:
    run_step(DEPLOY, "a", order_id, block)
    return 100


@durable.step(registry=registry, name="patching.old_tax")
def old_tax(order_id: str, amount: int, block: dict[str, str]) -> int:
    run_step(DEPLOY, "old_tax", order_id, block)
    return amount * 10 // 100


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
    if durable.patched("fix-tax"):
        tax = new_tax(order_id, amount, block)
        audit(order_id, tax, block)
    else:
        tax = old_tax(order_id, amount, block)
    return finish(order_id, amount, tax, block)
