"""The console as an operator uses it, over a real database through Starlette's TestClient:
signing in once (a session cookie bound to the token, a wrong token never remembered,
signing out), actions offered only where the status allows them, the step timeline with
durations written for people, the list's folded children, counts and search, dead
executors hidden unless asked, and an inbox that shows each gate's context."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

import durable
from durable.ui import TOKEN_HEADER, create_app
from durable.ui._timeline import human_duration

TOKEN = "op3rator-token-long-and-random-Vb7Yq2"
LOCAL = "127.0.0.1:8321"
SIGNED = {TOKEN_HEADER: TOKEN}

reg = durable.Registry()
flaky_calls: dict[str, int] = {}


@durable.step(registry=reg, name="op.prepare")
def prepare(note: str) -> dict[str, str]:
    return {"note": note}


@durable.step(registry=reg, name="op.flaky", retries=2, initial_delay=0.01)
def flaky(key: str) -> str:
    flaky_calls[key] = flaky_calls.get(key, 0) + 1
    if flaky_calls[key] == 1:
        raise RuntimeError("the first call fails")
    return "ok"


@durable.workflow(registry=reg, name="op.gated")
def gated(note: str) -> str:
    prepared = prepare(note)
    durable.state.set({"stage": "prepared", "note": note})
    decision = durable.approval("ship", payload=prepared, timeout=3600)
    return f"{'shipped' if decision.approved else 'held'}"


@durable.tool(registry=reg, name="op.lookup")
def lookup(sku: str) -> str:
    return sku.upper()


@durable.workflow(registry=reg, name="op.leaf")
def leaf(n: int) -> int:
    return n * 2


@durable.workflow(registry=reg, name="op.tree")
def tree(sku: str) -> str:
    flaky(sku)
    durable.sleep(0.01)
    leaf(1)
    leaf(2)
    lookup(sku)
    return f"packed {sku}"


@pytest.fixture
def engine(database_url: str) -> Iterator[durable.Engine]:
    with durable.Engine(database_url, registry=reg) as eng:
        yield eng


def _web(app: Any, host: str = LOCAL) -> TestClient:
    return TestClient(app, base_url=f"http://{host}")


def _at_gate(engine: durable.Engine, workflow_id: str, note: str = "hello") -> None:
    engine.start(gated, note, workflow_id=workflow_id)
    deadline = time.monotonic() + 20
    while not engine.list_approvals(workflow_id):
        assert time.monotonic() < deadline, "the workflow never reached its gate"
        time.sleep(0.05)


def _sign_in(web: TestClient, token: str, next_path: str = "/approvals") -> Any:
    assert web.get("/signin").status_code == 200  # sets the CSRF cookie
    csrf = web.cookies.get("durable_csrf")
    form = {"csrf": csrf, "token": token, "next": next_path}
    return web.post("/signin", data=form, follow_redirects=False)


def _decide(web: TestClient, workflow_id: str, **extra: str) -> Any:
    form = {"workflow_id": workflow_id, "name": "ship", "decision": "approve"} | extra
    return web.post("/actions/decide", data=form)


def test_signing_in_once_lets_a_browser_act_until_it_signs_out(engine: durable.Engine) -> None:
    _at_gate(engine, "sign-1")
    _at_gate(engine, "sign-2")
    app = create_app(engine.client, token=TOKEN)
    web = _web(app)
    inbox = web.get("/approvals")
    assert '<form class="action"' not in inbox.text and "Sign in</a> to decide" in inbox.text

    wrong = _sign_in(web, "not-it")
    assert wrong.status_code == 403 and "not the token" in wrong.text
    assert "durable_session" not in wrong.headers.get("set-cookie", "")
    assert "durable_session" not in web.cookies
    forged = web.post("/signin", data={"csrf": "forged", "token": TOKEN}, follow_redirects=False)
    assert forged.status_code == 403 and "CSRF" in forged.text
    assert "durable_session" not in web.cookies

    for elsewhere in ("https://evil.example/", "//evil.example", "/signin"):
        landed = _sign_in(_web(app), TOKEN, elsewhere)
        assert landed.headers["location"] == "/workflows", elsewhere
    right = _sign_in(web, TOKEN)
    assert right.status_code == 303 and right.headers["location"] == "/approvals"
    cookie = right.headers["set-cookie"]
    assert cookie.startswith("durable_session=") and TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    session = web.cookies["durable_session"]

    signed_in = web.get("/approvals")
    assert '<form class="action"' in signed_in.text and 'type="password"' not in signed_in.text
    assert 'id="signout"' in signed_in.text
    csrf = web.cookies["durable_csrf"]
    assert _decide(web, "sign-1").status_code == 403  # CSRF is still required
    done = _decide(web, "sign-1", csrf=csrf, by="ana")  # no token field: the session acts
    assert done.status_code == 200 and "approved ship of sign-1" in done.text
    assert engine.retrieve("sign-1").result(timeout=20) == "shipped"

    # Reached beyond loopback, the session opens the pages too.
    lan = _web(app, host="192.0.2.10:8321")
    assert lan.get("/approvals").status_code == 401
    lan.cookies.set("durable_session", session)
    assert lan.get("/approvals").status_code == 200

    # A cookie is bound to the token: tampered with, or checked by a console given another
    # token, it opens nothing.
    for bad in (session[:-1] + ("0" if session[-1] != "0" else "1"), "1.2.3", "", TOKEN):
        other = _web(app)
        other.cookies.set("durable_session", bad)
        csrf_other = other.get("/signin") and other.cookies["durable_csrf"]
        assert _decide(other, "sign-2", csrf=csrf_other).status_code == 403, bad
    rotated = _web(create_app(engine.client, token="a-new-token-after-a-rotation-Kp5xW2"))
    rotated.cookies.set("durable_session", session)
    assert 'id="signout"' not in rotated.get("/approvals").text
    rotated_csrf = rotated.cookies["durable_csrf"]
    assert _decide(rotated, "sign-2", csrf=rotated_csrf).status_code == 403
    assert engine.list_approvals("sign-2")  # still waiting

    out = web.post("/signout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303 and 'durable_session=""' in out.headers["set-cookie"]
    assert "durable_session" not in web.cookies
    replayed = _web(app)  # the signed-out cookie, kept by someone: revoked
    replayed.cookies.set("durable_session", session)
    replayed.get("/approvals")
    assert _decide(replayed, "sign-2", csrf=replayed.cookies["durable_csrf"]).status_code == 403
    assert engine.list_approvals("sign-2")


def test_a_read_only_console_signs_in_only_to_read_beyond_loopback(
    engine: durable.Engine,
) -> None:
    web = _web(create_app(engine.client, read_only=True))
    assert web.get("/signin").status_code == 404
    assert "Sign in" not in web.get("/workflows").text
    guarded = create_app(engine.client, read_only=True, token=TOKEN)
    lan = _web(guarded, host="192.0.2.10:8321")
    asked = lan.get("/workflows")
    assert asked.status_code == 401 and 'action="/signin"' in asked.text
    assert _sign_in(lan, TOKEN, "/workflows").status_code == 303
    page = lan.get("/workflows")
    assert page.status_code == 200 and 'id="signout"' in page.text
    assert '<form class="action"' not in page.text  # reading only


def _forms(page: str) -> list[str]:
    return re.findall(r'action="/actions/([\w-]+)"', page)


def test_actions_are_offered_only_where_the_status_allows_them(engine: durable.Engine) -> None:
    engine.start(leaf, 3, workflow_id="done-1").result(timeout=20)
    _at_gate(engine, "waits-1")
    _at_gate(engine, "stopped-1")
    engine.cancel("stopped-1")
    deadline = time.monotonic() + 20
    while engine.client.get_workflow("stopped-1").status is not durable.WorkflowStatus.CANCELLED:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    web = _web(create_app(engine.client, token=TOKEN))
    assert _forms(web.get("/workflows/done-1", headers=SIGNED).text) == ["fork"]
    waits = web.get("/workflows/waits-1", headers=SIGNED).text
    assert _forms(waits) == ["pause", "cancel", "terminate", "fork", "send"]
    assert '<label for="fork-step">Fork, running again from step</label>' in waits
    assert '<option value="0">#0 op.prepare</option>' in waits
    assert _forms(web.get("/workflows/stopped-1", headers=SIGNED).text) == ["resume", "fork"]
    # Not signed in: no forms, a way to sign in.
    anonymous = web.get("/workflows/waits-1").text
    assert _forms(anonymous) == [] and "Sign in</a> to pause, cancel, terminate" in anonymous
    # Asked anyway (a script), a cancel of a finished workflow says so.
    answer = web.post("/actions/cancel", data={"workflow_id": "done-1"}, headers=SIGNED)
    assert "done-1 already finished (SUCCESS): nothing to cancel" in answer.text


def test_durations_are_written_for_people() -> None:
    assert human_duration(0.00032133700005942956) == "0.32 ms"
    assert human_duration(0.0123456) == "12.3 ms"
    assert human_duration(0.3204) == "320 ms"
    assert human_duration(0.0) == "0 ms"
    assert human_duration(0.000001) == "<0.01 ms"
    assert human_duration(1.5) == "1.5 s"
    assert human_duration(42.06) == "42.1 s"
    assert human_duration(125) == "2 min 5 s"
    assert human_duration(3 * 3600 + 120) == "3 h 2 min"
    assert human_duration(2 * 86400 + 3600) == "2 d 1 h"


def test_the_workflow_page_draws_a_step_timeline(engine: durable.Engine) -> None:
    assert engine.start(tree, "sku-9", workflow_id="tree-1").result(timeout=30) == "packed sku-9"
    _at_gate(engine, "gate-tl")
    web = _web(create_app(engine.client, token=TOKEN))
    page = web.get("/workflows/tree-1").text
    timeline = page[page.index('id="timeline"') : page.index("</table>", page.index("timeline"))]
    kinds = re.findall(r'<tr class="bar-row (bar-\w+)" data-kind="(\w+)">', timeline)
    assert kinds == [
        ("bar-step", "step"),
        ("bar-wait", "sleep"),
        ("bar-child", "child"),
        ("bar-child", "child"),
        ("bar-step", "tool"),
    ]
    assert "\N{MULTIPLICATION SIGN}2" in timeline  # the flaky step ran twice
    assert 'href="/workflows/tree-1%3Achild%3A2"' in timeline or "tree-1:child" in timeline
    bars = re.findall(r'<rect class="bar [\w-]+" x="(\d+)" y="2" width="(\d+)"', timeline)
    assert len(bars) == 5 and all(0 <= int(x) and int(x) + int(w) <= 1000 for x, w in bars)
    assert [int(x) for x, _ in bars] == sorted(int(x) for x, _ in bars)  # in time order
    total = re.search(r'<span class="muted total" id="total">([^<]+)</span>', page)
    assert total and re.fullmatch(r"[\d.]+ (ms|s)", total.group(1)), total
    # No duration anywhere on the page has more than two decimals (the tool call's latency,
    # stored as a double, included).
    assert "<h2>Tool calls</h2>" in page
    assert not re.search(r"\d\.\d{3,} ?(ms|s)\b", page)
    assert 'data-refresh="' not in page  # finished: nothing more to refresh

    waiting = web.get("/workflows/gate-tl").text
    assert 'data-kind="waiting"' in waiting and "so far" in waiting
    assert 'data-refresh="5"' in waiting  # not finished: the page refreshes itself


def test_the_list_folds_children_counts_and_searches(engine: durable.Engine) -> None:
    engine.start(tree, "needle-SKU", workflow_id="tree-a").result(timeout=30)
    engine.start(tree, "plain", workflow_id="tree-b").result(timeout=30)
    for i in range(3):
        engine.start(leaf, 100 + i, workflow_id=f"alone-{i}").result(timeout=20)
    web = _web(create_app(engine.client, token=TOKEN))

    def rows(page: str) -> list[str]:
        return re.findall(r'<tr class="workflow" data-workflow="([^"]+)">', page)

    page = web.get("/workflows").text
    assert set(rows(page)) == {"tree-a", "tree-b", "alone-0", "alone-1", "alone-2"}
    assert "5 top-level workflows match; showing 5" in page
    folded = re.findall(r'<li class="child" data-workflow="([^"]+)">', page)
    assert sorted(folded) == sorted(
        w.workflow_id for w in engine.list_workflows(name="op.leaf") if w.parent_id
    )
    assert len(folded) == 4 and "2 children</summary>" in page
    assert 'data-refresh="5"' in page

    flat = web.get("/workflows?children=1").text
    assert len(rows(flat)) == 9 and "9 workflows match" in flat

    found = web.get("/workflows?q=needle-sku").text  # inputs, case-insensitive
    assert rows(found) == ["tree-a"] and "1 workflow matches" in found
    assert rows(web.get("/workflows?q=PACKED%20plain").text) == ["tree-b"]  # the output
    assert rows(web.get("/workflows?q=204&children=1").text) == [
        w.workflow_id for w in engine.list_workflows(name="op.leaf") if w.output == "204"
    ]
    assert "no workflows match" in web.get("/workflows?q=nowhere").text

    client = engine.client
    assert client.count_workflows() == 9
    assert client.count_workflows(top_level=True) == 5
    assert client.count_workflows(cap=3) == 3
    assert client.count_workflows(search="needle") == 1
    assert client.count_workflows(name="op.leaf", search="10") == 3


def test_dead_executors_are_hidden_unless_asked(engine: durable.Engine, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.executors (executor_id, hostname, pid, started_at,"
            " heartbeat_at, capabilities, incarnation) VALUES ('gone-exec', 'old-host', 1,"
            " now() - interval '2 days', now() - interval '1 day', '[]', 'i0')"
        )
    web = _web(create_app(engine.client, token=TOKEN))
    page = web.get("/executors").text
    assert "gone-exec" not in page and "1 dead executor hidden" in page
    assert '<tr class="executor">' in page  # this engine, alive
    everything = web.get("/executors?all=1").text
    assert "gone-exec" in everything and "(dead)" in everything


def test_the_inbox_shows_each_gates_context_and_who_decided_when(
    engine: durable.Engine,
) -> None:
    _at_gate(engine, "ctx-1", note="<b>refund</b> 42")
    web = _web(create_app(engine.client, token=TOKEN))
    page = web.get("/approvals").text
    gate = page[page.index('data-workflow="ctx-1"') :]
    assert '<span class="workflow-name">op.gated</span>' in gate
    assert "SUSPENDED" in gate
    state = re.search(r'<pre class="state">(.*?)</pre>', gate, re.S)
    assert state and '"stage": "prepared"' in html.unescape(state.group(1))
    assert "&lt;b&gt;refund&lt;/b&gt; 42" in state.group(1)  # escaped
    steps = re.findall(r'<span class="step-name">([^<]+)</span>', gate)
    assert steps == ["op.prepare"]  # the state update is shown as the state, not a step

    engine.client.decide("ctx-1", "ship", True, comment="fine", decided_by="ana")
    assert engine.retrieve("ctx-1").result(timeout=20) == "shipped"
    assert "ctx-1" not in web.get("/approvals").text
    decided = web.get("/approvals?all=1").text
    found = re.search(
        r'<span class="decision-approved">approved</span> by <span class="decided-by">ana'
        r'</span> at <span class="decided-at">([\d-]+ [\d:]+) UTC</span>: <q>fine</q>',
        decided,
    )
    assert found, decided[decided.index('data-workflow="ctx-1"') :][:2000]
    inbox = engine.client.approval_inbox(waiting_only=False)
    assert [(g["workflow_name"], g["decided_by"]) for g in inbox] == [("op.gated", "ana")]


def test_the_workflow_page_pauses_and_unpauses_as_the_operator(engine: durable.Engine) -> None:
    _at_gate(engine, "held-1")
    deadline = time.monotonic() + 20
    while engine.client.get_workflow("held-1").status is not durable.WorkflowStatus.SUSPENDED:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    web = _web(create_app(engine.client, token=TOKEN))
    answer = web.post("/actions/pause", data={"workflow_id": "held-1"}, headers=SIGNED)
    assert "paused held-1" in answer.text
    page = web.get("/workflows/held-1", headers=SIGNED).text
    assert _forms(page) == ["unpause", "cancel", "terminate", "fork", "send"]
    assert "PAUSED" in page
    listed = web.get("/workflows?status=PAUSED", headers=SIGNED).text
    assert "held-1" in listed
    answer = web.post("/actions/unpause", data={"workflow_id": "held-1"}, headers=SIGNED)
    assert "unpaused held-1 (now PENDING)" in answer.text
    rows = engine.client.audit_log("held-1")
    assert [r["action"] for r in rows] == ["unpause", "pause"]
    assert all(r["actor"].startswith("console ") for r in rows)
    done = web.post("/actions/pause", data={"workflow_id": "nobody-1"}, headers=SIGNED)
    assert "nobody-1" in done.text  # refused, and said why
