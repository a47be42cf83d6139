"""The seeded simulation as part of the suite (see tests/sim/__init__.py).

`test_regressions` replays scenarios that once broke an invariant on main, each kept
with the defect it found. `test_seeds` runs a fixed range of seeds plus a few random ones
(printed, so a failure there is replayed with `python -m tests.sim --seed N`), within
DURABLE_SIM_BUDGET seconds (default 200); DURABLE_SIM_SEEDS sets how many fixed seeds.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator

import pytest

from durable.testing import TemplateDatabases
from tests.sim.simulate import Databases, check_one, run_seeds

REGRESSIONS = {
    # Not a defect of durable, one of the invariant: a child created in the window before
    # its parent's journal row, whose parent was cancelled before it ran that far again, is
    # rightly never adopted (it is cancelled with its parent).
    "child-of-a-parent-cancelled-in-the-window": {
        "workflows": [["aprog", [["child", "derived", [["pay", 100]]]]]],
        "phases": [[["two", 4], [["cancel", 0]]]],
        "durability": "sync",
        "app": "same",
    },
    # A connection lost right after its checkout (while the fake clock was set on it) failed
    # an async run with a raw OperationalError instead of interrupting it as an outage.
    "lost-at-async-checkout": {
        "workflows": [["aprog", [["recv"], ["model", 0.5]]]],
        "phases": [[["lost", 3], [["send", 0]]], [None, []]],
        "durability": "sync",
        "app": "same",
    },
    # A connection to the application database lost while a @transaction step checked it
    # out (before BEGIN) failed the workflow with a raw OperationalError, not an outage.
    "lost-at-transaction-begin": {
        "workflows": [["prog", [["llm", 400], ["txn"]]]],
        "phases": [[["lost", 4], []]],
        "durability": "sync",
        "app": "same",
    },
    # Gathered effects' undos ran in the order the effects finished, which a resume in the
    # middle of the undo did not repeat: one payment was refunded twice, the other never.
    "gathered-undo-order": {
        "workflows": [
            ["faprog", [["par", [["pay", 100], ["pay", 100], ["model", 0.35]]], ["fail"]]]
        ],
        "phases": [[["crash_after", 22], []], [None, [["resume", 0]]]],
        "durability": "exit",
        "app": "same",
    },
}


@pytest.fixture(scope="module")
def sim_databases(pg_databases: TemplateDatabases) -> Iterator[Databases]:
    dbs = Databases(pg_databases)
    yield dbs
    dbs.close()


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regressions(sim_databases: Databases, name: str) -> None:
    check_one(sim_databases, json.loads(json.dumps(REGRESSIONS[name])))


def test_seeds(sim_databases: Databases) -> None:
    budget = float(os.environ.get("DURABLE_SIM_BUDGET", "200"))
    fixed = int(os.environ.get("DURABLE_SIM_SEEDS", "12"))
    extra = [random.randrange(2**32) for _ in range(2)]
    print(f"simulation: seeds 0..{fixed - 1} and random seeds {extra}")
    ran = run_seeds(sim_databases, [*range(fixed), *extra], budget)
    assert ran > 0
