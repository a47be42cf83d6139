"""Version routing that never strands work silently: a workflow whose (name, version) no
live worker has is shown as waiting for that version (the Client, `durable workflows list`
and `show`, the console, the worker's log).

Every deploy of `order` makes the same durable calls (step `order.a`, a message on "go",
step `order.b`); `RAN` records each step that really ran, as "<version>:<step>".
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

import pytest
from starlette.testclient import TestClient

import durable
from durable.ui import create_app

RAN: list[str] = []


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
        return amount + 1

    @durable.workflow(registry=registry, name="order", version=version)
    def order(order_id: str) -> int:
        amount = a(order_id)
        durable.recv("go", timeout=3600)
        return b(order_id, amount)

    return registry, order


REG_1, ORDER_1 = _deploy("1")
REG_2, ORDER_2 = _deploy("2")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RAN.clear()
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
        (cell,) = re.findall(r"<tr>\s*<td><a[^>]*>o-wait</a>.*?</tr>", page.text, re.DOTALL)
        assert "waits for a worker with order@1" in cell
        (other,) = re.findall(r"<tr>\s*<td><a[^>]*>o-asleep</a>.*?</tr>", page.text, re.DOTALL)
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
        assert client.db.counters.statements - before == 1
    with _worker(database_url, REG_1), durable.Client(database_url) as client:
        assert not any(i.waiting_for_worker for i in client.list_workflows(limit=100))
