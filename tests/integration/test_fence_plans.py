"""The fence of a run's writes finds the workflow by its primary key, whatever the
statistics say.

Statistics gathered while few workflows ran (most finished) make `status = 'RUNNING'` look
rare; then a burst of starts makes it common before autovacuum analyzes again. A fence
written with equalities on epoch and status let the planner walk an index of every
running workflow for each step (measured: 5 ms a step among 20,000 running workflows,
against 0.1 ms by the key). The plans are checked, not timed.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
import pytest

import durable

NOW = dt.datetime.now(dt.UTC)

# The hot fenced statements, with parameters of the right types.
STATEMENTS: dict[str, dict[str, Any]] = {
    "record_step": {
        "workflow_id": "run-77",
        "epoch": 1,
        "step_seq": 0,
        "step_name": "s",
        "kind": "step",
        "output": "1",
        "error": None,
        "attempts": 1,
        "child_workflow_id": None,
        "started_at": NOW,
    },
    "finish_workflow": {
        "workflow_id": "run-77",
        "epoch": 1,
        "status": "SUCCESS",
        "output": "1",
        "error": None,
    },
    "record_steps": {
        "workflow_ids": ["run-77"],
        "epochs": [1],
        "seqs": [0],
        "names": ["s"],
        "kinds": ["step"],
        "outputs": ["1"],
        "errors": [None],
        "attempts": [1],
        "started": [NOW],
    },
    "effect_intent": {
        "workflow_id": "run-77",
        "epoch": 1,
        "idempotency_key": "k",
        "step_seq": 0,
        "effect_name": "e",
        "params_fingerprint": "f",
    },
    "effect_pending": {"workflow_id": "run-77", "epoch": 1, "idempotency_key": "k"},
    "settle_effect": {
        "workflow_id": "run-77",
        "epoch": 1,
        "idempotency_key": "k",
        "status": "applied",
        "result": "1",
        "error": None,
        "reconciled": False,
        "step_seq": 0,
        "step_name": "e",
        "started_at": NOW,
    },
}


def _indexes(plan: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(plan, dict):
        if "Index Name" in plan and plan.get("Relation Name") == "workflows":
            found.add(plan["Index Name"])
        for value in plan.values():
            found |= _indexes(value)
    elif isinstance(plan, list):
        for value in plan:
            found |= _indexes(value)
    return found


@pytest.fixture
def stale_statistics(database_url: str) -> str:
    with durable.Client(database_url, migrate=True):
        pass
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs)"
            " SELECT 'done-' || i, 'x', 'SUCCESS', '[]' FROM generate_series(1, 30000) AS i"
        )
        conn.execute("ANALYZE durable.workflows")  # running workflows look rare...
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs, owner, epoch)"
            " SELECT 'run-' || i, 'x', 'RUNNING', '[]', 'me', 1"
            " FROM generate_series(1, 20000) AS i"
        )  # ...until a burst of starts, before autovacuum analyzes again
    return database_url


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_a_fenced_write_finds_its_workflow_by_the_primary_key(
    stale_statistics: str, name: str
) -> None:
    with durable.Client(stale_statistics) as client:
        text = client.db.statement(name)
    with psycopg.connect(stale_statistics, autocommit=True) as conn:
        for mode in ("force_custom_plan", "force_generic_plan"):
            conn.execute(f"SET plan_cache_mode = {mode}")
            # A named prepared statement, so that the plan-cache mode applies.
            cur = conn.cursor()
            row = cur.execute(
                "EXPLAIN (FORMAT JSON) " + text, STATEMENTS[name], prepare=True
            ).fetchone()
            assert row is not None
            plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
            assert _indexes(plan) == {"workflows_pkey"}, (mode, plan)
