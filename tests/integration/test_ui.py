"""The web console over a real database, through Starlette's TestClient: pages render,
actions need the token and a CSRF token from one of its pages, a read-only console acts
for nobody, stored values are escaped, the first decision wins, and the list pages by
keyset."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import durable
from durable.testing import TemplateDatabases
from durable.ui import TOKEN_HEADER, create_app

TOKEN = "s3cret-token-for-the-console-tests-7Kq"
SCRIPT = "<script>alert('owned')</script>"
LOCAL = "127.0.0.1:8321"

reg = durable.Registry()


@durable.step(registry=reg, name="ui.prepare")
def prepare(note: str) -> dict[str, str]:
    return {"note": note}


@durable.workflow(registry=reg, name="ui.gated")
def gated(note: str) -> str:
    prepared = prepare(note)
    decision = durable.approval("ship", payload=prepared, timeout=3600)
    return f"{'shipped' if decision.approved else 'held'}: {decision.comment}"


@durable.workflow(registry=reg, name="ui.idle")
def idle(n: int) -> int:
    return n


@pytest.fixture
def engine(database_url: str) -> Iterator[durable.Engine]:
    with durable.Engine(database_url, registry=reg) as eng:
        yield eng


def _web(app: Any, host: str = LOCAL) -> TestClient:
    """A client whose requests reach the console on `host` (the address it is bound to)."""
    return TestClient(app, base_url=f"http://{host}")


def _at_gate(engine: durable.Engine, workflow_id: str, note: str = "hello") -> None:
    engine.start(gated, note, workflow_id=workflow_id)
    deadline = time.monotonic() + 20
    while not engine.list_approvals(workflow_id):
        assert time.monotonic() < deadline, "the workflow never reached its gate"
        time.sleep(0.05)


def _csrf(web: TestClient, path: str = "/approvals") -> str:
    """The CSRF token a page gives (its cookie; each form's hidden field carries it)."""
    page = web.get(path)
    assert page.status_code == 200
    csrf = web.cookies.get("durable_csrf")
    assert csrf, "the page set no CSRF cookie"
    return str(csrf)


def _decide(web: TestClient, workflow_id: str, decision: str, **extra: str) -> Any:
    form = {"workflow_id": workflow_id, "name": "ship", "decision": decision} | extra
    return web.post("/actions/decide", data=form)


def test_a_console_without_token_must_be_read_only(engine: durable.Engine) -> None:
    with pytest.raises(durable.errors.ConfigurationError, match="token"):
        create_app(engine.client)
    create_app(engine.client, read_only=True)


def test_every_page_renders(engine: durable.Engine) -> None:
    _at_gate(engine, "page-1")
    web = _web(create_app(engine.client, token=TOKEN))
    assert web.get("/", follow_redirects=False).headers["location"] == "/workflows"
    for path in ("/workflows", "/approvals", "/approvals?all=1", "/executors", "/queues"):
        page = web.get(path)
        assert page.status_code == 200, path
        assert "page-1" in page.text or path in ("/executors", "/queues"), path
    page = web.get("/workflows/page-1")
    assert page.status_code == 200
    assert "ui.prepare" in page.text and "SUSPENDED" in page.text and "ship" in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert web.get("/schedules").status_code == 200
    assert web.get("/workflows/nope").status_code == 404
    assert web.get("/static/console.css").status_code == 200


def test_approving_needs_the_token_then_the_workflow_finishes(engine: durable.Engine) -> None:
    _at_gate(engine, "tok-1")
    web = _web(create_app(engine.client, token=TOKEN))
    csrf = _csrf(web)
    assert _decide(web, "tok-1", "approve", csrf=csrf).status_code == 403
    refused = _decide(web, "tok-1", "approve", csrf=csrf, token="wrong")
    assert refused.status_code == 403 and "needs the console" in refused.text
    assert engine.list_approvals("tok-1")  # still waiting
    done = _decide(web, "tok-1", "approve", csrf=csrf, token=TOKEN, comment="ok", by="ana")
    assert done.status_code == 200 and "approved ship of tok-1" in done.text
    assert engine.retrieve("tok-1").result(timeout=20) == "shipped: ok"
    (gate,) = engine.list_approvals("tok-1", waiting_only=False)
    assert (gate["status"], gate["decided_by"]) == ("approved", "ana")


def test_posts_need_a_csrf_token_from_a_console_page(engine: durable.Engine) -> None:
    _at_gate(engine, "csrf-1")
    web = _web(create_app(engine.client, token=TOKEN))
    assert _decide(web, "csrf-1", "approve", token=TOKEN).status_code == 403  # no cookie
    csrf = _csrf(web)
    assert _decide(web, "csrf-1", "approve", token=TOKEN, csrf="forged").status_code == 403
    elsewhere = web.post(
        "/actions/decide",
        data={"workflow_id": "csrf-1", "name": "ship", "decision": "approve"}
        | {"token": TOKEN, "csrf": csrf},
        headers={"origin": "https://evil.example"},
    )
    assert elsewhere.status_code == 403 and "another origin" in elsewhere.text
    assert engine.list_approvals("csrf-1")  # nothing was decided
    # A script sends the token in a header (which no other site's page can set): no CSRF.
    scripted = _web(create_app(engine.client, token=TOKEN)).post(
        "/actions/decide",
        data={"workflow_id": "csrf-1", "name": "ship", "decision": "deny"},
        headers={TOKEN_HEADER: TOKEN},
    )
    assert scripted.status_code == 200
    assert engine.retrieve("csrf-1").result(timeout=20) == "held: None"


def test_a_read_only_console_shows_no_forms_and_refuses_every_action(
    engine: durable.Engine,
) -> None:
    _at_gate(engine, "ro-1")
    web = _web(create_app(engine.client, read_only=True))
    inbox = web.get("/approvals")
    assert "ro-1" in inbox.text and '<form class="action"' not in inbox.text
    assert "read-only" in inbox.text
    assert '<form class="action"' not in web.get("/workflows/ro-1").text
    refused = web.post(
        "/actions/decide",
        data={"workflow_id": "ro-1", "name": "ship", "decision": "approve"},
        headers={TOKEN_HEADER: TOKEN},
    )
    assert refused.status_code == 403 and "read-only" in refused.text
    assert engine.list_approvals("ro-1")


def test_stored_markup_is_shown_as_text(engine: durable.Engine) -> None:
    _at_gate(engine, "xss-1", note=SCRIPT)
    engine.start(idle, 1, workflow_id=SCRIPT).result(timeout=10)
    web = _web(create_app(engine.client, token=TOKEN))
    for path in ("/workflows", "/workflows/xss-1", "/approvals"):
        page = web.get(path)
        assert "<script>alert" not in page.text, path
        assert "&lt;script&gt;alert(" in page.text, path
    listed = web.get("/workflows")
    assert 'href="/workflows/%3Cscript%3Ealert' in listed.text  # the id, quoted in its link


def test_the_first_decision_wins(engine: durable.Engine) -> None:
    _at_gate(engine, "first-1")
    web = _web(create_app(engine.client, token=TOKEN))
    csrf = _csrf(web)
    assert _decide(web, "first-1", "approve", csrf=csrf, token=TOKEN).status_code == 200
    again = _decide(web, "first-1", "approve", csrf=csrf, token=TOKEN)
    assert again.status_code == 200  # the same decision twice is harmless
    second = _decide(web, "first-1", "deny", csrf=csrf, token=TOKEN)
    assert second.status_code == 409
    assert "already decided (approved)" in second.text and "first decision wins" in second.text
    assert engine.retrieve("first-1").result(timeout=20) == "shipped: None"


def test_cancel_resume_fork_and_schedules(engine: durable.Engine) -> None:
    _at_gate(engine, "act-1")
    engine.schedule("nightly", idle, "0 3 * * *")
    web = _web(create_app(engine.client, token=TOKEN))
    csrf = _csrf(web, "/workflows/act-1")
    forked = web.post(
        "/actions/fork",
        data={"workflow_id": "act-1", "from_step": "1", "token": TOKEN, "csrf": csrf},
    )
    assert forked.status_code == 200 and "forked act-1 from step 1" in forked.text
    cancel = {"workflow_id": "act-1", "reason": "test", "token": TOKEN, "csrf": csrf}
    assert web.post("/actions/cancel", data=cancel).status_code == 200
    with pytest.raises(durable.errors.WorkflowCancelledError):
        engine.retrieve("act-1").result(timeout=20)
    resumed = web.post("/actions/resume", data=cancel)
    assert resumed.status_code == 200 and "resumed act-1" in resumed.text
    pause = {"name": "nightly", "paused": "1", "token": TOKEN, "csrf": csrf}
    assert web.post("/actions/schedule", data=pause).status_code == 200
    assert [s["paused"] for s in engine.client.list_schedules()] == [True]
    assert "Resume" in web.get("/schedules", headers={TOKEN_HEADER: TOKEN}).text
    delete = {"name": "nightly", "token": TOKEN, "csrf": _csrf(web, "/schedules")}
    assert web.post("/actions/delete-schedule", data=delete).status_code == 200
    assert engine.client.list_schedules() == []
    assert web.post("/actions/delete-schedule", data=delete).status_code == 400
    missing = web.post("/actions/resume", data=cancel | {"workflow_id": "nope"})
    assert missing.status_code == 404


def test_resume_of_a_succeeded_workflow_says_nothing_was_resumed(
    engine: durable.Engine,
) -> None:
    assert engine.start(idle, 7, workflow_id="done-1").result(timeout=20) == 7
    web = _web(create_app(engine.client, token=TOKEN))
    csrf = _csrf(web, "/workflows/done-1")
    form = {"workflow_id": "done-1", "token": TOKEN, "csrf": csrf}
    page = web.post("/actions/resume", data=form)
    assert page.status_code == 200
    assert "done-1 already succeeded: nothing to resume" in page.text
    assert "resumed done-1" not in page.text


def test_the_list_pages_by_keyset_and_filters(database_url: str) -> None:
    with durable.Client(database_url) as client:
        for i in range(120):
            client.submit(idle, i, workflow_id=f"batch-{i:03d}")
        client.submit(gated, "x", workflow_id="other-1")
        web = _web(create_app(client, read_only=True))
        seen: list[str] = []
        path = "/workflows?name=ui.idle"
        first = web.get(path).text
        assert "120 top-level workflows match; showing 50" in first  # counted past the page
        while path:
            page = web.get(path)
            assert page.status_code == 200
            seen += re.findall(r'<td><a href="/workflows/[^"]+">([^<]+)</a></td>', page.text)
            older = re.search(r'id="older" href="([^"]+)"', page.text)
            path = older.group(1).replace("&amp;", "&") if older else ""
        assert len(seen) == 120 and set(seen) == {f"batch-{i:03d}" for i in range(120)}

        everything = client.list_workflows(limit=1000)
        assert len(everything) == 121
        keys = [(w.created_at, w.workflow_id) for w in everything]
        assert keys == sorted(keys, reverse=True)
        first = client.list_workflows(limit=50)
        rest = client.list_workflows(limit=100, after=(first[-1].created_at, first[-1].workflow_id))
        assert [w.workflow_id for w in first + rest] == [w.workflow_id for w in everything]

        assert len(client.list_workflows(id_prefix="batch-11")) == 10
        assert [w.workflow_id for w in client.list_workflows(id_prefix="oth")] == ["other-1"]
        assert client.list_workflows(id_prefix="batch-1200") == []
        assert len(client.list_workflows(status="PENDING", name="ui.gated")) == 1
        now = dt.datetime.now(dt.UTC)
        hour = dt.timedelta(hours=1)
        assert len(client.list_workflows(created_from=now - hour, created_to=now + hour)) == 100
        assert client.list_workflows(created_from=now + hour) == []
        page = web.get("/workflows?id=other&status=pending&from=2000-01-01T00:00")
        assert "other-1" in page.text and "batch-" not in page.text
        assert web.get("/workflows?from=yesterday").status_code == 400


def test_the_older_link_keeps_the_page_size(database_url: str) -> None:
    with durable.Client(database_url) as client:
        for i in range(7):
            client.submit(idle, i, workflow_id=f"size-{i}")
        web = _web(create_app(client, read_only=True))
        sizes: list[int] = []
        path = "/workflows?limit=3&name=ui.idle"
        while path:
            page = web.get(path)
            assert page.status_code == 200
            sizes.append(len(re.findall(r'<td><a href="/workflows/size-', page.text)))
            older = re.search(r'id="older" href="([^"]+)"', page.text)
            path = older.group(1).replace("&amp;", "&") if older else ""
            newest = re.search(r'href="(/workflows\?[^"]*)">newest', page.text)
            assert newest is None or "limit=3" in newest.group(1)
        assert sizes == [3, 3, 1]


def test_a_page_asked_for_under_another_host_name_is_refused(engine: durable.Engine) -> None:
    """A DNS-rebinding page reaches a console bound to 127.0.0.1 under the page's own name,
    which its requests carry in the Host header: over loopback, the console answers only to
    the names of loopback (whatever the port, so an SSH tunnel still works)."""
    engine.start(idle, 7, workflow_id="secret-1").result(timeout=10)
    web = _web(create_app(engine.client, token=TOKEN))
    for host in ("evil.example:8321", "evil.example", "127.0.0.1.evil.example:8321", "x:y:z"):
        page = web.get("/workflows/secret-1", headers={"host": host})
        assert page.status_code == 400, host
        assert "secret-1" not in page.text and "Host" in page.text, host
    assert web.get("/workflows", headers={"host": "evil.example"}).status_code == 400
    for host in ("127.0.0.1:8321", "localhost:8321", "LOCALHOST", "127.0.0.2:9000", "[::1]:8321"):
        assert web.get("/workflows/secret-1", headers={"host": host}).status_code == 200, host
    acted = web.post(
        "/actions/cancel",
        data={"workflow_id": "secret-1"},
        headers={"host": "evil.example:8321", TOKEN_HEADER: TOKEN},
    )
    assert acted.status_code == 400
    # Behind a reverse proxy on the same machine: its public name is allowed by name, and
    # pages asked for under that name need the token (the proxy serves the network).
    proxied = _web(create_app(engine.client, token=TOKEN, allowed_hosts=["console.example.com"]))
    named = {"host": "console.example.com"}
    assert proxied.get("/workflows/secret-1", headers=named).status_code == 401
    allowed = proxied.get("/workflows/secret-1", headers=named | {TOKEN_HEADER: TOKEN})
    assert allowed.status_code == 200 and "secret-1" in allowed.text
    assert proxied.get("/workflows", headers={"host": "evil.example"}).status_code == 400
    assert proxied.get("/workflows").status_code == 200  # over loopback, as itself
    for wrong in ("console.example.com", ["http://console.example.com/"], [""]):
        with pytest.raises(durable.errors.ConfigurationError, match="allowed_hosts"):
            create_app(engine.client, token=TOKEN, allowed_hosts=wrong)


def test_beyond_loopback_every_page_needs_the_token(engine: durable.Engine) -> None:
    """A request that came in on an address other than loopback (or that the console was
    told to guard, as `durable ui --host 0.0.0.0` does) is answered only with the token: by
    a session signed in with it, in the X-Durable-Token header, as a Bearer token, or as the
    password of Basic authentication."""
    engine.start(idle, 7, workflow_id="secret-2").result(timeout=10)
    app = create_app(engine.client, token=TOKEN)
    lan = _web(app, host="192.0.2.10:8321")
    paths = ("/workflows", "/workflows/secret-2", "/approvals", "/executors", "/queues")
    for path in (*paths, "/schedules"):
        refused = lan.get(path)
        assert refused.status_code == 401, path
        assert "ui.idle" not in refused.text, path  # nothing of the workflow: a sign-in form
        assert 'action="/signin"' in refused.text, path
    for auth in ("Basic !!!", "Basic " + "bm8tY29sb24=", "Bearer wrong", "Basic w6k6w6k="):
        assert lan.get("/workflows", headers={"authorization": auth}).status_code == 401, auth
    bearer = lan.get("/workflows", headers={"authorization": "Bearer " + TOKEN})
    assert bearer.status_code == 200 and "secret-2" in bearer.text
    assert lan.get("/workflows", auth=("anyone", "wrong")).status_code == 401
    assert "secret-2" in lan.get("/workflows", auth=("anyone", TOKEN)).text
    assert lan.get("/workflows/secret-2", headers={TOKEN_HEADER: TOKEN}).status_code == 200
    assert lan.get("/workflows", headers={TOKEN_HEADER: "wrong"}).status_code == 401

    guarded = _web(create_app(engine.client, token=TOKEN, reads_need_token=True))
    assert guarded.get("/workflows").status_code == 401
    assert guarded.get("/workflows", auth=("", TOKEN)).status_code == 200

    bare = create_app(engine.client, read_only=True)
    assert _web(bare).get("/workflows").status_code == 200
    far = _web(bare, host="192.0.2.10:8321").get("/workflows")
    assert far.status_code == 403 and "token" in far.text and "secret-2" not in far.text
    read_only = _web(create_app(engine.client, read_only=True, token=TOKEN), host="192.0.2.10:8321")
    assert read_only.get("/workflows", auth=("", TOKEN)).status_code == 200
    for guarded_without_token in ({"reads_need_token": True}, {"allowed_hosts": ["a.example"]}):
        with pytest.raises(durable.errors.ConfigurationError, match="need a token"):
            create_app(engine.client, read_only=True, **guarded_without_token)


def test_hostile_requests_get_a_page_not_a_server_error(engine: durable.Engine) -> None:
    engine.start(idle, 1, workflow_id="h-1").result(timeout=10)
    web = _web(create_app(engine.client, token=TOKEN))
    for path in ("/workflows/%00", "/workflows/" + "x" * 600, "/workflows/%C3%A9" * 200):
        page = web.get(path)
        assert page.status_code == 404, path[:40]
        assert "no workflow" in page.text, path[:40]
    csrf = _csrf(web, "/workflows/h-1")
    for forged in ("é", "\x00", csrf + "é"):
        refused = web.post(
            "/actions/cancel", data={"workflow_id": "h-1", "token": TOKEN, "csrf": forged}
        )
        assert refused.status_code == 403 and "CSRF" in refused.text, forged
    refused = _web(create_app(engine.client, token=TOKEN)).post(
        "/actions/cancel",
        data={"workflow_id": "h-1", "token": TOKEN, "csrf": "é"},
        headers={"cookie": "durable_csrf=é".encode()},
    )
    assert refused.status_code == 403
    form = {"token": TOKEN, "csrf": csrf}
    missing = web.post("/actions/fork", data=form | {"workflow_id": "h-1"})
    assert missing.status_code == 400 and "from_step" in missing.text and "missing" in missing.text
    maybe = web.post("/actions/schedule", data=form | {"name": "nightly", "paused": "maybe"})
    assert maybe.status_code == 400 and "paused" in maybe.text
    for back in ("/\\evil.example", "/\t/evil.example", "//evil.example", "https://evil.example"):
        answer = web.post("/actions/resume", data=form | {"workflow_id": "nope", "back": back})
        assert answer.status_code == 404
        assert "evil.example" not in answer.text, back
    huge = web.post(
        "/actions/cancel",
        content=f"csrf={csrf}&token={TOKEN}&workflow_id=h-1&reason=".encode() + b"r" * 2_000_000,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert huge.status_code == 413
    keyset = web.get("/workflows?after_at=2020-01-01T00:00")
    assert keyset.status_code == 400 and "after_id" in keyset.text


def test_a_lost_database_is_answered_503(pg_databases: TemplateDatabases) -> None:
    """The database dropped under a running console: the page, the list and an action each
    answer 503 (a fresh database each, since once the pool knows the server is gone a
    request waits out its checkout timeout first)."""
    requests: dict[str, Callable[[TestClient, str], Any]] = {
        "page": lambda web, csrf: web.get("/workflows/gone-1"),
        "list": lambda web, csrf: web.get("/workflows"),
        "action": lambda web, csrf: web.post(
            "/actions/cancel", data={"workflow_id": "gone-1", "token": TOKEN, "csrf": csrf}
        ),
    }
    for what, send in requests.items():
        url = pg_databases.create()
        with durable.Client(url) as client:
            client.submit(idle, 1, workflow_id="gone-1")
            web = _web(create_app(client, token=TOKEN))
            csrf = _csrf(web, "/workflows/gone-1")
            pg_databases.drop(url)
            answer = send(web, csrf)
            assert answer.status_code == 503, what
            assert "database" in answer.text and "bad filter" not in answer.text, what


def test_an_id_prefix_is_matched_by_code_points() -> None:
    from durable._client.reading import _prefix_end

    assert _prefix_end("ab") == "ac"
    assert _prefix_end("a\U0010ffff") == "b"
    assert _prefix_end("\ud7ff") == "\ue000"


def test_the_list_benchmark_runs_at_a_tiny_size(pg_databases: TemplateDatabases) -> None:
    from benchmarks import ui_list

    results = ui_list.main(["--n", "3000", "--repeats", "2", "--admin-url", pg_databases.admin_url])
    assert {r["case"] for r in results} >= {"first page", "GET /workflows"}
    assert all(r["median_ms"] > 0 for r in results)
