"""The effect ledger under SIGKILL at each edge of the write-ahead sequence.

The vendor's own table records every payment that really moved; each cell checks that
every refund moved exactly once. One real kill per state the ledger writes (intent,
pending, applied), with reconciliation against a vendor that does not deduplicate keys; the
whole matrix (the kill after the vendor's call, a vendor that deduplicates, both drivers)
dies in one process: tests/integration/test_crash_inprocess.py."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import psycopg
import pytest

import durable
from durable import errors
from tests.acceptance.workers import client, start_worker, stop_worker, wait_for
from tests.apps import counter_app, vendor

AMOUNTS = [10, 25, 40, 5]
POINTS = ["effect_after_intent", "effect_after_pending", "effect_after_applied"]


def ledger(url: str) -> list[tuple[str, str, bool]]:
    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1], r[2])
            for r in conn.execute(
                "SELECT idempotency_key, status, reconciled FROM durable.effects ORDER BY step_seq"
            )
        ]


@pytest.mark.parametrize("driver", ["sync"])
@pytest.mark.parametrize("mode", ["reconcile"])
@pytest.mark.parametrize("point", POINTS)
def test_refunds_move_exactly_once(
    database_url: str, subprocess_env: dict[str, str], mode: str, point: str, driver: str
) -> None:
    with client(database_url) as engine:
        pay = counter_app.pick(counter_app.pay, driver)
        handle = engine.submit(pay, mode, AMOUNTS, workflow_id="run-4711")
        # Die at the third refund (40), at this edge of the write-ahead sequence.
        first = start_worker(subprocess_env, database_url, crash=f"{point}:3")
        assert first.wait(timeout=60) == -signal.SIGKILL
        second = start_worker(subprocess_env, database_url)
        try:
            assert handle.result(timeout=60) == 80
        finally:
            stop_worker(second)
    assert vendor.moved(database_url) == AMOUNTS  # [10, 25, 40, 5]: nothing twice
    rows = ledger(database_url)
    assert [k for k, _, _ in rows] == [f"run-4711:{i}" for i in range(4)]
    assert all(status == "applied" for _, status, _ in rows)
    # Only a crash after the vendor took the money, with a reconcile function, adopts the
    # vendor's receipt instead of calling again.
    reconciled = [k for k, _, r in rows if r]
    assert reconciled == (
        ["run-4711:2"] if (mode, point) == ("reconcile", "effect_after_call") else []
    )


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_bad_effect_declarations_and_key_reuse(database_url: str, driver: str) -> None:
    reg = durable.Registry()
    with pytest.raises(errors.DefinitionError, match="idempotent=True"):

        @durable.effect(registry=reg)
        def neither(*, idempotency_key: str) -> None: ...

    with pytest.raises(errors.DefinitionError, match="idempotency_key"):

        @durable.effect(registry=reg, idempotent=True)
        def no_key_param(x: int) -> None: ...

    calls: list[tuple[str, int]] = []

    charge: Any
    charges: Any
    if driver == "sync":

        @durable.effect(
            registry=reg, name="charge", idempotent=True, key=lambda order, cents: order
        )
        def charge(order: str, cents: int, *, idempotency_key: str) -> int:
            calls.append((idempotency_key, cents))
            return cents

        @durable.workflow(registry=reg, name="charges")
        def charges(second: int) -> int:
            return charge("order-8812", 40) + charge("order-8812", second)

    else:

        @durable.effect(
            registry=reg, name="charge", idempotent=True, key=lambda order, cents: order
        )
        async def charge(order: str, cents: int, *, idempotency_key: str) -> int:
            calls.append((idempotency_key, cents))
            return cents

        @durable.workflow(registry=reg, name="charges")
        async def charges(second: int) -> int:
            return await charge("order-8812", 40) + await charge("order-8812", second)

    with durable.Engine(database_url, registry=reg) as engine:
        # The same key with the same parameters is the same action: called once.
        assert engine.start(charges, 40, workflow_id="k1").result(timeout=10) == 80
        assert calls == [("k1:order-8812", 40)]
        # The same key with other parameters is refused before anything is called.
        with pytest.raises(errors.WorkflowFailedError) as info:
            engine.start(charges, 99, workflow_id="k2").result(timeout=10)
        assert info.value.error_type == "durable.errors.IdempotencyKeyReusedError"
        assert calls == [("k1:order-8812", 40), ("k2:order-8812", 40)]
    outside = charge if driver == "sync" else lambda *a, **k: asyncio.run(charge(*a, **k))
    with pytest.raises(errors.EffectOutsideWorkflowError, match="idempotency_key"):
        outside("order-1", 5)
    assert outside("order-1", 5, idempotency_key="manual-1") == 5


# Without a crash, and with the async def twin: tests/integration/test_crash_inprocess.py.
@pytest.mark.parametrize("driver", ["sync"])
@pytest.mark.parametrize("crash", ["effect_after_call:3"])
def test_saga_compensates_each_applied_effect_once(
    database_url: str, subprocess_env: dict[str, str], crash: str | None, driver: str
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(counter_app.pick(counter_app.trip, driver), workflow_id="trip-1")
        if crash:
            # Dies right after the vendor undid the hotel, before that undo was recorded.
            first = start_worker(subprocess_env, database_url, crash=crash)
            assert first.wait(timeout=60) == -signal.SIGKILL
            assert vendor.moved(database_url) == [10, 25, -25]
        worker = start_worker(subprocess_env, database_url)
        try:
            with pytest.raises(errors.WorkflowFailedError, match="card declined"):
                handle.result(timeout=60)
        finally:
            stop_worker(worker)
        assert handle.status() == "COMPENSATED"
    # Booked flight and hotel; the card failed; hotel then flight undone, each exactly once.
    assert vendor.moved(database_url) == [10, 25, -25, -10]
    assert [s for _, s, _ in ledger(database_url)] == [
        "applied",
        "applied",
        "failed",
        "applied",
        "applied",
    ]


def test_workflows_show_lists_the_effect_ledger(database_url: str) -> None:
    import json
    import subprocess
    import sys

    reg = durable.Registry()

    @durable.effect(registry=reg, name="send", idempotent=True)
    def send(to: str, *, idempotency_key: str) -> str:
        return f"sent:{to}"

    @durable.workflow(registry=reg, name="mailer")
    def mailer() -> str:
        return send("ann")

    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(mailer, workflow_id="m1").result(timeout=10)
    base = [sys.executable, "-m", "durable.cli", "workflows", "show", "m1"]
    out = subprocess.run(
        [*base, "--database-url", database_url, "--json"], capture_output=True, text=True
    )
    (effect,) = json.loads(out.stdout)["effects"]
    assert (effect["idempotency_key"], effect["status"]) == ("m1:0", "applied")
    assert effect["result"] == "sent:ann" and len(effect["params_fingerprint"]) == 64
    table = subprocess.run([*base, "--database-url", database_url], capture_output=True, text=True)
    assert "m1:0" in table.stdout and "applied" in table.stdout


def test_a_fork_and_its_original_undo_their_shared_bookings_once_across_a_crash(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    """The original is forked while it waits after its two bookings. It fails, and its
    worker dies right after the vendor undid the hotel, before that undo was recorded;
    the fork fails too. A fresh worker finishes both sagas: each booking is undone once
    (the undo interrupted by the crash is sent again with its own key, which the vendor
    deduplicates, by the workflow that claimed it)."""
    with client(database_url) as engine:
        handle = engine.submit(counter_app.booked_trip, workflow_id="t")
        worker = start_worker(subprocess_env, database_url)
        try:
            wait_for(lambda: handle.status() == "SUSPENDED", what="t to wait")
            fork = engine.client.fork("t", from_step=2, new_id="f")  # run by the worker
            wait_for(lambda: fork.status() == "SUSPENDED", what="f to wait")
        finally:
            stop_worker(worker)
        assert vendor.moved(database_url) == [10, 25]
        engine.send("t", "fail", topic="verdict")
        first = start_worker(subprocess_env, database_url, crash="effect_after_call:1")
        assert first.wait(timeout=60) == -signal.SIGKILL
        assert vendor.moved(database_url) == [10, 25, -25]
        engine.send("f", "fail", topic="verdict")
        second = start_worker(subprocess_env, database_url)
        try:
            for h in (handle, fork):
                with pytest.raises(errors.WorkflowFailedError, match="no visa"):
                    h.result(timeout=60)
                assert h.status() == "COMPENSATED"
        finally:
            stop_worker(second)
    assert sorted(vendor.moved(database_url)) == [-25, -10, 10, 25]
