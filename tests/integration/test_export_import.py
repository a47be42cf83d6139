"""Export of a workflow from one database and its import into another
(`Client.export_workflow`, `Client.import_workflow`, `durable workflows export|import`).

Each test has two databases of its own: the one a run happens in ("there") and the one it
is carried to ("here"). What ran is counted in `App.runs`, which each step, effect and
compensation appends to when its body runs (a replayed call does not), so that a run
resumed here can be checked to run only what the journal did not hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

import durable
from durable import errors
from durable.testing import TemplateDatabases


@pytest.fixture
def here(pg_databases: TemplateDatabases) -> Iterator[str]:
    """A second database, migrated, to import into."""
    url = pg_databases.create()
    yield url
    pg_databases.drop(url)


@dataclass
class App:
    """The workflows the tests carry over:

    trip(fail): tick(0), an effect `book` (its compensation `unbook`), an event, a stream
      of two values then closed, a charged step under a $10 budget, a child `leg(2)` (two
      ticks), an approval "ship"; with `fail`, it raises after the approval (then `unbook`
      runs).
    work(n, block_at): tick(0..n-1), blocking at `block_at` until `gate` is set.
    inbox(): tick(0), waits for a message on "go", then an approval "ok", then tick(1).
    """

    registry: durable.Registry
    runs: list[str] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    workflows: dict[str, Any] = field(default_factory=dict)


def make_app() -> App:
    reg = durable.Registry()
    app = App(reg)

    @durable.step(registry=reg, name="tick")
    def tick(i: int, block: bool = False) -> int:
        app.runs.append(f"tick{i}")
        if block and not app.gate.is_set():
            app.entered.set()
            assert app.gate.wait(10), "the test never released the gate"
        return 10 * i

    @durable.effect(idempotent=True, registry=reg, name="book")
    def book(item: str, *, idempotency_key: str) -> str:
        app.runs.append(f"+{item}")
        return f"booked {item}"

    @book.compensation  # type: ignore[attr-defined]
    @durable.effect(idempotent=True, registry=reg, name="unbook")
    def unbook(item: str, *, idempotency_key: str) -> None:
        app.runs.append(f"-{item}")

    @durable.step(registry=reg, name="pay")
    def pay(amount: float) -> float:
        app.runs.append("pay")
        durable.charge(dollars=amount, tokens=7)
        return amount

    @durable.workflow(registry=reg, name="leg")
    def leg(n: int) -> list[int]:
        return [tick(100 + i) for i in range(n)]

    @durable.workflow(registry=reg, name="trip", budget=durable.Budget(dollars=10))
    def trip(fail: bool = False) -> dict[str, Any]:
        first = tick(0)
        booked = book("hotel")
        durable.set_event("progress", {"booked": "hotel"})
        durable.write_stream("log", "booked")
        durable.write_stream("log", "paying")
        paid = pay(0.125)
        durable.close_stream("log")
        legs = leg(2)
        decision = durable.approval("ship", {"total": paid})
        if fail:
            raise RuntimeError("the ship sank")
        return {"first": first, "booked": booked, "legs": legs, "approved": decision.approved}

    @durable.workflow(registry=reg, name="work")
    def work(n: int, block_at: int | None = None) -> list[int]:
        return [tick(i, i == block_at) for i in range(n)]

    @durable.workflow(registry=reg, name="inbox")
    def inbox() -> list[Any]:
        a = tick(0)
        message = durable.recv("go")
        decision = durable.approval("ok")
        return [a, message, decision.approved, tick(1)]

    app.workflows = {"trip": trip, "work": work, "inbox": inbox, "leg": leg}
    return app


def wait_for(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def wait_status(client: durable.Client, workflow_id: str, status: durable.WorkflowStatus) -> None:
    wait_for(lambda: client.get_workflow(workflow_id).status is status, f"{workflow_id}: {status}")


def run_trip(url: str, app: App, workflow_id: str, *, fail: bool = False) -> None:
    """Run trip to its end in `url`: approve its gate once it waits there."""
    with durable.Engine(url, registry=app.registry) as engine:
        handle = engine.start(app.workflows["trip"], fail, workflow_id=workflow_id)
        wait_status(engine.client, workflow_id, durable.WorkflowStatus.SUSPENDED)
        engine.client.decide(workflow_id, "ship", True, comment="fine", decided_by="ops")
        if fail:
            with pytest.raises(errors.WorkflowFailedError, match="the ship sank"):
                handle.result(timeout=20)
        else:
            assert handle.result(timeout=20)["approved"] is True


def test_a_finished_workflow_and_its_child_import_row_for_row(database_url: str, here: str) -> None:
    app = make_app()
    run_trip(database_url, app, "trip-1")
    with durable.Client(database_url) as there:
        data = there.export_workflow("trip-1", children=True)
        alone = there.export_workflow("trip-1")
    text = json.dumps(data)  # JSON as it is: nothing to convert
    assert data["durable_export"] == 1 and data["labels_version"] == 1
    assert data["root"] == "trip-1"
    assert data["workflow_ids"] == ["trip-1", "trip-1:child:7"]
    assert alone["workflow_ids"] == ["trip-1"]
    tables = data["tables"]
    assert {t: len(rows) for t, rows in tables.items()} == {
        "workflows": 2,
        "budgets": 1,
        # trip: tick, book, event, two writes, pay, close, the child, the approval;
        # the child: two ticks.
        "steps": 9 + 2,
        "charges": 4,  # every step under a budget: tick, pay and the child's ticks
        "tool_calls": 0,
        "effects": 1,
        "approvals": 1,
        "messages": 0,
        "events": 1,
        "streams": 3,
        "step_attempts": 0,
        "late_charges": 0,
    }
    # Stored values are the serialized text they are in the database.
    (effect,) = tables["effects"]
    assert effect["result"] == '"booked hotel"' and effect["idempotency_key"] == "trip-1:1"
    (charge,) = [c for c in tables["charges"] if c["tokens"]]
    assert charge["dollars"] == "0.125" and charge["tokens"] == 7
    assert tables["budgets"][0]["limit_dollars"] == "10"
    (gate,) = tables["approvals"]
    assert (gate["status"], gate["comment"], gate["decided_by"]) == ("approved", "fine", "ops")

    with durable.Client(here) as client:
        assert client.import_workflow(json.loads(text)) == ["trip-1", "trip-1:child:7"]
        back = client.export_workflow("trip-1", children=True)
        assert back["tables"] == tables
        # What the readers of the original saw, a reader here sees.
        assert client.get_workflow("trip-1").status is durable.WorkflowStatus.SUCCESS
        assert client.retrieve("trip-1").result(timeout=5)["legs"] == [1000, 1010]
        assert client.events("trip-1") == {"progress": {"booked": "hotel"}}
        assert list(client.read_stream("trip-1", "log")) == ["booked", "paying"]
        budget = client.budget("trip-1")
        assert budget is not None and budget["spent"]["dollars"] == 0.125


def test_a_compensated_workflow_imports_with_its_undo(database_url: str, here: str) -> None:
    app = make_app()
    run_trip(database_url, app, "sunk", fail=True)
    assert app.runs[-1] == "-hotel"
    with durable.Client(database_url) as there:
        data = there.export_workflow("sunk", children=True)
    kinds = [(s["step_name"], s["kind"]) for s in data["tables"]["steps"] if s["kind"] == "effect"]
    assert kinds == [("book", "effect"), ("unbook", "effect")]
    with durable.Client(here) as client:
        client.import_workflow(data)
        assert client.export_workflow("sunk", children=True)["tables"] == data["tables"]
        exported = data["tables"]["workflows"][0]["status"]
        assert client.get_workflow("sunk").status == exported
        with pytest.raises(errors.WorkflowFailedError, match="the ship sank"):
            client.retrieve("sunk").result(timeout=5)


def test_a_running_workflow_resumes_here_without_running_its_journaled_steps(
    database_url: str, here: str
) -> None:
    app = make_app()
    work = app.workflows["work"]
    with durable.Engine(database_url, registry=app.registry) as engine:
        handle = engine.start(work, 4, 2, workflow_id="w")
        assert app.entered.wait(10)
        data = engine.client.export_workflow("w")  # ticks 0 and 1 journaled, 2 in flight
        app.gate.set()
        assert handle.result(timeout=10) == [0, 10, 20, 30]
    (row,) = data["tables"]["workflows"]
    assert row["status"] == "RUNNING" and row["owner"] is not None
    assert [s["step_seq"] for s in data["tables"]["steps"]] == [0, 1]

    app.runs.clear()
    with durable.Client(here) as client:
        assert client.import_workflow(data) == ["w"]
        info = client.get_workflow("w")
        # Nobody here holds it: runnable by any worker, or by resume.
        assert (info.status, info.owner) == (durable.WorkflowStatus.PENDING, None)
        back = client.export_workflow("w")["tables"]
        (imported,) = back.pop("workflows")
        assert imported["lease_expires_at"] is None
        assert {
            k: v for k, v in imported.items() if k not in ("status", "owner", "lease_expires_at")
        } == {k: v for k, v in row.items() if k not in ("status", "owner", "lease_expires_at")}
        assert back == {k: v for k, v in data["tables"].items() if k != "workflows"}
    with durable.Engine(here, registry=app.registry) as engine:
        assert engine.resume("w").result(timeout=10) == [0, 10, 20, 30]
        assert [s.step_seq for s in engine.steps("w")] == [0, 1, 2, 3]
    assert app.runs == ["tick2", "tick3"]


def test_a_suspended_workflow_waits_here_for_its_message_and_decision(
    database_url: str, here: str
) -> None:
    app = make_app()
    with durable.Engine(database_url, registry=app.registry) as engine:
        engine.start(app.workflows["inbox"], workflow_id="in")
        wait_status(engine.client, "in", durable.WorkflowStatus.SUSPENDED)
        data = engine.client.export_workflow("in")
    assert app.runs == ["tick0"]
    app.runs.clear()
    with durable.Engine(here, registry=app.registry, worker=True, poll_interval=0.05) as engine:
        engine.client.import_workflow(data)
        assert engine.get_workflow("in").status is durable.WorkflowStatus.SUSPENDED
        engine.send("in", "hello", topic="go")
        wait_for(lambda: engine.list_approvals("in"), "the gate")
        engine.decide("in", "ok", True)
        assert engine.retrieve("in").result(timeout=20) == [0, "hello", True, 10]
    assert app.runs == ["tick1"]


def test_an_imported_workflow_forks_here(database_url: str, here: str) -> None:
    app = make_app()
    with durable.Engine(database_url, registry=app.registry) as engine:
        engine.start(app.workflows["work"], 3, workflow_id="w").result(timeout=10)
        data = engine.client.export_workflow("w")
    app.runs.clear()
    with durable.Engine(here, registry=app.registry) as engine:
        engine.client.import_workflow(data)
        fork = engine.fork("w", from_step=2, new_id="w-again")
        assert fork.result(timeout=10) == [0, 10, 20]
        assert engine.get_workflow("w").status is durable.WorkflowStatus.SUCCESS
    assert app.runs == ["tick2"]


def count_rows(url: str) -> dict[str, int]:
    tables = ("workflows", "steps", "effects", "approvals", "events", "streams", "budgets")
    with psycopg.connect(url) as conn:
        return {
            t: conn.execute(f"SELECT count(*) FROM durable.{t}").fetchone()[0]  # type: ignore[index]
            for t in tables
        }


def test_an_import_of_ids_that_exist_refuses_and_leaves_nothing(
    database_url: str, here: str, pg_databases: TemplateDatabases
) -> None:
    app = make_app()
    run_trip(database_url, app, "trip-1")
    with durable.Client(database_url) as there:
        data = there.export_workflow("trip-1", children=True)
    with durable.Client(here) as client:
        client.import_workflow(data)
        before = count_rows(here)
        with pytest.raises(errors.ImportConflictError) as caught:
            client.import_workflow(data)
        assert caught.value.workflow_ids == ["trip-1", "trip-1:child:7"]
        assert count_rows(here) == before

    # One id taken among several (the child's, in a third database): the root is not
    # imported either.
    with durable.Client(database_url) as there:
        child_alone = there.export_workflow("trip-1:child:7")
    third = pg_databases.create()
    try:
        with durable.Client(third) as client:
            client.import_workflow(child_alone)
            before = count_rows(third)
            with pytest.raises(errors.ImportConflictError) as caught:
                client.import_workflow(data)
            assert caught.value.workflow_ids == ["trip-1:child:7"]
            assert count_rows(third) == before
            with pytest.raises(errors.WorkflowNotFoundError):
                client.get_workflow("trip-1")
    finally:
        pg_databases.drop(third)


def test_what_an_import_cannot_read_is_refused(database_url: str, here: str) -> None:
    app = make_app()
    with durable.Engine(database_url, registry=app.registry) as engine:
        engine.start(app.workflows["work"], 1, workflow_id="w").result(timeout=10)
        data = engine.client.export_workflow("w")
    with durable.Client(database_url) as there:
        with pytest.raises(errors.WorkflowNotFoundError):
            there.export_workflow("nope")
    cases: list[tuple[Any, type[errors.DurableError], str]] = [
        ({"workflows": []}, errors.ExportFormatError, "not a durable export"),
        ({**data, "durable_export": 2}, errors.ExportFormatError, "export format 2, newer"),
        ({**data, "labels_version": 99}, errors.JournalVersionError, "version 99"),
        (
            {**data, "tables": {**data["tables"], "steps": [{"workflow_id": "other"}]}},
            errors.ExportFormatError,
            "'other'",
        ),
        (
            {**data, "tables": {**data["tables"], "mystery": []}},
            errors.ExportFormatError,
            "mystery",
        ),
        ({**data, "workflow_ids": ["w", "v"]}, errors.ExportFormatError, "workflow_ids"),
    ]
    with durable.Client(here) as client:
        for bad, error, match in cases:
            with pytest.raises(error, match=match):
                client.import_workflow(bad)
        assert client.list_workflows() == []


def with_rows(data: dict[str, Any], table: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {**data, "tables": {**data["tables"], table: rows}}


def test_an_export_of_a_newer_schema_or_with_rows_this_database_cannot_take_is_refused(
    database_url: str, here: str
) -> None:
    """Refused with a typed error that names the problem, and nothing imported: not a
    column dropped without a word, not a psycopg error."""
    app = make_app()
    run_trip(database_url, app, "trip-1")
    with durable.Client(database_url) as there:
        data = there.export_workflow("trip-1", children=True)
    steps = data["tables"]["steps"]
    effects = data["tables"]["effects"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({**data, "schema_version": data["schema_version"] + 1}, "schema is at migration"),
        ({**data, "schema_version": "20"}, "not a migration number"),
        (with_rows(data, "steps", [{**steps[0], "color": "red"}, *steps[1:]]), r"\['color'\]"),
        (with_rows(data, "steps", [*steps, steps[2]]), "two rows with the same key"),
        (with_rows(data, "effects", [*effects, effects[0]]), "two rows with the same key"),
        (with_rows(data, "steps", [{**steps[0], "created_at": "soon"}]), "'steps' rows"),
        (with_rows(data, "steps", [{**steps[0], "step_name": None}]), "step_name"),
        # Journal rows no run writes (the table has no CHECK for them: the import looks).
        (with_rows(data, "steps", [{**steps[0], "kind": "stepp"}]), "kind 'stepp'"),
        (with_rows(data, "steps", [{**steps[0], "kind": ["step"]}]), r"kind \['step'\]"),
        (with_rows(data, "steps", [{**steps[0], "step_seq": -1}]), "not a number from 0"),
        (with_rows(data, "steps", [{**steps[0], "attempts": 0}]), "attempts 0"),
        (
            with_rows(data, "steps", [{**steps[0], "output": "1", "error": "{}"}]),
            "both an output and an error",
        ),
    ]
    with durable.Client(here) as client:
        for bad, match in cases:
            with pytest.raises(errors.ExportFormatError, match=match):
                client.import_workflow(bad)
            assert count_rows(here) == dict.fromkeys(count_rows(here), 0)
        # The export as written still imports whole.
        assert client.import_workflow(data) == ["trip-1", "trip-1:child:7"]


def test_the_cli_refuses_an_export_with_a_duplicated_journal_row_in_its_words(
    database_url: str, here: str, subprocess_env: dict[str, str]
) -> None:
    app = make_app()
    with durable.Engine(database_url, registry=app.registry) as engine:
        engine.start(app.workflows["work"], 2, workflow_id="w").result(timeout=10)
        data = engine.client.export_workflow("w")
    doubled = with_rows(data, "steps", [*data["tables"]["steps"], data["tables"]["steps"][0]])
    done = cli(
        subprocess_env,
        "workflows",
        "import",
        "-",
        "--database-url",
        here,
        stdin=json.dumps(doubled),
    )
    assert done.returncode == 1
    assert "two rows with the same key" in done.stderr and "nothing was imported" in done.stderr
    assert "Traceback" not in done.stderr and "psycopg" not in done.stderr
    assert count_rows(here)["workflows"] == 0


def cli(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        input=stdin,
    )


def test_the_cli_exports_to_stdout_and_imports_a_file(
    database_url: str, here: str, subprocess_env: dict[str, str], tmp_path: Any
) -> None:
    app = make_app()
    run_trip(database_url, app, "trip-1")
    out = cli(
        subprocess_env,
        "workflows",
        "export",
        "trip-1",
        "--children",
        "--database-url",
        database_url,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)  # stdout is the JSON alone
    assert data["workflow_ids"] == ["trip-1", "trip-1:child:7"]
    assert "exported 2 workflow(s)" in out.stderr
    path = tmp_path / "wf.json"
    path.write_text(out.stdout)

    done = cli(subprocess_env, "workflows", "import", str(path), "--database-url", here)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["trip-1", "trip-1:child:7"]
    assert "imported 2 workflow(s), 0 unfinished" in done.stderr
    with durable.Client(here) as client:
        assert client.export_workflow("trip-1", children=True)["tables"] == data["tables"]

    again = cli(
        subprocess_env, "workflows", "import", "-", "--database-url", here, stdin=out.stdout
    )
    assert again.returncode == 1
    assert "already exist in this database" in again.stderr and again.stdout == ""
    broken = cli(subprocess_env, "workflows", "import", "-", "--database-url", here, stdin="{no")
    assert broken.returncode == 1 and "is not JSON" in broken.stderr
    missing = cli(subprocess_env, "workflows", "export", "nope", "--database-url", here)
    assert missing.returncode == 1 and "no workflow with id 'nope'" in missing.stderr
