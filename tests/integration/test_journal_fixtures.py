"""Journals written by earlier code replay on the code in the tree.

Each file of tests/fixtures/journals/ is an export (`Client.export_workflow`) of a workflow
of tests/apps/journals_app.py, run to its end or to its first wait by
tests/fixtures/make_journals.py with the code of the day it was made. Here each is
imported into a fresh database and run again on today's code:

- A finished workflow is replayed whole. Each workflow of the file that succeeded or
  failed is forked from after its last journal position, so that every journaled call
  replays and only the outcome is written; one whose compensations ran (which a fork from
  there refuses: ForkAfterUndoError) is made runnable again in place. No body runs (the
  app's WORLD stays empty), and the outcome is the stored one: the same status, the same
  output text, the same error type and message, the same events and budget spent.
- A suspended workflow is driven to its end (the message sent, the gate approved, the
  sleep's wake-up time passed on a fake clock): it ends with the scenario's result, and
  only the calls after its wait run.

So this test fails when a change breaks journals already stored: a step, effect or
workflow of journals_app renamed or reordered (the replay meets NondeterminismError, or
no worker has the code), a label of durable/_base/labels.py changed, a journal row read or
written differently (a replay that meets another name or decodes another value), an
export format or a schema that no longer takes these rows. Do not make it pass by
writing the fixtures again: make the code read the old journals, or bump JOURNAL_VERSION
with a migration that rewrites them and add new fixtures beside the old ones.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

import durable
from durable._core import decode_error
from durable.errors import DurableError
from tests.apps import journals_app as app

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "journals").glob("*.json"))
REPLAYED = {"SUCCESS", "ERROR"}  # forked from after their last position
REOPENED = {"COMPENSATED"}  # a fork after their undone effects is refused: run in place


def test_every_scenario_has_its_fixture() -> None:
    assert [p.stem for p in FIXTURES] == sorted(app.BY_STEM)


def outcome(client: durable.Client, workflow_id: str) -> dict[str, Any]:
    """How a workflow ended, as stored: status, output text, error type and message,
    events, budget spent."""
    info = client.get_workflow(workflow_id)
    budget = client.budget(workflow_id)
    return {
        "status": info.status.value,
        "output": info.output,
        "error": None if info.error is None else decode_error(info.error)[:2],
        "events": client.events(workflow_id),
        "spent": None if budget is None else budget["spent"],
    }


def finish(client: durable.Client, workflow_id: str) -> None:
    """Wait for a workflow to end, whatever it ends with."""
    try:
        client.retrieve(workflow_id).result(timeout=30)
    except DurableError:
        pass


def last_positions(data: dict[str, Any]) -> dict[str, int]:
    last: dict[str, int] = {}
    for step in data["tables"]["steps"]:
        last[step["workflow_id"]] = max(last.get(step["workflow_id"], 0), step["step_seq"] + 1)
    return last


def replay_finished(url: str, data: dict[str, Any]) -> None:
    rows = {w["workflow_id"]: w for w in data["tables"]["workflows"]}
    last = last_positions(data)
    replayed = 0
    with durable.Engine(url, registry=app.registry, worker=True, poll_interval=0.05) as engine:
        client = engine.client
        for workflow_id, row in rows.items():
            stored = outcome(client, workflow_id)
            assert stored["status"] == row["status"]
            if row["status"] in REPLAYED:
                again = f"{workflow_id}.replayed"
                engine.fork(workflow_id, from_step=last.get(workflow_id, 0), new_id=again)
            else:
                assert row["status"] in REOPENED, row["status"]
                again = workflow_id
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(
                        "UPDATE durable.workflows SET status = 'PENDING', output = NULL,"
                        " error = NULL, finished_at = NULL WHERE workflow_id = %s",
                        [workflow_id],
                    )
                client.notify_work(workflow_id)
            finish(client, again)
            assert outcome(client, again) == stored, workflow_id
            # Every call replayed: the new run wrote its outcome and nothing else.
            steps = [(s.step_seq, s.step_name, s.output, s.error) for s in client.steps(again)]
            assert steps == [
                (s["step_seq"], s["step_name"], s["output"], s["error"])
                for s in data["tables"]["steps"]
                if s["workflow_id"] == workflow_id
            ]
            replayed += 1
    assert replayed == len(rows)
    assert app.WORLD == []  # no body ran: every call was read from its journal


def drive_suspended(url: str, data: dict[str, Any], scenario: app.Scenario) -> None:
    (row,) = data["tables"]["workflows"]
    assert row["status"] == "SUSPENDED"
    clock = None
    if any(what == "clock" for what, _, _ in scenario.waits):
        # Past the journaled wake-up time, whenever the fixture was made.
        wake_at = dt.datetime.fromisoformat(row["wake_at"])
        clock = durable.FakeClock(max(wake_at, dt.datetime.now(dt.UTC)) + dt.timedelta(seconds=1))
    with durable.Engine(
        url, registry=app.registry, worker=True, poll_interval=0.05, clock=clock
    ) as engine:
        client = engine.client
        for what, name, value in scenario.waits:
            if what == "send":
                client.send(scenario.workflow_id, value, topic=name)
            elif what == "approve" and name is not None:
                client.decide(scenario.workflow_id, name, True, comment="ok", decided_by="ops")
        value = client.retrieve(scenario.workflow_id).result(timeout=30)
    assert value == scenario.result
    assert app.WORLD == list(scenario.after)  # the calls journaled before the wait replayed


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_a_stored_journal_replays_on_this_code(database_url: str, path: Path) -> None:
    data = json.loads(path.read_text("utf-8"))
    scenario = app.BY_STEM[path.stem]
    assert data["root"] == scenario.workflow_id
    app.setup(database_url)
    with durable.Client(database_url) as client:
        assert client.import_workflow(data) == data["workflow_ids"]
    app.WORLD.clear()
    if scenario.suspended:
        drive_suspended(database_url, data, scenario)
    else:
        root = next(w for w in data["tables"]["workflows"] if w["workflow_id"] == data["root"])
        assert root["status"] == scenario.status
        if scenario.status == "SUCCESS":
            assert json.loads(root["output"]) == scenario.result
        replay_finished(database_url, data)
