"""Version routing that never strands work silently: a workflow whose (name, version) no
live worker has is shown as waiting for that version (the Client, `durable workflows list`
and `show`, the console, the worker's log), and an operator moves it to another version on
purpose (`resume(id, version=...)`, `durable workflows resume ID --version V`, `fork(...,
version=...)`): a worker of that version replays its journal as any recovery does.

Every deploy of `order` makes the same durable calls (step `order.a`, a message on "go",
step `order.b`) except `3`, whose first step has another name; `RAN` records each step
that really ran, as "<version>:<step>", so a test sees what replayed and what ran again.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

import durable
from durable import errors
from durable.ui import create_app

RAN: list[str] = []
FAIL_B: set[str] = set()  # versions whose step b raises


def _deploy(version: str | None, first: str = "order.a") -> tuple[durable.Registry, Any]:
    """One deploy of `order` (version None: declared without one)."""
    registry = durable.Registry()
    tag = version or "none"

    @durable.step(registry=registry, name=first)
    def a(order_id: str) -> int:
        RAN.append(f"{tag}:a")
        return 100

    @durable.step(registry=registry, name="order.b")
    def b(order_id: str, amount: int) -> int:
        RAN.append(f"{tag}:b")
        if tag in FAIL_B:
            raise ValueError("b failed")
        return amount + 1

    @durable.workflow(registry=registry, name="order", version=version)
    def order(order_id: str) -> int:
        amount = a(order_id)
        durable.recv("go", timeout=3600)
        return b(order_id, amount)

    return registry, order


REG_1, ORDER_1 = _deploy("1")
REG_2, ORDER_2 = _deploy("2")
REG_3, ORDER_3 = _deploy("3", first="order.other")  # incompatible with 1's journals
REG_NONE, ORDER_NONE = _deploy(None)
QUEUE = durable.Queue("orders", registry=REG_1)

quick_registry = durable.Registry()


@durable.workflow(registry=quick_registry, name="quick", version="1")
def quick() -> int:
    return 7


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RAN.clear()
    FAIL_B.clear()
    yield


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _suspended_on_1(url: str, workflow_id: str) -> None:
    """Run `order@1` until it waits for its message (step a journaled); its engine then
    goes away, so no live worker has version 1."""
    ran = len(RAN)
    with durable.Engine(url, registry=REG_1) as engine:
        handle = engine.start(ORDER_1, workflow_id, workflow_id=workflow_id)
        _wait_for(lambda: handle.status() == "SUSPENDED", "the run to wait for its message")
    assert RAN[ran:] == ["1:a"]


def _stranded_on_1(url: str, workflow_id: str) -> None:
    """An `order@1` run that can go on (its message came) but has no worker of version 1:
    PENDING, with step a journaled."""
    _suspended_on_1(url, workflow_id)
    with durable.Client(url) as client:
        client.send(workflow_id, "go", topic="go")
        assert client.get_workflow(workflow_id).status is durable.WorkflowStatus.PENDING


@contextmanager
def _worker(url: str, registry: durable.Registry) -> Iterator[durable.Engine]:
    with durable.Engine(url, registry=registry, worker=True, poll_interval=0.05) as engine:
        yield engine


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "COLUMNS": "250"},
    )


def _row(url: str, workflow_id: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        cur = conn.execute(
            "SELECT status, version, epoch, owner, queue_name, wake_at FROM durable.workflows"
            " WHERE workflow_id = %s",
            [workflow_id],
        )
        row = cur.fetchone()
        assert row is not None and cur.description is not None
        return dict(zip([c.name for c in cur.description], row, strict=True))


def _journal(url: str, workflow_id: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT step_seq, step_name, output, error FROM durable.steps"
            " WHERE workflow_id = %s ORDER BY step_seq",
            [workflow_id],
        ).fetchall()


# -- shown as waiting for its version ---------------------------------------------------------


def test_a_workflow_no_live_worker_serves_is_shown_waiting_for_its_version(
    database_url: str, subprocess_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    _stranded_on_1(database_url, "o-wait")
    _suspended_on_1(database_url, "o-asleep")  # waits for its message, not for a worker
    caplog.set_level(logging.WARNING, logger="durable.worker")
    url = ("--database-url", database_url)
    with _worker(database_url, REG_2), durable.Client(database_url) as client:
        listed = {i.workflow_id: i for i in client.list_workflows()}
        assert listed["o-wait"].waiting_for_worker is True
        assert listed["o-asleep"].waiting_for_worker is False
        wait = client.worker_wait("o-wait")
        assert (wait["waiting"], wait["version"], wait["live_versions"]) == (True, "1", ["2"])

        table = _cli(subprocess_env, "workflows", "list", *url)
        assert table.returncode == 0, table.stderr
        assert "waits for worker" in table.stdout

        def last_cell(workflow_id: str) -> str:
            (line,) = [x for x in table.stdout.splitlines() if f" {workflow_id} " in x]
            return line.split("│")[-2].strip()

        assert (last_cell("o-wait"), last_cell("o-asleep")) == ("order@1", "")
        assert "durable workflows resume ID --version V" in table.stdout
        rows = json.loads(_cli(subprocess_env, "workflows", "list", "--json", *url).stdout)
        flags = {r["workflow_id"]: r["waiting_for_worker"] for r in rows}
        assert flags == {"o-wait": True, "o-asleep": False}

        shown = _cli(subprocess_env, "workflows", "show", "o-wait", *url)
        assert shown.returncode == 0, shown.stderr
        assert "waiting for a worker with order@1; live workers serve order@2" in shown.stdout
        assert "durable workflows resume o-wait --version V" in shown.stdout
        as_json = _cli(subprocess_env, "workflows", "show", "o-wait", "--json", *url)
        data = json.loads(as_json.stdout)
        assert (data["waiting_for_worker"], data["live_versions"]) == (True, ["2"])
        quiet = _cli(subprocess_env, "workflows", "show", "o-asleep", *url)
        assert "waiting for a worker" not in quiet.stdout

        web = TestClient(create_app(client, read_only=True), base_url="http://127.0.0.1:8321")
        page = web.get("/workflows")
        assert page.status_code == 200
        (cell,) = re.findall(r"<tr[^>]*>\s*<td><a[^>]*>o-wait</a>.*?</tr>", page.text, re.DOTALL)
        assert "waits for a worker with order@1" in cell
        (other,) = re.findall(r"<tr[^>]*>\s*<td><a[^>]*>o-asleep</a>.*?</tr>", page.text, re.DOTALL)
        assert "waits for a worker" not in other
        detail = web.get("/workflows/o-wait").text
        assert "waiting for a worker with order@1;\nlive workers serve order@2" in detail
        assert "waiting for a worker" not in web.get("/workflows/o-asleep").text

        # The worker's own log line names the version waited for and its own.
        def warned() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "durable.worker"]

        _wait_for(lambda: any("o-wait" in m for m in warned()), "the worker's warning")
        (message,) = [m for m in warned() if "o-wait" in m]
        assert "waits for a worker that has order@1; this one has order@2" in message
        assert "durable workflows resume o-wait --version V" in message
        assert not any("o-asleep" in m for m in warned())
    with durable.Client(database_url) as client:
        wait = client.worker_wait("o-wait")
        assert (wait["waiting"], wait["live_versions"]) == (True, [])
    gone = _cli(subprocess_env, "workflows", "show", "o-wait", *url)
    assert "waiting for a worker with order@1; no live worker serves any version of order" in (
        gone.stdout
    )


def test_the_list_marks_waiting_rows_in_its_one_statement(database_url: str) -> None:
    with durable.Client(database_url) as client:
        for i in range(30):
            client.submit(ORDER_1, f"n-{i}", workflow_id=f"n-{i}")
        before = client.db.counters.statements
        infos = client.list_workflows(limit=100)
        assert client.db.counters.statements - before == 1
        assert len(infos) == 30 and all(i.waiting_for_worker for i in infos)
        web = TestClient(create_app(client, read_only=True), base_url="http://127.0.0.1:8321")
        before = client.db.counters.statements
        assert web.get("/workflows").text.count("waits for a worker with order@1") == 30
        # The page's statements: the list, with its waiting marks, and the children to
        # fold under its rows (the first page holds every match, so it is its own count).
        assert client.db.counters.statements - before == 2
    with _worker(database_url, REG_1), durable.Client(database_url) as client:
        assert not any(i.waiting_for_worker for i in client.list_workflows(limit=100))


# -- moved on purpose ---------------------------------------------------------------------------


def test_resume_version_on_the_command_line_moves_it_and_a_worker_of_it_replays(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    _stranded_on_1(database_url, "o-cli")
    epoch = _row(database_url, "o-cli")["epoch"]
    with _worker(database_url, REG_2) as worker:
        moved = _cli(
            subprocess_env, "workflows", "resume", "o-cli", "--version", "2",
            "--database-url", database_url,
        )  # fmt: skip
        assert moved.returncode == 0, moved.stderr
        assert "moved o-cli to order@2: a worker with order@2 will pick it up" in moved.stdout
        assert worker.retrieve("o-cli").result(timeout=30) == 101
    assert RAN == ["1:a", "2:b"]  # a was replayed from the journal: it ran once, on 1
    row = _row(database_url, "o-cli")
    assert (row["status"], row["version"]) == ("SUCCESS", "2")
    assert row["epoch"] == epoch + 1  # the claim's bump only: a pending row is not fenced
    names = [r[1] for r in _journal(database_url, "o-cli")]
    assert names[0] == "order.a" and names[-1] == "order.b"


def test_the_client_moves_an_interrupted_run_whose_worker_is_gone(database_url: str) -> None:
    _stranded_on_1(database_url, "o-lapsed")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable.workflows SET status = 'RUNNING', owner = 'gone-worker',"
            " epoch = epoch + 1, lease_expires_at = now() - interval '1 minute'"
            " WHERE workflow_id = 'o-lapsed'"
        )
    lapsed = _row(database_url, "o-lapsed")
    with durable.Client(database_url) as client:
        assert client.worker_wait("o-lapsed")["waiting"]
        handle = client.resume("o-lapsed", version="2")
    row = _row(database_url, "o-lapsed")
    # Released and fenced: the old owner, were it alive, would write nothing more.
    assert (row["status"], row["version"], row["owner"]) == ("PENDING", "2", None)
    assert row["epoch"] == lapsed["epoch"] + 1
    with _worker(database_url, REG_2) as worker:
        assert worker.retrieve(handle.workflow_id).result(timeout=30) == 101
    assert RAN == ["1:a", "2:b"]


def test_a_stopped_workflow_is_resumed_under_another_version_by_the_engine(
    database_url: str,
) -> None:
    FAIL_B.add("1")
    with durable.Engine(database_url, registry=REG_1) as engine:
        handle = engine.start(ORDER_1, "o-failed", workflow_id="o-failed")
        _wait_for(lambda: handle.status() == "SUSPENDED", "the run to wait for its message")
        engine.send("o-failed", "go", topic="go")
        with pytest.raises(errors.WorkflowFailedError, match="b failed"):
            handle.result(timeout=30)
    with durable.Engine(database_url, registry=REG_2) as engine:
        assert engine.resume("o-failed", version="2").result(timeout=30) == 101
    assert RAN == ["1:a", "1:b", "2:b"]  # the failed call ran again, on 2; a replayed
    assert _row(database_url, "o-failed")["version"] == "2"


def test_a_move_to_code_that_does_not_match_the_journal_fails_it_untouched(
    database_url: str,
) -> None:
    _stranded_on_1(database_url, "o-wrong")
    journal = _journal(database_url, "o-wrong")
    with durable.Client(database_url) as client:
        client.resume("o-wrong", version="3")
    with _worker(database_url, REG_3) as worker:
        with pytest.raises(errors.WorkflowFailedError) as failed:
            worker.retrieve("o-wrong").result(timeout=30)
    assert failed.value.error_type == "durable.errors.NondeterminismError"
    assert "'order.a'" in failed.value.error_message
    row = _row(database_url, "o-wrong")
    assert (row["status"], row["version"]) == ("ERROR", "3")
    assert _journal(database_url, "o-wrong") == journal
    assert RAN == ["1:a"]  # nothing of 3 ran


def test_a_move_to_no_version_is_claimed_by_a_worker_without_one(database_url: str) -> None:
    _stranded_on_1(database_url, "o-plain")
    with durable.Client(database_url) as client:
        client.resume("o-plain", version="")
        assert client.get_workflow("o-plain").version is None
    with _worker(database_url, REG_NONE) as worker:
        assert worker.retrieve("o-plain").result(timeout=30) == 101
    assert RAN == ["1:a", "none:b"]


def test_a_waiting_workflow_keeps_its_status_its_queue_and_its_wake_up(database_url: str) -> None:
    _suspended_on_1(database_url, "o-sleeping")
    asleep = _row(database_url, "o-sleeping")
    with durable.Client(database_url) as client:
        client.enqueue(QUEUE, ORDER_1, "o-queued", workflow_id="o-queued")
        queued = _row(database_url, "o-queued")
        client.resume("o-sleeping", version="2")
        client.resume("o-queued", version="2")
    row = _row(database_url, "o-sleeping")
    assert row == asleep | {"version": "2"}  # same status, epoch, wake-up
    assert _row(database_url, "o-queued") == queued | {"version": "2"}  # still in its queue
    with _worker(database_url, REG_2) as worker, durable.Client(database_url) as client:
        client.send("o-sleeping", "go", topic="go")
        assert worker.retrieve("o-sleeping").result(timeout=30) == 101
    assert RAN == ["1:a", "2:b"]


# -- refused, nothing changed ----------------------------------------------------------------


def test_a_live_run_a_success_and_an_undone_workflow_are_not_moved(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with durable.Engine(database_url, registry=quick_registry) as engine:
        assert engine.start(quick, workflow_id="q-done").result(timeout=30) == 7
    _stranded_on_1(database_url, "o-live")
    _stranded_on_1(database_url, "o-undone")
    RAN.clear()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable.workflows SET status = 'RUNNING', owner = 'busy-worker',"
            " epoch = epoch + 1, lease_expires_at = now() + interval '1 hour'"
            " WHERE workflow_id = 'o-live'"
        )
        conn.execute(
            "UPDATE durable.workflows SET status = 'COMPENSATED', finished_at = now()"
            " WHERE workflow_id = 'o-undone'"
        )
    before = {w: _row(database_url, w) for w in ("q-done", "o-live", "o-undone")}
    with durable.Client(database_url) as client:
        with pytest.raises(errors.WorkflowNotMovableError, match="lease is live") as live:
            client.resume("o-live", version="2")
        assert (live.value.status, live.value.version) == ("RUNNING", "2")
        with pytest.raises(errors.WorkflowNotMovableError, match=r"SUCCEEDED.*fork"):
            client.resume("q-done", version="2")
        with pytest.raises(errors.WorkflowNotMovableError, match="SUCCEEDED"):
            client.resume("q-done", version="")
        with pytest.raises(errors.WorkflowNotResumableError, match="COMPENSATED"):
            client.resume("o-undone", version="2")
        with pytest.raises(errors.InvalidNameError):
            client.resume("o-live", version="x" * 600)
        # Without a version, resume stays as it was: a success gives its handle.
        assert client.resume("q-done").result(timeout=5) == 7
    refused = _cli(
        subprocess_env, "workflows", "resume", "q-done", "--version", "2",
        "--database-url", database_url,
    )  # fmt: skip
    assert refused.returncode == 1 and "cannot be moved to version '2'" in refused.stderr
    assert {w: _row(database_url, w) for w in before} == before


# -- forks to another version --------------------------------------------------------------------


def test_a_fork_is_recorded_under_the_version_given(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    _stranded_on_1(database_url, "o-orig")
    with _worker(database_url, REG_2) as worker:
        handle = worker.fork("o-orig", from_step=1, new_id="o-fork", version="2")
        assert worker.get_workflow("o-fork").version == "2"
        worker.send("o-fork", "go", topic="go")
        assert handle.result(timeout=30) == 101
        forked = _cli(
            subprocess_env, "workflows", "fork", "o-orig", "--from-step", "1",
            "--new-id", "o-fork-2", "--version", "2", "--database-url", database_url,
        )  # fmt: skip
        assert forked.returncode == 0, forked.stderr
        assert worker.get_workflow("o-fork-2").version == "2"
        assert worker.get_workflow("o-orig").version == "1"
    assert RAN == ["1:a", "2:b"]  # the fork replayed a from the copied journal
    assert _row(database_url, "o-orig")["status"] == "PENDING"  # the original is untouched
