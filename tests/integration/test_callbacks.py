"""Callback URLs over real HTTP (uvicorn on a free port, in a thread) and a real database:
a workflow mints a URL, hands it out in a step before it waits, a POST with no operator
token completes the wait (recv, an approval, a wait_first branch) with the posted JSON; a
second POST is 409 with the first outcome; a wrong token 404, an expired one 410, an
oversized body 413, a body that is not JSON 400. The token is stored nowhere in clear."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import uvicorn

import durable
from durable.errors import ConfigurationError
from durable.ui import create_app
from durable.ui._callbacks import create_callback_app

SECRET = "callback-secret-for-the-tests-0123456789"
TOKEN = "console-token-for-the-callback-tests-Zq81"

reg = durable.Registry()
HANDED_OUT: list[str] = []  # what the third party was given, by the step below


@durable.step(registry=reg, name="cb.hand_out")
def hand_out(url: str) -> None:
    HANDED_OUT.append(url)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@durable.workflow(registry=reg, name="cb.pay")
def pay(base: str) -> dict[str, Any]:
    url = durable.callback_url("payment", base_url=base)
    hand_out(url)  # the URL itself is stored nowhere: not in an event, not in the output
    paid = durable.recv("payment")
    return {"url": digest(url), "paid": paid}


@durable.workflow(registry=reg, name="cb.ship")
def ship(base: str) -> dict[str, Any]:
    url = durable.callback_url(approval="ship", base_url=base)
    durable.set_event("url", url)
    durable.recv("go")  # the gate is asked only after this
    decision = durable.approval("ship", payload={"order": 7})
    return {"approved": decision.approved, "comment": decision.comment, "by": decision.decided_by}


@durable.workflow(registry=reg, name="cb.first")
def first(base: str) -> Any:
    url = durable.callback_url("reply", base_url=base, expires_in=60)
    durable.set_event("url", url)
    winner = durable.wait_first([durable.on_message("reply"), durable.on_timer(3600)])
    return {"index": winner.index, "value": winner.value}


@durable.workflow(registry=reg, name="cb.pay_async")
async def pay_async(base: str) -> Any:
    url = await durable.callback_url_async("payment", base_url=base)
    await durable.to_thread(hand_out, url)
    return {"url": digest(url), "paid": await durable.recv_async("payment")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` on uvicorn, on a free loopback port, in a thread; yields its base URL."""
    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def post(url: str, body: bytes | Any) -> tuple[int, dict[str, Any], dict[str, str]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, json.loads(answer.read()), _lower(answer.headers)
    except urllib.error.HTTPError as exc:
        with exc:
            text = exc.read()
            try:
                value = json.loads(text or b"null")
            except ValueError:  # a page that is not one of the callbacks' (Not Found)
                value = text.decode()
            return exc.code, value, _lower(exc.headers)


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


@pytest.fixture
def clock() -> durable.FakeClock:
    return durable.FakeClock()


@pytest.fixture
def engine(
    database_url: str, clock: durable.FakeClock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[durable.Engine]:
    monkeypatch.setenv("DURABLE_CALLBACK_SECRET", SECRET)
    with durable.Engine(database_url, registry=reg, clock=clock) as eng:
        yield eng


def _url(engine: durable.Engine, workflow_id: str) -> str:
    url = engine.get_event(workflow_id, "url", timeout=20)
    assert isinstance(url, str), "the workflow never handed out its URL"
    return url


def _eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _stored_text(database_url: str) -> str:
    """Every row of durable's tables, as text."""
    with psycopg.connect(database_url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'durable'"
            ).fetchall()
        ]
        return "".join(
            str(conn.execute(f"SELECT array_agg(t::text) FROM durable.{t} AS t").fetchone())
            for t in tables
        )


def test_a_post_with_no_operator_token_completes_recv_with_the_posted_body(
    engine: durable.Engine, database_url: str
) -> None:
    # The console's app, where every page needs the operator token: a callback does not.
    console = create_app(engine, token=TOKEN, reads_need_token=True)
    with serving(console) as base:
        HANDED_OUT.clear()
        handle = engine.start(pay, base)
        _eventually(lambda: bool(HANDED_OUT), "the URL is handed out in a step")
        url = HANDED_OUT[0]
        assert url.startswith(base + "/callbacks/")
        status, body, headers = post(url, {"amount": 12, "currency": "EUR"})
        assert status == 200, body
        assert body["outcome"] == {"status": "delivered"}
        assert headers["cache-control"] == "no-store"
        # The replay after the wait hands out the same URL (its digest is the output).
        paid = {"amount": 12, "currency": "EUR"}
        assert handle.result(timeout=30) == {"url": digest(url), "paid": paid}
        assert HANDED_OUT == [url]  # the step is not run again
        again, second, _ = post(url, {"amount": 99})
        assert again == 409
        assert second["outcome"] == {"status": "delivered"}
        assert second["used_at"] == body["used_at"]
        # A console page still needs the operator token.
        with pytest.raises(urllib.error.HTTPError) as page:
            urllib.request.urlopen(base + "/workflows", timeout=10)
        page.value.close()
        assert page.value.code == 401
    token = url.rsplit("/", 1)[1]
    stored = _stored_text(database_url)
    assert token not in stored  # stored hashed, never in clear
    assert digest(token) in stored
    with psycopg.connect(database_url) as conn:
        minted = conn.execute("SELECT count(*) FROM durable.callbacks").fetchone()
    assert minted == (1,)  # the replay minted no second token


def test_a_console_mounted_under_a_prefix_serves_its_callbacks_and_a_read_only_one_none(
    engine: durable.Engine,
) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    console = create_app(engine, token=TOKEN, allowed_hosts=["ops.example.com"])
    read_only = create_app(engine, read_only=True)
    app = Starlette(routes=[Mount("/durable", app=console), Mount("/view", app=read_only)])
    with serving(app) as base:
        handle = engine.start(first, base + "/durable")
        url = _url(engine, handle.workflow_id)
        assert url.startswith(base + "/durable/callbacks/")
        token = url.rsplit("/", 1)[1]
        assert post(f"{base}/view/callbacks/{token}", {"x": 1})[0] == 404
        assert post(url, {"x": 1})[0] == 200
        assert handle.result(timeout=30) == {"index": 0, "value": {"x": 1}}


def test_an_async_workflow_awaits_its_url_and_gets_the_same_one_on_replay(
    engine: durable.Engine,
) -> None:
    with serving(create_callback_app(engine)) as base:
        HANDED_OUT.clear()
        handle = engine.start(pay_async, base)
        _eventually(lambda: bool(HANDED_OUT), "the URL is handed out in a step")
        url = HANDED_OUT[0]
        assert post(url, {"n": 1})[0] == 200
        assert handle.result(timeout=30) == {"url": digest(url), "paid": {"n": 1}}
        assert HANDED_OUT == [url]


def test_a_callback_decides_an_approval_once_the_workflow_asks_for_it(
    engine: durable.Engine,
) -> None:
    with serving(create_callback_app(engine)) as base:
        handle = engine.start(ship, base)
        url = _url(engine, handle.workflow_id)
        decision = {"approved": True, "comment": "paid in full", "by": "acme-payments"}
        # Not asked yet: nothing is spent, try again later.
        status, body, headers = post(url, decision)
        assert status == 503, body
        assert int(headers["retry-after"]) > 0
        engine.send(handle.workflow_id, "now", topic="go")
        _eventually(lambda: bool(engine.list_approvals(handle.workflow_id)), "the gate is asked")
        assert post(url, {"approved": "yes"})[0] == 400  # not a decision: nothing spent
        assert post(url, {"approved": True, "extra": 1})[0] == 400
        status, body, _ = post(url, decision)
        assert status == 200, body
        assert body["outcome"] == {"status": "approved"}
        assert handle.result(timeout=30) == {
            "approved": True,
            "comment": "paid in full",
            "by": "acme-payments",
        }
        status, body, _ = post(url, {"approved": False})
        assert (status, body["outcome"]) == (409, {"status": "approved"})
    assert any(
        e["actor"].startswith("callback ") and e["action"] == "approve"
        for e in engine.client.audit_log(handle.workflow_id)
    )


def test_a_callback_completes_a_wait_first_branch_once_among_concurrent_posts(
    engine: durable.Engine,
) -> None:
    with serving(create_callback_app(engine)) as base:
        handle = engine.start(first, base)
        url = _url(engine, handle.workflow_id)
        answers: list[tuple[int, Any]] = []

        def send(n: int) -> None:
            status, body, _ = post(url, ["reply", n])
            answers.append((status, body))

        threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(status for status, _ in answers) == [200, 409, 409, 409]
        result = handle.result(timeout=30)
        assert result["index"] == 0 and result["value"][0] == "reply"
        used = {body["used_at"] for _, body in answers}
        assert len(used) == 1  # every 409 names the one POST that won


def test_a_wrong_expired_oversized_or_malformed_post_is_refused(
    engine: durable.Engine, clock: durable.FakeClock
) -> None:
    with serving(create_callback_app(engine, max_body_bytes=1000)) as base:
        handle = engine.start(first, base)
        url = _url(engine, handle.workflow_id)
        token = url.rsplit("/", 1)[1]
        other = ("A" if token[0] != "A" else "B") + token[1:]  # well-formed, never minted
        unknown = post(f"{base}/callbacks/{other}", {"x": 1})
        malformed = post(f"{base}/callbacks/{token}x", {"x": 1})
        # The same answer whatever the token: nothing says whether a workflow exists.
        assert unknown[:2] == malformed[:2] == (404, {"error": "no such callback"})
        assert post(url, b"x" * 1001)[0] == 413
        assert post(url, b"not json")[0] == 400
        assert post(url, b"\xff\xfe")[0] == 400
        assert post(url, b'{"x": NaN}')[0] == 400
        clock.advance(61)  # past the URL's lifetime (60 s)
        status, body, _ = post(url, {"late": True})
        assert (status, body) == (410, {"error": "this callback has expired"})
        # Retention deletes it once expired for longer than finished_after: then a 404.
        engine.client.prune(durable.RetentionPolicy(finished_after=dt.timedelta(0)))
        assert post(url, {"late": True})[:2] == (404, {"error": "no such callback"})
        engine.cancel(handle.workflow_id)


def test_a_workflow_with_no_secret_mints_no_url(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DURABLE_CALLBACK_SECRET", raising=False)
    with durable.Engine(database_url, registry=reg) as eng:
        handle = eng.start(pay, "http://127.0.0.1:1")
        with pytest.raises(Exception, match="DURABLE_CALLBACK_SECRET"):
            handle.result(timeout=30)
    monkeypatch.setenv("DURABLE_CALLBACK_SECRET", "short")
    with pytest.raises(ConfigurationError, match="DURABLE_CALLBACK_SECRET"):
        durable.Engine(database_url, registry=reg)


@pytest.mark.citus
def test_callbacks_on_a_citus_cluster(citus_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The schema as `durable migrate --citus` leaves it: a POST spends the token on its
    # hash's shard and delivers on the workflow's (and audits on the log's), in one
    # two-phase transaction.
    monkeypatch.setenv("DURABLE_CALLBACK_SECRET", SECRET)
    with durable.Engine(citus_url, registry=reg) as engine:
        with serving(create_callback_app(engine)) as base:
            HANDED_OUT.clear()
            paying = engine.start(pay, base)
            _eventually(lambda: bool(HANDED_OUT), "the URL is handed out in a step")
            url = HANDED_OUT[0]
            assert post(url, {"amount": 5})[0] == 200
            assert paying.result(timeout=60)["paid"] == {"amount": 5}
            assert post(url, {"amount": 6})[0] == 409
            shipping = engine.start(ship, base)
            gate = _url(engine, shipping.workflow_id)
            engine.send(shipping.workflow_id, "now", topic="go")
            _eventually(lambda: bool(engine.list_approvals(shipping.workflow_id)), "the gate")
            assert post(gate, {"approved": False, "comment": "no"})[0] == 200
            assert shipping.result(timeout=60)["approved"] is False
