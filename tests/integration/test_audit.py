"""The audit log over a real database: every operator action (cancel, resume, move, fork,
import, a decision, a budget raised, a message sent, a schedule created, updated, paused,
resumed, deleted, triggered or backfilled) leaves a row
naming who acted, what and on what; an action that changed nothing leaves none; an action
whose row cannot be written does not happen; the CLI records its OS user and host, and
`durable audit` and `durable workflows show` print the rows."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest

import durable
from durable._client.audit import whoami

reg = durable.Registry()
elsewhere = durable.Registry()  # code no worker of these tests has: its runs stay PENDING


@durable.workflow(registry=reg, name="au.gated")
def gated(note: str) -> str:
    decision = durable.approval("ship", payload={"note": note}, timeout=3600)
    return "shipped" if decision.approved else "held"


@durable.workflow(registry=reg, name="au.budgeted", budget=durable.Budget(dollars=1.0))
def budgeted(n: int) -> int:
    return n


@durable.workflow(registry=elsewhere, name="au.nobody")
def nobody(n: int) -> int:
    return n


@pytest.fixture
def engine(database_url: str) -> Iterator[durable.Engine]:
    with durable.Engine(database_url, registry=reg) as eng:
        yield eng


def _at_gate(engine: durable.Engine, workflow_id: str) -> None:
    engine.start(gated, "hello", workflow_id=workflow_id)
    deadline = time.monotonic() + 20
    while not engine.list_approvals(workflow_id):
        assert time.monotonic() < deadline, "the workflow never reached its gate"
        time.sleep(0.05)


def _actions(client: durable.Client, workflow_id: str | None) -> list[tuple[str, ...]]:
    """(action, subject, detail, actor) of the rows, oldest first."""
    rows = client.audit_log(workflow_id)
    return [(r["action"], r["subject"], r["detail"], r["actor"]) for r in reversed(rows)]


def test_every_operator_action_is_recorded_with_who_acted(
    engine: durable.Engine, database_url: str
) -> None:
    who = "ana@ops-1 via deploy"
    _at_gate(engine, "au-gate")
    engine.start(budgeted, 1, workflow_id="au-budget").result(timeout=20)
    with durable.Client(database_url, actor=who) as ops:
        ops.submit(nobody, 1, workflow_id="au-idle")
        ops.cancel("au-idle", "wrong inputs")
        ops.resume("au-idle")
        ops.resume("au-idle")  # still waiting for a worker: nothing changes, nothing recorded
        ops.resume("au-idle", version="v2")  # moved to other code
        ops.fork("au-idle", from_step=0, new_id="au-fork")
        ops.decide("au-gate", "ship", True, comment="looks right", decided_by="bob")
        ops.decide("au-gate", "ship", True)  # the same decision again: harmless, not recorded
        ops.raise_budget("au-budget", dollars=2.0)
        ops.schedule("au-sched", nobody, "0 * * * *")
        ops.pause_schedule("au-sched")
        ops.pause_schedule("au-sched", False)
        ops.delete_schedule("au-sched")
        exported = json.dumps(ops.export_workflow("au-budget"))
        ops.import_workflow(json.loads(exported.replace("au-budget", "au-copy")))

        assert _actions(ops, "au-idle") == [
            ("cancel", None, "wrong inputs", who),
            ("resume", None, None, who),
            ("move", "version 'v2'", None, who),
            ("fork", "au-fork", "from step 0", who),
        ]
        assert _actions(ops, "au-fork") == [("forked", "au-idle", "from step 0", who)]
        assert _actions(ops, "au-gate") == [("approve", "ship", "looks right", who)]
        ((action, _, raised, actor),) = _actions(ops, "au-budget")
        assert (action, actor) == ("raise budget", who) and "dollars +2" in str(raised)
        assert _actions(ops, "") == [
            ("create schedule", "au-sched", "au.nobody at '0 * * * *' (UTC)", who),
            ("pause schedule", "au-sched", None, who),
            ("resume schedule", "au-sched", None, who),
            ("delete schedule", "au-sched", None, who),
        ]
        assert _actions(ops, "au-copy") == [("import", None, None, who)]
        everything = ops.audit_log()
        assert len(everything) == 12 and everything[0]["action"] == "import"
        assert [r["workflow_id"] for r in ops.audit_log(action="cancel")] == ["au-idle"]
        first, rest = (
            ops.audit_log(limit=5),
            ops.audit_log(before=(everything[4]["at"], everything[4]["audit_id"])),
        )
        assert first + rest == everything  # pages by (at, audit_id), none lost or repeated


def test_a_cancel_records_each_workflow_it_stopped(database_url: str) -> None:
    with durable.Client(database_url, actor="ana") as ops:
        ops.submit(nobody, 1, workflow_id="au-done")
        ops.cancel("au-done")
        ops.cancel("au-done")  # already cancelled: nothing changes, nothing recorded
        assert [r["action"] for r in ops.audit_log("au-done")] == ["cancel"]


def test_an_action_whose_audit_row_cannot_be_written_does_not_happen(
    engine: durable.Engine, database_url: str
) -> None:
    _at_gate(engine, "au-held")
    with durable.Client(database_url, actor="ana") as ops:
        ops.submit(nobody, 1, workflow_id="au-kept")
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(
                "ALTER TABLE durable.audit_log ADD CONSTRAINT refuse_all CHECK (action = '')"
            )
        with pytest.raises(durable.errors.DurableError):
            ops.cancel("au-kept")
        assert ops.get_workflow("au-kept").status is durable.WorkflowStatus.PENDING
        with pytest.raises(durable.errors.DurableError):
            ops.decide("au-held", "ship", True)
        assert ops.list_approvals("au-held")  # still waiting
        with pytest.raises(durable.errors.DurableError):
            ops.fork("au-kept", from_step=0, new_id="au-never")
        with pytest.raises(durable.errors.WorkflowNotFoundError):
            ops.get_workflow("au-never")
        with pytest.raises(durable.errors.DurableError):
            ops.resume("au-kept", version="v9")
        assert ops.get_workflow("au-kept").version is None
        assert ops.audit_log() == []


def test_the_actor_is_the_callers_choice_with_a_default(database_url: str) -> None:
    with durable.Client(database_url) as library:
        library.submit(nobody, 1, workflow_id="au-lib")
        library.cancel("au-lib")
        with library.acting_as("carol via ticket 7"):
            library.resume("au-lib")
        library.cancel("au-lib")
        actors = [r["actor"] for r in reversed(library.audit_log("au-lib"))]
        assert actors == [f"library {whoami()}", "carol via ticket 7", f"library {whoami()}"]
        with pytest.raises(ValueError, match="actor"), library.acting_as(" "):
            pass


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_the_cli_records_its_user_and_host_and_prints_the_log(database_url: str) -> None:
    with durable.Client(database_url) as client:
        client.submit(nobody, 1, workflow_id="au-cli")
    url = ["--database-url", database_url]
    done = _cli("workflows", "cancel", "au-cli", "--reason", "from a terminal", *url)
    assert done.returncode == 0, done.stderr
    listed = _cli("audit", "--json", *url)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    expected = {"workflow_id": "au-cli", "action": "cancel", "detail": "from a terminal"}
    assert {k: row[k] for k in expected} == expected
    assert row["actor"] == f"{whoami()} via cli"
    shown = _cli("workflows", "show", "au-cli", *url)
    assert shown.returncode == 0, shown.stderr
    assert "operator actions" in shown.stdout and "from a terminal" in shown.stdout
    as_json = json.loads(_cli("workflows", "show", "au-cli", "--json", *url).stdout)
    assert [a["action"] for a in as_json["audit"]] == ["cancel"]
    table = _cli("audit", "--workflow", "au-cli", *url)
    assert table.returncode == 0 and "au-cli" in table.stdout and "cancel" in table.stdout


def test_a_schedule_run_by_hand_is_recorded(database_url: str) -> None:
    with durable.Client(database_url, actor="ana@ops via cli") as client:
        client.schedule("au.hourly", nobody, "0 * * * *")
        handle = client.trigger_schedule("au.hourly", registry=elsewhere)
        start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        filled = client.backfill_schedule(
            "au.hourly", start, start + dt.timedelta(hours=2), registry=elsewhere
        )
        assert len(filled) == 2
        acted = {r["workflow_id"] for r in client.audit_log()} | {
            r["subject"] for r in client.audit_log("")
        }
        ran = {handle.workflow_id, *(h.workflow_id for h in filled)}
        assert ran <= acted or "au.hourly" in acted
        # Each run started by hand, on its own workflow; a tick backfilled again records none.
        who = "ana@ops via cli"
        assert _actions(client, handle.workflow_id) == [
            ("trigger schedule", "au.hourly", None, who)
        ]
        for h in filled:
            assert _actions(client, h.workflow_id) == [
                ("backfill schedule", "au.hourly", None, who)
            ]
        client.backfill_schedule(
            "au.hourly", start, start + dt.timedelta(hours=2), registry=elsewhere
        )
        assert [r["action"] for r in client.audit_log(action="backfill schedule")] == [
            "backfill schedule"
        ] * 2


def test_schedules_stored_and_messages_sent_by_an_operator_are_recorded(
    database_url: str,
) -> None:
    who = "ana@ops via cli"
    with durable.Client(database_url, actor=who) as client:
        client.schedule("au.daily", nobody, "0 6 * * *")
        client.schedule("au.daily", nobody, "0 6 * * *")  # as it is: nothing changed
        client.schedule("au.daily", nobody, "0 7 * * *", timezone="Europe/Paris")
        assert _actions(client, "") == [
            ("create schedule", "au.daily", "au.nobody at '0 6 * * *' (UTC)", who),
            ("update schedule", "au.daily", "au.nobody at '0 7 * * *' (Europe/Paris)", who),
        ]
        client.submit(nobody, 1, workflow_id="au-send")
        client.send("au-send", {"go": True}, topic="orders", idempotency_key="k-1")
        assert _actions(client, "au-send") == [("send", "orders", "k-1", who)]
    # An application's own sends (a client with no actor) are its traffic: not recorded.
    with durable.Client(database_url) as app:
        app.send("au-send", "from the application")
        with app.acting_as("bob via a runbook"):
            app.send("au-send", "by hand")
        assert [(a, actor) for a, _, _, actor in _actions(app, "au-send")] == [
            ("send", who),
            ("send", "bob via a runbook"),
        ]
    url = ["--database-url", database_url]
    done = _cli("send", "au-send", '{"n": 1}', *url)
    assert done.returncode == 0, done.stderr
    with durable.Client(database_url) as client:
        assert _actions(client, "au-send")[-1][0::3] == ("send", f"{whoami()} via cli")
