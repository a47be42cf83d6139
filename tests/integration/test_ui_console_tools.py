"""The console's list sorted by a column and paged by offset, a search that finds children,
the running step of a running workflow, and the workflow page's terminate, send, raise
budget and export, each a POST that needs the token and is audited as the console's; the
header names the database, its password hidden. Over a real database, through Starlette's
TestClient."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import durable
from durable.ui import TOKEN_HEADER, create_app

TOKEN = "c0nsole-tools-token-long-and-random-Qz8"
LOCAL = "127.0.0.1:8321"
SIGNED = {TOKEN_HEADER: TOKEN}

reg = durable.Registry()
release = threading.Event()
after_block: list[str] = []


@durable.step(registry=reg, name="tools.prepare")
def prepare(n: int) -> int:
    return n


@durable.step(registry=reg, name="tools.block")
def block() -> str:
    assert release.wait(30), "never released"
    return "released"


@durable.step(registry=reg, name="tools.after")
def after(tag: str) -> str:
    after_block.append(tag)
    return tag


@durable.workflow(registry=reg, name="tools.blocking")
def blocking(tag: str) -> str:
    prepare(1)
    block()
    return after(tag)


@durable.workflow(registry=reg, name="tools.child")
def child(n: int) -> int:
    return n * 2


@durable.workflow(registry=reg, name="tools.parent")
def parent(n: int) -> int:
    return child(n) + 1


@durable.workflow(registry=reg, name="tools.listener")
def listener() -> Any:
    return durable.recv("go", timeout=600)


@durable.workflow(registry=reg, name="tools.budgeted", budget=durable.Budget(steps=10))
def budgeted() -> int:
    return prepare(2)


def _named(letter: str) -> Any:
    def named(n: int) -> int:
        return n

    return durable.workflow(registry=reg, name=f"tools.{letter}")(named)


NAMED = {letter: _named(letter) for letter in "bac"}


@pytest.fixture
def engine(database_url: str) -> Iterator[durable.Engine]:
    release.clear()
    after_block.clear()
    with durable.Engine(database_url, registry=reg) as eng:
        yield eng
    release.set()


def _web(engine: durable.Engine) -> TestClient:
    return TestClient(create_app(engine.client, token=TOKEN), base_url=f"http://{LOCAL}")


def _rows(page: str) -> list[str]:
    return re.findall(r'<tr class="workflow" data-workflow="([^"]+)">', page)


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_list_sorts_by_a_column_and_pages_by_offset(engine: durable.Engine) -> None:
    for i, letter in enumerate("bac"):
        engine.start(NAMED[letter], i, workflow_id=f"sorted-{letter}").result(timeout=20)
    web = _web(engine)
    assert _rows(web.get("/workflows").text) == ["sorted-c", "sorted-a", "sorted-b"]  # newest
    by_name = web.get("/workflows?sort=name").text
    assert _rows(by_name) == ["sorted-a", "sorted-b", "sorted-c"]
    assert 'data-sort="name" href="/workflows?sort=-name"' in by_name  # a click turns it round
    assert _rows(web.get("/workflows?sort=-name").text) == ["sorted-c", "sorted-b", "sorted-a"]
    assert _rows(web.get("/workflows?sort=created").text) == ["sorted-b", "sorted-a", "sorted-c"]
    assert _rows(web.get("/workflows?sort=-updated").text)[0] == "sorted-c"
    assert len(_rows(web.get("/workflows?sort=status").text)) == 3

    first = web.get("/workflows?sort=name&limit=2").text
    assert _rows(first) == ["sorted-a", "sorted-b"] and "3 top-level workflows match" in first
    older = re.search(r'id="older" href="/workflows\?([^"]+)"', first)
    assert older is not None and "offset=2" in older.group(1)
    second = web.get("/workflows?" + older.group(1).replace("&amp;", "&")).text
    assert _rows(second) == ["sorted-c"]

    refused = web.get("/workflows?sort=colour")
    assert refused.status_code == 400 and "sort by created, updated, status, name" in refused.text
    with pytest.raises(durable.errors.ConfigurationError, match="after= pages the default"):
        engine.client.list_workflows(sort="name", after=(dt.datetime.now(dt.UTC), "x"))


def test_search_finds_children_by_default(engine: durable.Engine) -> None:
    engine.start(parent, 50, workflow_id="searched").result(timeout=20)
    web = _web(engine)
    [kid] = [w.workflow_id for w in engine.list_workflows(name="tools.child")]
    page = web.get("/workflows?q=100").text  # the child's output only
    assert _rows(page) == [kid] and "1 workflow matches" in page
    assert 'href="/workflows/searched"' in page  # its parent, linked


def test_a_running_workflow_shows_its_step_and_a_terminate_fences_it(
    engine: durable.Engine,
) -> None:
    handle = engine.start(blocking, "late", workflow_id="stuck-1")
    _until(lambda: len(engine.client.steps("stuck-1")) == 1, "never reached its second step")
    web = _web(engine)
    listed = web.get("/workflows").text
    assert re.search(r'class="running-step"[^>]*>at #1 after tools\.prepare, [^<]+</span>', listed)
    page = web.get("/workflows/stuck-1", headers=SIGNED).text
    assert re.search(r'id="running-step"[^>]*>at #1 after tools\.prepare, ', page)

    unconfirmed = web.post("/actions/terminate", data={"workflow_id": "stuck-1"}, headers=SIGNED)
    assert unconfirmed.status_code == 400 and "type the workflow&#39;s id" in unconfirmed.text
    assert engine.client.get_workflow("stuck-1").status is durable.WorkflowStatus.RUNNING

    form = {"workflow_id": "stuck-1", "confirm": "stuck-1", "reason": "runaway"}
    done = web.post("/actions/terminate", data=form, headers=SIGNED)
    assert done.status_code == 200 and "terminated stuck-1" in done.text
    assert engine.client.get_workflow("stuck-1").status is durable.WorkflowStatus.CANCELLED
    release.set()  # the step in flight returns: its record and all after it are refused
    with pytest.raises(durable.errors.WorkflowCancelledError):
        handle.result(timeout=20)
    time.sleep(0.5)
    assert after_block == []
    assert [s.step_name for s in engine.client.steps("stuck-1")] == ["tools.prepare"]
    assert engine.client.get_workflow("stuck-1").status is durable.WorkflowStatus.CANCELLED
    [row] = engine.client.audit_log("stuck-1")
    assert row["action"] == "terminate" and row["actor"].startswith("console ")
    again = web.post("/actions/terminate", data=form, headers=SIGNED)
    assert "nothing to terminate" in again.text


def test_a_message_is_sent_from_the_workflow_page(engine: durable.Engine) -> None:
    handle = engine.start(listener, workflow_id="ears-1")
    _until(
        lambda: engine.client.get_workflow("ears-1").status is durable.WorkflowStatus.SUSPENDED,
        "never waited",
    )
    web = _web(engine)
    page = web.get("/workflows/ears-1", headers=SIGNED).text
    assert 'action="/actions/send"' in page
    bad = {"workflow_id": "ears-1", "topic": "go", "body": "{not json"}
    refused = web.post("/actions/send", data=bad, headers=SIGNED)
    assert refused.status_code == 400 and "not JSON" in refused.text
    form = {"workflow_id": "ears-1", "topic": "go", "body": '{"ok": true, "n": [1, 2]}'}
    sent = web.post("/actions/send", data=form, headers=SIGNED)
    assert sent.status_code == 200 and "sent ears-1 a message on go" in sent.text
    assert handle.result(timeout=20) == {"ok": True, "n": [1, 2]}
    [row] = engine.client.audit_log("ears-1")
    assert row["action"] == "send" and row["actor"].startswith("console ")
    anonymous = web.post("/actions/send", data=form)  # no token, no CSRF: refused
    assert anonymous.status_code == 403


def test_the_budget_is_raised_from_the_workflow_page(engine: durable.Engine) -> None:
    engine.start(budgeted, workflow_id="spend-1").result(timeout=20)
    web = _web(engine)
    page = web.get("/workflows/spend-1", headers=SIGNED).text
    assert 'action="/actions/raise-budget"' in page
    empty = web.post("/actions/raise-budget", data={"workflow_id": "spend-1"}, headers=SIGNED)
    assert empty.status_code == 400 and "give an amount" in empty.text
    form = {"workflow_id": "spend-1", "steps": "5", "dollars": ""}
    raised = web.post("/actions/raise-budget", data=form, headers=SIGNED)
    assert raised.status_code == 200 and "by 5 steps" in raised.text
    budget = engine.client.budget("spend-1")
    assert budget is not None and budget["limits"]["steps"] == 15
    [row] = engine.client.audit_log("spend-1")
    assert row["action"] == "raise budget" and row["actor"].startswith("console ")


def test_a_workflow_is_exported_as_a_json_download(engine: durable.Engine) -> None:
    engine.start(parent, 7, workflow_id="carried").result(timeout=20)
    web = _web(engine)
    assert 'action="/export"' in web.get("/workflows/carried", headers=SIGNED).text
    answer = web.post("/export", data={"workflow_id": "carried", "children": "1"}, headers=SIGNED)
    assert answer.status_code == 200
    assert answer.headers["content-disposition"] == 'attachment; filename="carried.json"'
    data = json.loads(answer.text)
    stored = json.loads(json.dumps(engine.client.export_workflow("carried", children=True)))
    assert data | {"exported_at": None} == stored | {"exported_at": None}
    assert data["root"] == "carried" and len(data["workflow_ids"]) == 2  # the child too
    assert web.post("/export", data={"workflow_id": "carried"}).status_code == 403  # no token
    missing = web.post("/export", data={"workflow_id": "nobody"}, headers=SIGNED)
    assert missing.status_code == 404


def test_the_header_names_the_database_without_its_password(database_url: str) -> None:
    with_password = database_url + " password=hunter2-secret"
    assert "hunter2" in with_password  # trust authentication ignores it
    with durable.Client(with_password) as client:
        web = TestClient(create_app(client, token=TOKEN), base_url=f"http://{LOCAL}")
        page = web.get("/workflows").text
    header = re.search(r'<span class="database" id="database"[^>]*>([^<]+)</span>', page)
    assert header is not None and "hunter2" not in page
    [name] = re.findall(r"dbname=(\S+)", database_url)
    assert name in header.group(1)
