"""Methods as workflows and steps, on a real database: a workflow called on a
durable.Instance stores the instance's name (not the object) and runs on the instance
registered under it; classmethods and staticmethods work with the durable decorator above
or below them; steps, tools and transactions bind their receiver on any class; and each
misuse (an unregistered object, a name taken twice, an instance missing where the workflow
runs) is a typed error. The recovery in a fresh process is in
tests/acceptance/test_method_crash.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, text

import durable
from durable import errors


def stored_inputs(url: str, workflow_id: str | None = None) -> list[Any]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT inputs FROM durable.workflows"
            " WHERE %(w)s::text IS NULL OR workflow_id = %(w)s::text ORDER BY created_at",
            {"w": workflow_id},
        ).fetchall()
    return [json.loads(r[0]) for r in rows]


def make_accounts(reg: durable.Registry) -> tuple[type[Any], list[str]]:
    ran: list[str] = []

    class Account(durable.Instance):
        def __init__(self, name: str, rate: int) -> None:
            super().__init__(name, registry=reg)
            self.rate = rate

        @durable.step(registry=reg)
        def fee(self, cents: int) -> int:
            ran.append(f"{self.instance_name}:fee")
            return cents * self.rate

        @durable.workflow(registry=reg)
        def charge(self, cents: int) -> int:
            return self.fee(cents) + 1

        @durable.step(registry=reg)
        async def fee_async(self, cents: int) -> int:
            ran.append(f"{self.instance_name}:fee_async")
            return cents * self.rate

        @durable.workflow(registry=reg)
        async def charge_async(self, cents: int) -> int:
            # A plain-def step method and a plain-def child workflow method, in threads.
            extra = await durable.to_thread(self.fee, 0) + await durable.to_thread(self.charge, 0)
            return await self.fee_async(cents) + extra

    return Account, ran


def test_a_method_workflow_runs_on_its_instance_and_stores_its_name(database_url: str) -> None:
    reg = durable.Registry()
    Account, ran = make_accounts(reg)
    low, high = Account("low", 2), Account("high", 10)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        assert low.charge(5) == 11  # called directly: durably, in this thread
        assert engine.start(high.charge, 5, workflow_id="h").result(timeout=20) == 51
        # Recorded by a client (which holds no instance), run by the worker on "low".
        with durable.Client(database_url) as client:
            assert client.submit(low.charge, 7, workflow_id="l").result(timeout=20) == 15
            queue = durable.Queue("accounts", registry=reg)
            handle = client.enqueue(queue, high.charge, 1, workflow_id="q")
            assert handle.result(timeout=20) == 11
    assert ran == ["low:fee", "high:fee", "low:fee", "high:fee"]
    assert stored_inputs(database_url, "l") == [
        {"args": [7], "kwargs": {}, "receiver": {"class": Account.__qualname__, "instance": "low"}}
    ]
    receivers = [i["receiver"] for i in stored_inputs(database_url)]
    assert [r["instance"] for r in receivers] == ["low", "high", "low", "high"]
    assert {r["class"] for r in receivers} == {Account.__qualname__}


def test_one_id_cannot_name_a_method_on_two_instances(database_url: str) -> None:
    # The id's workflow is "charge on low": the same method on "high" under that id is
    # another call, whose result is not low's (DBOS refuses it too), whichever way it starts.
    reg = durable.Registry()
    Account, ran = make_accounts(reg)
    low, high = Account("low", 2), Account("high", 10)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        assert engine.start(low.charge, 5, workflow_id="acct").result(timeout=20) == 11
        with pytest.raises(errors.WorkflowConflictError, match="instance 'high'"):
            engine.start(high.charge, 5, workflow_id="acct")
        with pytest.raises(errors.WorkflowConflictError, match="instance 'low'"):
            engine.submit(high.charge, 5, workflow_id="acct")
        with durable.Client(database_url) as client:
            with pytest.raises(errors.WorkflowConflictError):
                client.submit(high.charge, 5, workflow_id="acct")
            queue = durable.Queue("accounts", registry=reg)
            with pytest.raises(errors.WorkflowConflictError):
                client.enqueue(queue, high.charge, 5, workflow_id="acct")
        # The same instance again attaches, as ids are idempotency keys.
        assert engine.start(low.charge, 5, workflow_id="acct").result(timeout=20) == 11
    assert ran == ["low:fee"]


def test_an_async_method_workflow_runs_on_its_instance(database_url: str) -> None:
    reg = durable.Registry()
    Account, ran = make_accounts(reg)
    low, high = Account("low", 2), Account("high", 10)

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            assert await low.charge_async(5) == 11
            handle = await engine.start_async(high.charge_async, 5, workflow_id="h")
            assert await handle.result(timeout=20) == 51

    asyncio.run(main())
    low_runs = ["low:fee", "low:fee", "low:fee_async"]
    assert ran == [*low_runs, "high:fee", "high:fee", "high:fee_async"]
    receivers = [i["receiver"]["instance"] for i in stored_inputs(database_url)]
    assert receivers == ["low", "low", "high", "high"]  # each with its child


def test_static_and_class_methods_work_with_the_decorator_above_or_below(
    database_url: str,
) -> None:
    reg = durable.Registry()

    class Tools:  # not a durable.Instance: nothing here needs an instance
        suffix = "t"

        @staticmethod
        @durable.step(registry=reg)
        def double(x: int) -> int:
            return 2 * x

        @durable.step(registry=reg)
        @staticmethod
        def triple(x: int) -> int:
            return 3 * x

        @classmethod
        @durable.workflow(registry=reg)
        def below(cls, x: int) -> str:
            return f"{cls.suffix}{cls.double(x) + cls.triple(x)}"

        @durable.workflow(registry=reg)
        @classmethod
        def above(cls, x: int) -> str:
            return f"{cls.suffix}{Tools.double(x)}"

        @staticmethod
        @durable.workflow(registry=reg)
        def plain(x: int) -> int:
            return Tools.triple(x)

        @durable.workflow(registry=reg)
        @staticmethod
        async def plain_async(x: int) -> int:
            return x + 1

        @classmethod
        @durable.workflow(registry=reg)
        async def below_async(cls, x: int) -> str:
            return f"{cls.suffix}{x}"

    class More(Tools):
        suffix = "m"

    with durable.Engine(database_url, registry=reg) as engine:
        assert Tools.below(1) == "t5"
        assert More.below(2) == "m10"  # the class it is called on, as cls
        assert engine.start(More.above, 3, workflow_id="a").result(timeout=20) == "m6"
        assert Tools().above(4) == "t8"
        assert Tools.plain(2) == 6
        assert Tools().plain(3) == 9
        assert engine.start(Tools.plain, 4, workflow_id="p").result(timeout=20) == 12

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            assert await Tools.plain_async(1) == 2
            assert await More.below_async(5) == "m5"
            handle = await engine.start_async(More.below_async, 6, workflow_id="ba")
            assert await handle.result(timeout=20) == "m6"

    asyncio.run(main())
    receivers = [i.get("receiver") for i in stored_inputs(database_url)]
    assert receivers == [
        {"class": Tools.__qualname__},
        {"class": More.__qualname__},
        {"class": More.__qualname__},
        {"class": Tools.__qualname__},
        None,
        None,
        None,
        None,
        {"class": More.__qualname__},
        {"class": More.__qualname__},
    ]


def test_steps_tools_and_transactions_bind_their_receiver_on_any_class(
    database_url: str,
) -> None:
    reg = durable.Registry()

    class Store:  # a plain class: steps store no inputs, so no name is needed
        def __init__(self, table: str) -> None:
            self.table = table

        @durable.transaction(registry=reg)
        def put(self, conn: Connection, key: str) -> int:
            conn.execute(text(f"INSERT INTO {self.table} (k) VALUES (:k)"), {"k": key})
            return int(conn.execute(text(f"SELECT count(*) FROM {self.table}")).scalar_one())

        @durable.tool(registry=reg)
        def lookup(self, key: str) -> str:
            return f"{self.table}:{key}"

    store = Store("kv")

    @durable.workflow(registry=reg)
    def fill(keys: list[str]) -> list[Any]:
        return [[store.put(k), store.lookup(k)] for k in keys]

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (k text PRIMARY KEY)")
    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(fill, ["a", "b"], workflow_id="f")
        assert handle.result(timeout=20) == [[1, "kv:a"], [2, "kv:b"]]
        # A tool records the call's arguments, not the object it was called on.
        assert [c["arguments"] for c in engine.client.tool_calls("f")] == [
            {"args": ["a"], "kwargs": {}},
            {"args": ["b"], "kwargs": {}},
        ]
        assert store.put("c") == 3  # outside a workflow: a plain call in a transaction


def test_two_instances_of_a_class_cannot_share_a_name() -> None:
    reg = durable.Registry()
    Account, _ran = make_accounts(reg)
    first = Account("same", 1)
    with pytest.raises(errors.DuplicateNameError, match="instance_name") as caught:
        Account("same", 2)
    assert caught.value.name == "same"
    Account.__init__(first, "same", 1)  # the same object again is not a second instance

    class Other(durable.Instance):
        pass

    Other("same", registry=reg)  # another class may use the name
    with pytest.raises(errors.DefinitionError, match="instance_name"):
        Other("", registry=reg)


def test_a_method_workflow_on_an_unregistered_object_fails_before_anything_is_stored(
    database_url: str,
) -> None:
    reg = durable.Registry()

    class Plain:
        @durable.workflow(registry=reg)
        def run(self, x: int) -> int:
            return x

    class Forgetful(durable.Instance):
        def __init__(self) -> None:  # never calls super().__init__(name)
            self.x = 1

        @durable.workflow(registry=reg)
        def run(self, x: int) -> int:
            return x

    with durable.Engine(database_url, registry=reg) as engine:
        for obj in (Plain(), Forgetful()):
            with pytest.raises(errors.UnknownInstanceError, match=r"durable\.Instance"):
                obj.run(1)
            with pytest.raises(errors.UnknownInstanceError, match="super"):
                engine.start(obj.run, 1)
    assert stored_inputs(database_url) == []


def test_an_instance_missing_where_the_workflow_runs_is_left_for_a_worker_that_has_it(
    database_url: str,
) -> None:
    reg, elsewhere = durable.Registry(), durable.Registry()
    Account, ran = make_accounts(reg)

    class Remote(Account):  # type: ignore[valid-type, misc]
        def __init__(self, name: str) -> None:
            durable.Instance.__init__(self, name, registry=elsewhere)
            self.rate = 1

    ghost = Remote("ghost")
    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.05, lease_seconds=1
    ):
        # Called here, it would run in this engine, whose registry has no "ghost":
        # refused before anything is stored.
        with pytest.raises(errors.UnknownInstanceError, match="ghost") as caught:
            ghost.charge(1)
        assert (caught.value.class_name, caught.value.name) == (Remote.__qualname__, "ghost")
        assert stored_inputs(database_url) == []
        # Recorded by a client, it is claimed by a worker that lacks the instance: not
        # failed, left (its lease runs out) for a worker that has it.
        with durable.Client(database_url) as client:
            handle = client.submit(ghost.charge, 1, workflow_id="g")
            deadline = time.monotonic() + 10
            while client.get_workflow("g").status != "RUNNING" and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)  # claimed, and its lease run out, at least once
            assert client.get_workflow("g").status == "RUNNING"
    assert ran == []
    # A worker that has the instance (created under the same class and name) runs it.
    here = Remote.__new__(Remote)
    durable.Instance.__init__(here, "ghost", registry=reg)
    here.rate = 1
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        assert isinstance(engine.retrieve(handle.workflow_id).result(timeout=30), int)
    assert ran == ["ghost:fee"]


def test_an_effect_method_is_refused_and_a_static_effect_is_a_plain_function(
    database_url: str,
) -> None:
    reg = durable.Registry()
    refunded: list[str] = []

    class Payments:
        @durable.effect(registry=reg, idempotent=True)
        def charge(self, cents: int, *, idempotency_key: str) -> int:
            return cents

        @staticmethod
        @durable.effect(registry=reg, idempotent=True)
        def refund(cents: int, *, idempotency_key: str) -> int:
            refunded.append(idempotency_key)
            return -cents

    payments = Payments()

    @durable.workflow(registry=reg)
    def settle(cents: int) -> int:
        return Payments.refund(cents)

    @durable.workflow(registry=reg)
    def pay(cents: int) -> int:
        return payments.charge(cents)

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(settle, 5, workflow_id="s").result(timeout=20) == -5
        # An effect's key, reconcile and compensation see only its arguments.
        with pytest.raises(errors.WorkflowFailedError, match="module-level function"):
            engine.start(pay, 5, workflow_id="p").result(timeout=20)
    assert len(refunded) == 1


def test_a_debouncer_of_a_method_workflow_runs_it_on_its_instance(database_url: str) -> None:
    reg = durable.Registry()
    Account, ran = make_accounts(reg)
    low = Account("low", 2)
    debouncer = durable.Debouncer(low.charge, period=60, registry=reg)
    clock = durable.FakeClock(dt.datetime(2026, 2, 1, 12, 0, tzinfo=dt.UTC))
    with durable.Client(database_url, clock=clock) as client:
        handle = client.debounce(debouncer, "k", 5)
        client.debounce(debouncer, "k", 7)  # replaces the input
    assert stored_inputs(database_url) == [
        {"args": [7], "kwargs": {}, "receiver": {"class": Account.__qualname__, "instance": "low"}}
    ]
    clock.advance(120)
    with durable.Engine(database_url, registry=reg, clock=clock, worker=True) as engine:
        assert engine.retrieve(handle.workflow_id).result(timeout=30) == 15
    assert ran == ["low:fee"]


def test_debouncers_of_one_method_on_two_instances_keep_their_keys_apart(
    database_url: str,
) -> None:
    reg = durable.Registry()
    Account, ran = make_accounts(reg)
    alice, bob = Account("alice", 2), Account("bob", 3)
    clock = durable.FakeClock(dt.datetime(2026, 2, 1, 12, 0, tzinfo=dt.UTC))
    with durable.Client(database_url, clock=clock) as client:
        for_alice = durable.Debouncer(alice.charge, period=60, registry=reg)
        for_bob = durable.Debouncer(bob.charge, period=60, registry=reg)
        a = client.debounce(for_alice, "nightly", 5)
        b = client.debounce(for_bob, "nightly", 7)  # the same key, another instance
    assert a.workflow_id != b.workflow_id
    clock.advance(120)
    with durable.Engine(database_url, registry=reg, clock=clock, worker=True) as engine:
        engine.retrieve(a.workflow_id).result(timeout=30)
        engine.retrieve(b.workflow_id).result(timeout=30)
    assert sorted(ran) == ["alice:fee", "bob:fee"]
