"""An app for the fault tests (tests/acceptance/test_faults.py), run by `durable worker`.

Run it as `durable worker --app tests.apps.faults_app:engine`: the engine below gives up a
workflow after two recoveries, so a run that keeps dying ends within seconds. Every step
call is recorded in the `world` table (tests/apps/counter_app.py) and every payment in the
fake vendor's tables (tests/apps/vendor.py), outside durable, so tests count what happened.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

import durable
from tests.apps import counter_app, vendor
from tests.apps.counter_app import World

registry = durable.Registry()

MAX_RECOVERY_ATTEMPTS = 2

# The URL comes from DURABLE_DATABASE_URL when `durable worker` launches it.
engine = durable.Engine(
    registry=registry,
    max_recovery_attempts=MAX_RECOVERY_ATTEMPTS,
    lease_seconds=1.0,
    poll_interval=0.1,
    max_workers=4,
)


def setup(url: str) -> None:
    counter_app.setup(url)  # the world table and the vendor's tables


def attempts(url: str, workflow_id: str, what: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM world WHERE workflow_id = %s AND what = %s", [workflow_id, what]
        ).fetchone()
    assert row is not None
    return int(row[0])


# -- an effect that asks the vendor after a crash, and its undo ---------------------------------


def lookup_charge(idempotency_key: str, order_id: str, cents: int) -> dict[str, Any] | None:
    return vendor.lookup(idempotency_key)


# The vendor does NOT deduplicate keys: only reconciliation keeps a resume from paying twice.
@durable.effect(registry=registry, name="faults.charge", reconcile=lookup_charge)
def charge(order_id: str, cents: int, *, idempotency_key: str) -> dict[str, Any]:
    return vendor.refund(order_id, cents, idempotency_key, dedup=False)


@durable.effect(registry=registry, name="faults.refund", idempotent=True)
def refund(order_id: str, cents: int, *, idempotency_key: str) -> dict[str, Any]:
    return vendor.refund(order_id, -cents, idempotency_key, dedup=True)


charge.compensation(refund)  # type: ignore[attr-defined]


@durable.step(registry=registry, name="faults.note")
def note(workflow_id: str, what: str) -> str:
    World.record(workflow_id, what)
    return what


def _order(workflow_id: str, cents: int) -> str:
    note(workflow_id, "before")
    charge(workflow_id, cents)
    note(workflow_id, "after")
    return "charged"


@durable.workflow(registry=registry, name="faults.order")
def order(workflow_id: str, /, cents: int) -> str:
    return _order(workflow_id, cents)


@durable.workflow(registry=registry, name="faults.charge_first")
def charge_first(workflow_id: str, /, cents: int) -> str:
    """The charge is the workflow's first call: nothing is journaled before it."""
    charge(workflow_id, cents)
    note(workflow_id, "after")
    return "charged"


ORDER_TIMEOUT = 3.0


@durable.workflow(registry=registry, name="faults.order_in_time", timeout=ORDER_TIMEOUT)
def order_in_time(workflow_id: str, /, cents: int) -> str:
    return _order(workflow_id, cents)


# -- an exception that cannot be printed ---------------------------------------------------------


class Unprintable(Exception):
    """Neither str() nor repr() of it works."""

    def __str__(self) -> str:
        raise RuntimeError("this error cannot be printed")

    def __repr__(self) -> str:
        raise RuntimeError("this error cannot be shown either")


@durable.step(registry=registry, name="faults.unprintable_step")
def unprintable_step(workflow_id: str) -> None:
    World.record(workflow_id, "unprintable")
    raise Unprintable("hidden")


@durable.workflow(registry=registry, name="faults.unprintable")
def unprintable(workflow_id: str, /) -> str:
    unprintable_step(workflow_id)
    return "unreachable"


# -- SystemExit / KeyboardInterrupt out of a step ------------------------------------------------

EXITS: dict[str, type[BaseException]] = {
    "SystemExit": SystemExit,
    "KeyboardInterrupt": KeyboardInterrupt,
}


@durable.step(registry=registry, name="faults.exit_step")
def exit_step(workflow_id: str, kind: str, fail_times: int) -> int:
    """Raises `kind` on its first `fail_times` calls (counted in the world), then returns."""
    url = World.url or os.environ["DURABLE_DATABASE_URL"]
    done = attempts(url, workflow_id, "exit-step")
    World.record(workflow_id, "exit-step")
    if done < fail_times:
        raise EXITS[kind]()
    return done + 1


@durable.workflow(registry=registry, name="faults.exiting")
def exiting(workflow_id: str, /, kind: str, fail_times: int) -> int:
    n = exit_step(workflow_id, kind, fail_times)
    note(workflow_id, "after-exit")
    return n
