"""One workload for every protocol generator, written twice: with plain `def` (run by the
sync driver, durable/_run/driver.py) and with `async def` (run by the async driver,
durable/_run/driver_async.py). Both versions register the same names, in registries of their
own, so that the journal, the ledgers and the application rows of one run can be compared
row for row with the other's (tests/integration/test_conformance.py).

Every workflow touches one part of the protocol: steps (a retry, an error caught),
`@transaction` (a commit, a rollback), effects (reconciled, idempotent, a saga that
compensates), children (started, called inline, failing), messages and events, waits
(sleep, recv, wait_first, an approval), streams, budgets, patches and the conversation
state.
"""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy import text

import durable
from durable._run.decorators import workflow_def
from durable.errors import DefinitionError

# The tests' own reads, at READ COMMITTED whatever the default (under
# DURABLE_TEST_ISOLATION=serializable even a read can be refused with 40001).
READ_COMMITTED = "-c default_transaction_isolation=read\\ committed"

APP_DDL = """
CREATE TABLE IF NOT EXISTS conf_rows (id bigserial PRIMARY KEY, tag text, n int);
CREATE TABLE IF NOT EXISTS conf_vendor (idempotency_key text PRIMARY KEY, cents int);
"""

# workflow name -> (args, expected outcome): a value, or ("error", type name).
WORKLOAD: dict[str, tuple[list[Any], Any]] = {
    "conf.steps": ([], ["A", "B-2", "caught: boom"]),
    "conf.transactions": ([], [2, "rolled back: no"]),
    "conf.effects": ([], [10, 25]),
    "conf.saga": ([], ("error", "ValueError")),
    "conf.children": ([], ["conf.children:child:0", 3, "child failed"]),
    "conf.messages": ([], ["m1", "m2", None, "e"]),
    "conf.waits": ([], [[0, "w"], [1, None], False, True]),
    "conf.streams": ([], 3),
    "conf.budget": ([], 10),
    "conf.patches": ([], [True, 2]),
    "conf.bad_sleep": ([], ("error", "InvalidWaitError")),
}

# The children of conf.children (started, then called inline twice) and their outcomes.
CHILDREN: dict[str, Any] = {
    "conf.children:child:0": 2,
    "conf.children:child:1": 3,
    "conf.children:child:2": ("error", "ValueError"),
}


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(APP_DDL)


def build(asynchronous: bool, url: str) -> tuple[durable.Registry, dict[str, Any]]:
    """The workload's registry for one driver and its workflows by name (`url`: the
    vendor's table lives there)."""
    return _build_async(url) if asynchronous else _build_sync(url)


def _workflows(scope: dict[str, Any]) -> dict[str, Any]:
    """The decorated workflows among a builder's locals, by their registered names."""
    found = {}
    for value in scope.values():
        try:
            found[workflow_def(value).name] = value
        except DefinitionError:
            continue
    return found


def _vendor(url: str, key: str, cents: int) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO conf_vendor VALUES (%s, %s) ON CONFLICT DO NOTHING", [key, cents])
    return cents


def _lookup(url: str, key: str) -> int | None:
    with psycopg.connect(url, options=READ_COMMITTED) as conn:
        row = conn.execute("SELECT cents FROM conf_vendor WHERE idempotency_key = %s", [key])
        found = row.fetchone()
    return None if found is None else int(found[0])


def _build_sync(url: str) -> tuple[durable.Registry, dict[str, Any]]:
    reg = durable.Registry()
    tries: dict[str, int] = {}

    @durable.step(registry=reg, name="conf.ok")
    def ok(x: str) -> str:
        return x

    @durable.step(registry=reg, name="conf.flaky", retries=2, initial_delay=0.01)
    def flaky(x: str) -> str:
        tries[x] = tries.get(x, 0) + 1
        if tries[x] < 2:
            raise ConnectionError("once")
        return f"{x}-{tries[x]}"

    @durable.step(registry=reg, name="conf.boom")
    def boom() -> None:
        raise ValueError("boom")

    @durable.workflow(registry=reg, name="conf.steps")
    def steps() -> list[str]:
        out = [ok("A"), flaky("B")]
        try:
            boom()
        except ValueError as exc:
            out.append(f"caught: {exc}")
        return out

    @durable.transaction(registry=reg, name="conf.insert")
    def insert(conn: Any, tag: str, n: int) -> int:
        conn.execute(text("INSERT INTO conf_rows (tag, n) VALUES (:t, :n)"), {"t": tag, "n": n})
        if n < 0:
            raise ValueError("no")
        return n

    @durable.workflow(registry=reg, name="conf.transactions")
    def transactions() -> list[object]:
        out: list[object] = [insert("t", 2)]
        try:
            insert("t", -1)
        except ValueError as exc:
            out.append(f"rolled back: {exc}")
        return out

    @durable.effect(registry=reg, name="conf.pay", reconcile=lambda k, c: _lookup(url, k))
    def pay(cents: int, *, idempotency_key: str) -> int:
        return _vendor(url, idempotency_key, cents)

    @durable.effect(registry=reg, name="conf.book", idempotent=True)
    def book(cents: int, *, idempotency_key: str) -> int:
        return _vendor(url, idempotency_key, cents)

    @durable.effect(registry=reg, name="conf.unbook", idempotent=True)
    def unbook(cents: int, *, idempotency_key: str) -> int:
        return _vendor(url, idempotency_key, -cents)

    book.compensation(unbook)  # type: ignore[attr-defined]

    @durable.effect(registry=reg, name="conf.decline", idempotent=True)
    def decline(cents: int, *, idempotency_key: str) -> None:
        raise ValueError("declined")

    @durable.workflow(registry=reg, name="conf.effects")
    def effects() -> list[int]:
        return [pay(10), book(25)]

    @durable.workflow(registry=reg, name="conf.saga")
    def saga() -> None:
        book(7)
        decline(3)

    @durable.workflow(registry=reg, name="conf.kid")
    def kid(n: int) -> int:
        if n < 0:
            raise ValueError("child failed")
        ok(str(n))
        return n

    @durable.workflow(registry=reg, name="conf.children")
    def children() -> list[object]:
        # Not waited for here: whether the child is done by then is a race, not the driver.
        out: list[object] = [durable.start_child(kid, 2).workflow_id, kid(3)]
        try:
            kid(-1)
        except ValueError as exc:  # an inline child's error is raised as itself
            out.append(str(exc))
        return out

    @durable.workflow(registry=reg, name="conf.messages")
    def messages() -> list[object]:
        me = durable.workflow_id()
        durable.send(me, "m1", topic="t")
        durable.send(me, "m2", topic="t")
        got = [durable.recv("t", timeout=5), durable.recv("t", timeout=5)]
        got.append(durable.recv("t", timeout=0))
        durable.set_event("k", "e")
        got.append(durable.get_event(me, "k"))
        return got

    @durable.workflow(registry=reg, name="conf.waits")
    def waits() -> list[object]:
        durable.send(durable.workflow_id(), "w", topic="t")
        first = durable.wait_first([durable.on_message("t"), durable.on_timer(3600)])
        second = durable.wait_first([durable.on_message("t"), durable.on_timer(0)])
        durable.sleep(0)
        decision = durable.approval("gate", timeout=0, default=False)
        return [
            [first.index, first.value],
            [second.index, second.value],
            decision.approved,
            decision.timed_out,
        ]

    @durable.workflow(registry=reg, name="conf.streams")
    def streams() -> int:
        for i in range(3):
            durable.write_stream("s", i)
        durable.close_stream("s")
        return 3

    @durable.step(registry=reg, name="conf.spend")
    def spend(i: int) -> int:
        durable.charge(dollars=0.4, tokens=10)
        return i

    @durable.workflow(registry=reg, name="conf.budget", budget=durable.Budget(dollars=5.0))
    def budget() -> int:
        return sum(spend(i) for i in range(5))

    @durable.workflow(registry=reg, name="conf.patches")
    def patches() -> list[object]:
        durable.append_turn("user", "hi")
        durable.append_turn("assistant", "hello")
        return [durable.patched("p1"), len(durable.conversation())]

    @durable.workflow(registry=reg, name="conf.bad_sleep")
    def bad_sleep() -> None:
        durable.sleep(-1)

    return reg, _workflows(locals())


def _build_async(url: str) -> tuple[durable.Registry, dict[str, Any]]:
    reg = durable.Registry()
    tries: dict[str, int] = {}

    @durable.step(registry=reg, name="conf.ok")
    async def ok(x: str) -> str:
        return x

    @durable.step(registry=reg, name="conf.flaky", retries=2, initial_delay=0.01)
    async def flaky(x: str) -> str:
        tries[x] = tries.get(x, 0) + 1
        if tries[x] < 2:
            raise ConnectionError("once")
        return f"{x}-{tries[x]}"

    @durable.step(registry=reg, name="conf.boom")
    async def boom() -> None:
        raise ValueError("boom")

    @durable.workflow(registry=reg, name="conf.steps")
    async def steps() -> list[str]:
        out = [await ok("A"), await flaky("B")]
        try:
            await boom()
        except ValueError as exc:
            out.append(f"caught: {exc}")
        return out

    @durable.transaction(registry=reg, name="conf.insert")
    async def insert(conn: Any, tag: str, n: int) -> int:
        await conn.execute(
            text("INSERT INTO conf_rows (tag, n) VALUES (:t, :n)"), {"t": tag, "n": n}
        )
        if n < 0:
            raise ValueError("no")
        return n

    @durable.workflow(registry=reg, name="conf.transactions")
    async def transactions() -> list[object]:
        out: list[object] = [await insert("t", 2)]
        try:
            await insert("t", -1)
        except ValueError as exc:
            out.append(f"rolled back: {exc}")
        return out

    @durable.effect(registry=reg, name="conf.pay", reconcile=lambda k, c: _lookup(url, k))
    async def pay(cents: int, *, idempotency_key: str) -> int:
        return _vendor(url, idempotency_key, cents)

    @durable.effect(registry=reg, name="conf.book", idempotent=True)
    async def book(cents: int, *, idempotency_key: str) -> int:
        return _vendor(url, idempotency_key, cents)

    @durable.effect(registry=reg, name="conf.unbook", idempotent=True)
    async def unbook(cents: int, *, idempotency_key: str) -> int:
        return _vendor(url, idempotency_key, -cents)

    book.compensation(unbook)  # type: ignore[attr-defined]

    @durable.effect(registry=reg, name="conf.decline", idempotent=True)
    async def decline(cents: int, *, idempotency_key: str) -> None:
        raise ValueError("declined")

    @durable.workflow(registry=reg, name="conf.effects")
    async def effects() -> list[int]:
        return [await pay(10), await book(25)]

    @durable.workflow(registry=reg, name="conf.saga")
    async def saga() -> None:
        await book(7)
        await decline(3)

    @durable.workflow(registry=reg, name="conf.kid")
    async def kid(n: int) -> int:
        if n < 0:
            raise ValueError("child failed")
        await ok(str(n))
        return n

    @durable.workflow(registry=reg, name="conf.children")
    async def children() -> list[object]:
        started = await durable.start_child_async(kid, 2)
        out: list[object] = [started.workflow_id, await kid(3)]
        try:
            await kid(-1)
        except ValueError as exc:  # an inline child's error is raised as itself
            out.append(str(exc))
        return out

    @durable.workflow(registry=reg, name="conf.messages")
    async def messages() -> list[object]:
        me = durable.workflow_id()
        await durable.send_async(me, "m1", topic="t")
        await durable.send_async(me, "m2", topic="t")
        got = [await durable.recv_async("t", timeout=5), await durable.recv_async("t", timeout=5)]
        got.append(await durable.recv_async("t", timeout=0))
        await durable.set_event_async("k", "e")
        got.append(await durable.get_event_async(me, "k"))
        return got

    @durable.workflow(registry=reg, name="conf.waits")
    async def waits() -> list[object]:
        await durable.send_async(durable.workflow_id(), "w", topic="t")
        first = await durable.wait_first_async([durable.on_message("t"), durable.on_timer(3600)])
        second = await durable.wait_first_async([durable.on_message("t"), durable.on_timer(0)])
        await durable.sleep_async(0)
        decision = await durable.approval_async("gate", timeout=0, default=False)
        return [
            [first.index, first.value],
            [second.index, second.value],
            decision.approved,
            decision.timed_out,
        ]

    @durable.workflow(registry=reg, name="conf.streams")
    async def streams() -> int:
        for i in range(3):
            await durable.write_stream_async("s", i)
        await durable.close_stream_async("s")
        return 3

    @durable.step(registry=reg, name="conf.spend")
    async def spend(i: int) -> int:
        durable.charge(dollars=0.4, tokens=10)
        return i

    @durable.workflow(registry=reg, name="conf.budget", budget=durable.Budget(dollars=5.0))
    async def budget() -> int:
        return sum([await spend(i) for i in range(5)])

    @durable.workflow(registry=reg, name="conf.patches")
    async def patches() -> list[object]:
        await durable.append_turn_async("user", "hi")
        await durable.append_turn_async("assistant", "hello")
        return [await durable.patched_async("p1"), len(durable.conversation())]

    @durable.workflow(registry=reg, name="conf.bad_sleep")
    async def bad_sleep() -> None:
        await durable.sleep_async(-1)

    return reg, _workflows(locals())
