"""The workflows whose journals are kept as fixtures (tests/fixtures/journals/*.json), and
what each fixture is: tests/fixtures/make_journals.py runs them with the code of the day
and exports them; tests/integration/test_journal_fixtures.py imports each into a fresh
database and replays it against the code in the tree.

So this module is a contract with journals already written: a step, effect, workflow or
gate name here, the order of the calls, the values returned, and the journal format of
durable itself must not change without new fixtures. That is the point: the replay test
fails when they do (a renamed step meets NondeterminismError, a changed label or row
layout does too), as an upgrade would fail on users' stored journals.

Every body that does work appends to WORLD (`<what>:<argument>`), so a test can tell a
call that ran from one that replayed from its journal. Names are given explicitly, never
derived from the module path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import Connection, text

import durable

registry = durable.Registry()
WORLD: list[str] = []

LEDGER_DDL = "CREATE TABLE IF NOT EXISTS journals_ledger (id bigserial PRIMARY KEY, who text)"


def setup(url: str) -> None:
    """The application's table the @transaction step writes (in the system database)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)


# -- steps, effects and compensations ---------------------------------------------------------


@durable.step(registry=registry, name="journals.fetch")
def fetch(i: int) -> dict[str, Any]:
    WORLD.append(f"fetch:{i}")
    return {"i": i, "square": i * i, "tags": ["a", str(i)]}


@durable.step(registry=registry, name="journals.total")
def total(values: list[int]) -> int:
    WORLD.append(f"total:{len(values)}")
    return sum(values)


@durable.step(registry=registry, name="journals.broken")
def broken(why: str) -> None:
    WORLD.append(f"broken:{why}")
    raise ValueError(why)


@durable.step(registry=registry, name="journals.think")
def think(tokens: int) -> str:
    WORLD.append(f"think:{tokens}")
    durable.charge(dollars=0.25, tokens=tokens)
    return f"thought {tokens}"


@durable.transaction(registry=registry, name="journals.record")
def record(conn: Connection, who: str) -> str:
    WORLD.append(f"record:{who}")
    conn.execute(text("INSERT INTO journals_ledger (who) VALUES (:w)"), {"w": who})
    return who.upper()


@durable.effect(idempotent=True, registry=registry, name="journals.book")
def book(item: str, *, idempotency_key: str) -> dict[str, str]:
    WORLD.append(f"book:{item}")
    return {"booking": f"B-{item}"}


@book.compensation  # type: ignore[attr-defined]
@durable.effect(idempotent=True, registry=registry, name="journals.unbook")
def unbook(item: str, *, idempotency_key: str) -> None:
    WORLD.append(f"unbook:{item}")


@durable.step(registry=registry, name="journals.square")
async def square(i: int) -> int:
    WORLD.append(f"square:{i}")
    await asyncio.sleep(0.01 * (3 - i % 3))  # finish out of order
    return i * i


# -- workflows ------------------------------------------------------------------------------


@durable.workflow(registry=registry, name="journals.steps")
def steps_wf(n: int) -> dict[str, Any]:
    rows = [fetch(i) for i in range(n)]
    return {"rows": rows, "total": total([r["square"] for r in rows])}


@durable.workflow(registry=registry, name="journals.patched")
def patched_wf() -> list[Any]:
    """A run that took a patch: its journal holds the patch's marker."""
    first = fetch(1)
    second = fetch(2) if durable.patched("journals.fix") else fetch(3)
    return [first["square"], second["square"]]


@durable.workflow(registry=registry, name="journals.transaction")
def transaction_wf(who: str) -> list[str]:
    return [record(who), record(who + "-2"), str(fetch(7)["square"])]


@durable.workflow(registry=registry, name="journals.saga")
def saga_wf(fail: bool) -> dict[str, Any]:
    hotel = book("hotel")
    car = book("car")
    if fail:
        broken("no seats")
    return {"hotel": hotel, "car": car}


@durable.workflow(registry=registry, name="journals.broken")
def broken_wf() -> None:
    fetch(1)
    broken("the vendor said no")


@durable.workflow(registry=registry, name="journals.approval")
def approval_wf(total_due: int) -> dict[str, Any]:
    first = fetch(1)
    decision = durable.approval("ship", {"total": total_due})
    after = fetch(2)
    return {
        "first": first["i"],
        "approved": decision.approved,
        "comment": decision.comment,
        "by": decision.decided_by,
        "after": after["i"],
    }


@durable.workflow(registry=registry, name="journals.sleep")
def sleep_wf(seconds: float) -> list[int]:
    before = fetch(1)["i"]
    durable.sleep(seconds)
    return [before, fetch(2)["i"]]


@durable.workflow(registry=registry, name="journals.recv")
def recv_wf() -> list[Any]:
    first = fetch(1)["i"]
    note = durable.recv("note")
    go = durable.recv("go", timeout=3600)
    return [first, note, go, fetch(2)["i"]]


@durable.workflow(registry=registry, name="journals.events")
def events_wf(n: int) -> int:
    durable.set_event("progress", {"done": 0})
    for i in range(n):
        durable.write_stream("tokens", f"t{i}")
        durable.set_event("progress", {"done": i + 1})
    durable.close_stream("tokens")
    return n


@durable.workflow(registry=registry, name="journals.budget", budget=durable.Budget(dollars=5))
def budget_wf(n: int) -> list[str]:
    return [think(100 * (i + 1)) for i in range(n)]


@durable.workflow(registry=registry, name="journals.child")
def child_wf(i: int) -> int:
    return fetch(i)["square"] + fetch(i + 10)["square"]


@durable.workflow(registry=registry, name="journals.parent")
def parent_wf(n: int) -> dict[str, Any]:
    first = fetch(0)["i"]
    children = [child_wf(i) for i in range(n)]
    return {"first": first, "children": children}


@durable.workflow(registry=registry, name="journals.gather")
async def gather_wf(n: int) -> dict[str, Any]:
    squares = await asyncio.gather(*(square(i) for i in range(n)))
    await durable.set_event_async("squares", list(squares))
    return {"squares": list(squares), "total": sum(squares)}


# -- the fixtures -----------------------------------------------------------------------------

# A step of driving a workflow past a wait: ("send", topic, value), ("approve", gate), or
# ("clock", None, None) for a sleep (its wake-up time is passed on a fake clock).
Wait = tuple[str, str | None, Any]


@dataclass(frozen=True)
class Scenario:
    """One fixture file, tests/fixtures/journals/<stem>.json.

    `waits` are what the workflow waits for on its way, in order. A finished fixture was
    driven through all of them by make_journals; a suspended one (`suspended`) was
    exported at the first, and the replay test drives it through them, after which the
    bodies in `after` (and only those) run. `result` is the workflow's value at the end
    (None for one that fails: `status` says how it ended)."""

    stem: str
    workflow: Callable[..., Any]
    args: tuple[Any, ...]
    workflow_id: str
    result: Any = None
    status: str = "SUCCESS"
    children: bool = False
    waits: tuple[Wait, ...] = ()
    suspended: bool = False
    after: tuple[str, ...] = ()


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "finished_steps",
        steps_wf,
        (3,),
        "journal-steps",
        result={
            "rows": [
                {"i": 0, "square": 0, "tags": ["a", "0"]},
                {"i": 1, "square": 1, "tags": ["a", "1"]},
                {"i": 2, "square": 4, "tags": ["a", "2"]},
            ],
            "total": 5,
        },
    ),
    Scenario("finished_patched", patched_wf, (), "journal-patched", result=[1, 4]),
    Scenario(
        "finished_transaction",
        transaction_wf,
        ("ann",),
        "journal-transaction",
        result=["ANN", "ANN-2", "49"],
    ),
    Scenario(
        "finished_effects_kept",
        saga_wf,
        (False,),
        "journal-saga-kept",
        result={"hotel": {"booking": "B-hotel"}, "car": {"booking": "B-car"}},
    ),
    Scenario(
        "finished_effects_compensated",
        saga_wf,
        (True,),
        "journal-saga-undone",
        status="COMPENSATED",
    ),
    Scenario("finished_with_an_error", broken_wf, (), "journal-broken", status="ERROR"),
    Scenario(
        "finished_after_approval",
        approval_wf,
        (3,),
        "journal-approval-decided",
        result={"first": 1, "approved": True, "comment": "ok", "by": "ops", "after": 2},
        waits=(("approve", "ship", None),),
    ),
    Scenario(
        "finished_after_sleep",
        sleep_wf,
        (0.2,),
        "journal-slept",
        result=[1, 2],
    ),
    Scenario(
        "finished_after_messages",
        recv_wf,
        (),
        "journal-received",
        result=[1, {"text": "hi"}, "go!", 2],
        waits=(("send", "note", {"text": "hi"}), ("send", "go", "go!")),
    ),
    Scenario("finished_events_and_stream", events_wf, (3,), "journal-events", result=3),
    Scenario(
        "finished_with_budget_charges",
        budget_wf,
        (3,),
        "journal-budget",
        result=["thought 100", "thought 200", "thought 300"],
    ),
    Scenario(
        "finished_with_children",
        parent_wf,
        (2,),
        "journal-parent",
        result={"first": 0, "children": [100, 1 + 121]},
        children=True,
    ),
    Scenario(
        "finished_async_gather",
        gather_wf,
        (4,),
        "journal-gather",
        result={"squares": [0, 1, 4, 9], "total": 14},
    ),
    Scenario(
        "suspended_at_recv",
        recv_wf,
        (),
        "journal-waiting-recv",
        result=[1, "first note", "go", 2],
        waits=(("send", "note", "first note"), ("send", "go", "go")),
        suspended=True,
        after=("fetch:2",),
    ),
    Scenario(
        "suspended_at_approval",
        approval_wf,
        (9,),
        "journal-waiting-approval",
        result={"first": 1, "approved": True, "comment": "ok", "by": "ops", "after": 2},
        waits=(("approve", "ship", None),),
        suspended=True,
        after=("fetch:2",),
    ),
    Scenario(
        "suspended_at_sleep",
        sleep_wf,
        (3600.0,),
        "journal-waiting-sleep",
        result=[1, 2],
        waits=(("clock", None, None),),
        suspended=True,
        after=("fetch:2",),
    ),
)

BY_STEM = {s.stem: s for s in SCENARIOS}
