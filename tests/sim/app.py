"""The workflows of the simulation: one interpreter of generated programs, sync and async.

A program is a list of instructions (plain JSON, so it is the workflow's saved input):

    ["step"]              a plain step (the vendor counts it by tag)
    ["txn"]               a @transaction writing one row of the application table
    ["pay", cents]        an @effect paying the vendor, compensated by a refund effect
    ["model", dollars]    a step that reserves, calls the metered model and charges
    ["llm", max_tokens]   a model call through durable.llm.wrap (an OpenAI client whose
                          transport is the vendor, in-process)
    ["child", how, p]     a child running program p, then its result: how is "derived"
                          (start_child), "own" (start_child under an id of its own),
                          "submit" (Client.submit from workflow code) or "enqueue" (on
                          queue "simq", concurrency 2); the last two are not awaited
    ["send"]              send a message to workflow w0 (topic "m") from workflow code
    ["recv"]              recv on topic "m" (timeout 60 s), the payload consumed in a step
    ["sleep", seconds]    a durable sleep
    ["approve"]           an approval gate; a denial fails the workflow
    ["patch", old]        a patch point: old code does `old` ("pay", "own", "txn"); the
                          deployed code does `if patched("extra"): pay(<tag>.new) else old`
    ["par", [i1, i2..]]   (async) asyncio.gather of pay/model/llm instructions
    ["fail"]              raise: the workflow fails and its compensations run

Each program runs as `prog` / `aprog` (sync / async, under a budget: every step of a
budgeted run is recorded synchronously) or `fprog` / `faprog` (no budget: the durability
mode decides when steps are recorded). The deployed code (a mid-run deploy) takes the
new branch of patch points and also serves every workflow as version "2", so that an
operator can move a run there.

Every call into the world carries its instruction's tag ("<label>.<n>"), so a forked run
doing an instruction again is told apart from the original by its idempotency key.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx2 as httpx
import openai
from sqlalchemy import text

import durable
from durable import llm
from tests.apps.model_stub import _chat, usage_of
from tests.sim import faults
from tests.sim.world import Vendor

BUDGET = durable.Budget(dollars=2.0, steps=12)  # a scenario's "budget" may be tighter
PRICES = {"sim-model": llm.Price(1000, 1000)}  # dollars per million tokens: ~$0.3 a call


class Boom(Exception):
    """The program's own failure (a "fail" instruction, or a gate denied)."""


@dataclass
class App:
    registry: durable.Registry
    prog: Any  # budgeted (every step of a budgeted run is recorded synchronously)
    aprog: Any
    fprog: Any  # no budget: the durability mode decides when steps are recorded
    faprog: Any
    deployed: bool

    def workflow(self, kind: str) -> Any:
        return {"prog": self.prog, "aprog": self.aprog, "fprog": self.fprog, "faprog": self.faprog}[
            kind
        ]


def model_client(vendor: Vendor, is_async: bool) -> Any:
    """An OpenAI client whose requests are answered in-process by the vendor, which
    records each one with the process that sent it."""

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        prompt = body["messages"][-1]["content"]
        vendor.llm(prompt)
        tokens_in, tokens_out = usage_of(prompt)
        return httpx.Response(
            200, json=_chat(body["model"], f"re {prompt}", tokens_in, tokens_out, False)
        )

    if is_async:

        async def answer_async(request: httpx.Request) -> httpx.Response:
            return answer(request)

        client_class: Any = openai.AsyncOpenAI
        http = httpx.AsyncClient(transport=httpx.MockTransport(answer_async))
    else:
        client_class = openai.OpenAI
        http = httpx.Client(transport=httpx.MockTransport(answer))
    sdk = client_class(api_key="sim", base_url="http://vendor/v1", max_retries=0, http_client=http)
    return llm.wrap(sdk, prices=PRICES)


def build(
    vendor: Vendor, client: durable.Client, *, deployed: bool, budget: durable.Budget = BUDGET
) -> App:
    reg = durable.Registry()
    chat = model_client(vendor, False)
    achat = model_client(vendor, True)

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
            vendor.model(tag, Decimal(str(dollars)))
            durable.charge(dollars=dollars)
        return tag

    def ask(tag: str, max_tokens: int) -> str:
        reply = chat.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": tag}],
            max_completion_tokens=max_tokens,
        )
        return str(reply.choices[0].message.content)

    async def aask(tag: str, max_tokens: int) -> str:
        reply = await achat.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": tag}],
            max_completion_tokens=max_tokens,
        )
        return str(reply.choices[0].message.content)

    @durable.step(registry=reg, name="got")
    def got(payload: str) -> str:
        vendor.receive(payload)
        return payload

    @durable.effect(registry=reg, name="apay", reconcile=lookup)
    async def apay(tag: str, cents: int, *, idempotency_key: str) -> str:
        return vendor.pay(idempotency_key, tag, cents)

    apay.compensation(refund)  # type: ignore[attr-defined]

    @durable.step(registry=reg, name="amodel")
    async def amodel(tag: str, dollars: float) -> str:
        with durable.reserve(dollars=dollars):
            await asyncio.sleep(0)
            vendor.model(tag, Decimal(str(dollars)))
            durable.charge(dollars=dollars)
        return tag

    queue = durable.Queue("simq", concurrency=2, registry=reg)

    def child(how: str, program: list[Any], tag: str, budgeted: bool) -> Any:
        fn = prog if budgeted else fprog
        own = {"workflow_id": f"{durable.workflow_id()}-{tag}"}
        if how == "submit":
            return client.submit(fn, program, tag).workflow_id  # not awaited
        if how == "enqueue":
            return queue.enqueue(fn, program, tag).workflow_id  # not awaited
        handle = durable.start_child(fn, program, tag, **(own if how == "own" else {}))
        return handle.result()

    def old_branch(old: str, tag: str, budgeted: bool) -> Any:
        if old == "own":
            return child("own", [["pay", 40]], f"{tag}.old", budgeted)
        if old == "txn":
            return book(f"{tag}.old")
        return pay(f"{tag}.old", 30)

    def run_program(program: list[Any], label: str, budgeted: bool) -> list[Any]:
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
            elif op == "llm":
                proc = faults.process_of_run()
                if proc is not None:
                    proc.alive()
                out.append(ask(tag, ins[1]))
            elif op == "child":
                out.append(child(ins[1], ins[2], tag, budgeted))
            elif op == "recv":
                message = durable.recv("m", timeout=60)
                out.append(got(message) if message is not None else None)
            elif op == "sleep":
                durable.sleep(ins[1])
                out.append("slept")
            elif op == "approve":
                if not durable.approval(f"gate-{n}").approved:
                    raise Boom(f"{tag} denied")
                out.append("approved")
            elif op == "patch":
                if deployed and durable.patched("extra"):
                    out.append(pay(f"{tag}.new", 20))
                else:
                    out.append(old_branch(ins[1], tag, budgeted))
            elif op == "send":
                durable.send("w0", f"{durable.workflow_id()}/{tag}", topic="m")
                out.append("sent")
            elif op == "fail":
                raise Boom(tag)
            else:  # "par": the async program's
                out.append(touch(tag))
        return out

    @durable.workflow(registry=reg, name="prog", budget=budget)
    def prog(program: list[Any], label: str) -> list[Any]:
        return run_program(program, label, True)

    @durable.workflow(registry=reg, name="fprog")
    def fprog(program: list[Any], label: str) -> list[Any]:
        return run_program(program, label, False)

    async def run_program_async(program: list[Any], label: str, budgeted: bool) -> list[Any]:
        out: list[Any] = []

        async def one(tag: str, ins: list[Any]) -> Any:
            if ins[0] == "pay":
                return await apay(tag, ins[1])
            if ins[0] == "llm":
                return await aask(tag, ins[1])
            return await amodel(tag, ins[1])

        for n, ins in enumerate(program):
            tag = f"{label}.{n}"
            op = ins[0]
            if op in ("pay", "model", "llm"):
                out.append(await one(tag, ins))
            elif op == "par":
                out.append(
                    await asyncio.gather(*(one(f"{tag}.{i}", p) for i, p in enumerate(ins[1])))
                )
            elif op == "child":
                how = ins[1]
                own = {"workflow_id": f"{durable.workflow_id()}-{tag}"} if how == "own" else {}
                fn = aprog if budgeted else faprog
                handle = await durable.start_child_async(fn, ins[2], tag, **own)
                out.append(await handle.result_async())
            elif op == "recv":
                out.append(await durable.recv_async("m", timeout=60))
            elif op == "sleep":
                await durable.sleep_async(ins[1])
                out.append("slept")
            elif op == "approve":
                if not (await durable.approval_async(f"gate-{n}")).approved:
                    raise Boom(f"{tag} denied")
                out.append("approved")
            elif op == "patch":
                if deployed and await durable.patched_async("extra"):
                    out.append(await apay(f"{tag}.new", 20))
                else:
                    out.append(await apay(f"{tag}.old", 30))
            elif op == "send":
                await durable.send_async("w0", f"{durable.workflow_id()}/{tag}", topic="m")
                out.append("sent")
            elif op == "fail":
                raise Boom(tag)
            else:
                out.append(tag)
        return out

    @durable.workflow(registry=reg, name="aprog", budget=budget)
    async def aprog(program: list[Any], label: str) -> list[Any]:
        return await run_program_async(program, label, True)

    @durable.workflow(registry=reg, name="faprog")
    async def faprog(program: list[Any], label: str) -> list[Any]:
        return await run_program_async(program, label, False)

    if deployed:
        # The deployed code also serves version "2" of both workflows: what
        # `resume(..., version="2")` moves a run to (old processes never claim it).

        @durable.workflow(registry=reg, name="prog", version="2", budget=budget)
        def prog_v2(program: list[Any], label: str) -> list[Any]:
            return run_program(program, label, True)

        @durable.workflow(registry=reg, name="aprog", version="2", budget=budget)
        async def aprog_v2(program: list[Any], label: str) -> list[Any]:
            return await run_program_async(program, label, True)

        @durable.workflow(registry=reg, name="fprog", version="2")
        def fprog_v2(program: list[Any], label: str) -> list[Any]:
            return run_program(program, label, False)

        @durable.workflow(registry=reg, name="faprog", version="2")
        async def faprog_v2(program: list[Any], label: str) -> list[Any]:
            return await run_program_async(program, label, False)

    return App(reg, prog, aprog, fprog, faprog, deployed)
