"""The workflows of the simulation: one interpreter of generated programs, sync and async.

A program is a list of instructions (plain JSON, so it is the workflow's saved input):

    ["step"]              a plain step (the vendor counts it by tag)
    ["txn"]               a @transaction writing one row of the application table
    ["pay", cents]        an @effect paying the vendor, compensated by a refund effect
    ["model", dollars]    a step that reserves, calls the metered model and charges
    ["child", own_id, p]  start_child(program p), with an id of its own or a derived one,
                          then wait for its result
    ["recv"]              recv on topic "m" (timeout 60 s), the payload consumed in a step
    ["sleep", seconds]    a durable sleep
    ["approve"]           an approval gate; a denial fails the workflow
    ["patch", cents]      on deployed code: `if patched("extra"): pay(cents)`; old code
                          has no such point
    ["par", [i1, i2]]     (async) asyncio.gather of two pay/model instructions
    ["fail"]              raise: the workflow fails and its compensations run

Every tag passed to the world names the instruction ("<label>"), so a forked run doing an
instruction again is told apart from the original by its idempotency key, not its tag.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import text

import durable
from tests.sim.world import Vendor

CAP_DOLLARS = 1.0


class Boom(Exception):
    """The program's own failure (a "fail" instruction)."""


@dataclass
class App:
    registry: durable.Registry
    prog: Any
    aprog: Any
    deployed: bool


def build(vendor: Vendor, *, deployed: bool) -> App:
    reg = durable.Registry()

    @durable.step(registry=reg, name="touch")
    def touch(tag: str) -> str:
        vendor.touch(tag)
        return tag

    @durable.transaction(registry=reg, name="book")
    def book(conn: Any, tag: str) -> str:
        wid = durable.workflow_id()
        conn.execute(
            text("INSERT INTO sim_app (workflow_id, tag) VALUES (:w, :t)"), {"w": wid, "t": tag}
        )
        return f"{wid}/{tag}"

    def lookup(key: str, tag: str, cents: int) -> str | None:
        return vendor.lookup(key)

    @durable.effect(registry=reg, name="pay", reconcile=lookup)
    def pay(tag: str, cents: int, *, idempotency_key: str) -> str:
        return vendor.pay(idempotency_key, tag, cents)

    def refunded(key: str, tag: str, cents: int) -> str | None:
        return vendor.refunded(key)

    @durable.effect(registry=reg, name="refund", reconcile=refunded)
    def refund(tag: str, cents: int, *, idempotency_key: str) -> str:
        return vendor.refund(idempotency_key, tag)

    pay.compensation(refund)  # type: ignore[attr-defined]

    @durable.step(registry=reg, name="model")
    def model(tag: str, dollars: float) -> str:
        with durable.reserve(dollars=dollars):
            vendor.model(durable.workflow_id() or "", Decimal(str(dollars)))
            durable.charge(dollars=dollars)
        return tag

    @durable.step(registry=reg, name="got")
    def got(payload: str) -> str:
        vendor.receive(payload)
        return payload

    @durable.effect(registry=reg, name="apay_effect", reconcile=lookup)
    async def apay(tag: str, cents: int, *, idempotency_key: str) -> str:
        return vendor.pay(idempotency_key, tag, cents)

    apay.compensation(refund)  # type: ignore[attr-defined]

    @durable.step(registry=reg, name="amodel")
    async def amodel(tag: str, dollars: float) -> str:
        with durable.reserve(dollars=dollars):
            await asyncio.sleep(0)
            vendor.model(durable.workflow_id() or "", Decimal(str(dollars)))
            durable.charge(dollars=dollars)
        return tag

    budget = durable.Budget(dollars=CAP_DOLLARS)

    @durable.workflow(registry=reg, name="prog", budget=budget)
    def prog(program: list[Any], label: str) -> list[Any]:
        out: list[Any] = []
        for n, ins in enumerate(program):
            tag = f"{label}.{n}"
            op = ins[0]
            if op == "step":
                out.append(touch(tag))
            elif op == "txn":
                out.append(book(tag))
            elif op == "pay":
                out.append(pay(tag, ins[1]))
            elif op == "model":
                out.append(model(tag, ins[1]))
            elif op == "child":
                kwargs = {"workflow_id": f"{durable.workflow_id()}-{tag}"} if ins[1] else {}
                child = durable.start_child(prog, ins[2], tag, **kwargs)
                out.append(child.result())
            elif op == "recv":
                message = durable.recv("m", timeout=60)
                out.append(got(message) if message is not None else None)
            elif op == "sleep":
                durable.sleep(ins[1])
                out.append("slept")
            elif op == "approve":
                decision = durable.approval(f"gate-{n}")
                if not decision.approved:
                    raise Boom(f"{tag} denied")
                out.append("approved")
            elif op == "patch":
                if deployed and durable.patched("extra"):
                    out.append(pay(tag, ins[1]))
            elif op == "fail":
                raise Boom(tag)
            elif op == "par":
                raise Boom(f"{tag}: par needs the async program")
        return out

    @durable.workflow(registry=reg, name="aprog", budget=budget)
    async def aprog(program: list[Any], label: str) -> list[Any]:
        out: list[Any] = []

        async def one(tag: str, ins: list[Any]) -> Any:
            if ins[0] == "pay":
                return await apay(tag, ins[1])
            return await amodel(tag, ins[1])

        for n, ins in enumerate(program):
            tag = f"{label}.{n}"
            op = ins[0]
            if op == "pay":
                out.append(await apay(tag, ins[1]))
            elif op == "model":
                out.append(await amodel(tag, ins[1]))
            elif op == "par":
                out.append(
                    await asyncio.gather(*(one(f"{tag}.{i}", p) for i, p in enumerate(ins[1])))
                )
            elif op == "child":
                kwargs = {"workflow_id": f"{durable.workflow_id()}-{tag}"} if ins[1] else {}
                child = await durable.start_child_async(aprog, ins[2], tag, **kwargs)
                out.append(await child.result_async())
            elif op == "recv":
                message = await durable.recv_async("m", timeout=60)
                out.append(message)
            elif op == "sleep":
                await durable.sleep_async(ins[1])
                out.append("slept")
            elif op == "approve":
                decision = await durable.approval_async(f"gate-{n}")
                if not decision.approved:
                    raise Boom(f"{tag} denied")
                out.append("approved")
            elif op == "patch":
                if deployed and await durable.patched_async("extra"):
                    out.append(await apay(tag, ins[1]))
            elif op == "fail":
                raise Boom(tag)
            else:  # step / txn: the sync program has them
                out.append(tag)
        return out

    return App(reg, prog, aprog, deployed)
