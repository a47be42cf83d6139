"""The console's guard over a real database, through Starlette's TestClient: a 401 names a
scheme the console takes (Bearer), wrong tokens are throttled per client address and in
all (429 with Retry-After, the right token included, until the window passes on the
client's clock), a weak token is refused where others can reach the console, and each
action is recorded in the audit log as the console's client address and session, whatever
the form says."""

from __future__ import annotations

import html
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import durable
from durable import FakeClock
from durable.ui import TOKEN_HEADER, create_app
from durable.ui._auth import FAILURE_WINDOW_SECONDS, FAILURES_OVERALL, FAILURES_PER_ADDRESS

TOKEN = "a-long-random-console-token-Zq81xVw2"
LOCAL = "127.0.0.1:8321"
LAN = "192.0.2.10:8321"

reg = durable.Registry()


@durable.workflow(registry=reg, name="sec.gated")
def gated(note: str) -> str:
    decision = durable.approval("ship", payload={"note": note}, timeout=3600)
    return "shipped" if decision.approved else "held"


@pytest.fixture
def engine(database_url: str) -> Iterator[durable.Engine]:
    with durable.Engine(database_url, registry=reg) as eng:
        yield eng


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def client(database_url: str, clock: FakeClock) -> Iterator[durable.Client]:
    with durable.Client(database_url, clock=clock) as c:
        yield c


def _from(app: Any, address: str, host: str = LAN) -> TestClient:
    """A browser or script at `address` reaching the console bound on `host`."""
    return TestClient(app, base_url=f"http://{host}", client=(address, 50000))


def _sign_in(web: TestClient, token: str) -> Any:
    assert web.get("/signin").status_code == 200  # sets the CSRF cookie
    form = {"csrf": web.cookies.get("durable_csrf"), "token": token, "next": "/workflows"}
    return web.post("/signin", data=form, follow_redirects=False)


def test_a_401_names_a_scheme_the_console_takes(client: durable.Client) -> None:
    web = _from(create_app(client, token=TOKEN), "198.51.100.1")
    refused = web.get("/workflows")
    assert refused.status_code == 401 and 'action="/signin"' in refused.text
    assert refused.headers["www-authenticate"] == 'Bearer realm="durable console"'
    assert web.get("/workflows", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    wrong = web.get("/workflows", headers={"authorization": "Bearer wrong"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"].startswith("Bearer")


def test_a_guesser_gets_429_until_the_window_passes(
    client: durable.Client, clock: FakeClock
) -> None:
    app = create_app(client, token=TOKEN, reads_need_token=True)
    guesser = _from(app, "198.51.100.7")
    for n in range(FAILURES_PER_ADDRESS):
        assert guesser.get("/workflows", headers={TOKEN_HEADER: f"guess-{n}"}).status_code == 401
    for attempt in (
        lambda: guesser.get("/workflows", headers={TOKEN_HEADER: TOKEN}),  # right, too late
        lambda: guesser.get("/workflows", auth=("anyone", TOKEN)),
        lambda: _sign_in(guesser, TOKEN),
    ):
        throttled = attempt()
        assert throttled.status_code == 429 and "too many wrong tokens" in throttled.text
        assert 0 < int(throttled.headers["retry-after"]) <= FAILURE_WINDOW_SECONDS
        assert "durable_session" not in guesser.cookies
    # Another address is not held back by this one's guesses.
    assert _from(app, "198.51.100.8").get("/workflows", headers={TOKEN_HEADER: TOKEN}).is_success
    clock.advance(FAILURE_WINDOW_SECONDS + 1)
    assert guesser.get("/workflows", headers={TOKEN_HEADER: TOKEN}).status_code == 200
    assert _sign_in(guesser, TOKEN).status_code == 303 and "durable_session" in guesser.cookies


def test_an_actions_token_field_is_throttled_too(client: durable.Client, clock: FakeClock) -> None:
    """Over loopback the pages are open and an action checks the token (a form's field)."""
    web = _from(create_app(client, token=TOKEN), "127.0.0.1", host=LOCAL)
    assert web.get("/approvals").status_code == 200  # sets the CSRF cookie
    form = {"workflow_id": "none", "name": "ship", "decision": "approve"}
    form |= {"csrf": str(web.cookies.get("durable_csrf"))}
    for n in range(FAILURES_PER_ADDRESS):
        assert web.post("/actions/decide", data=form | {"token": f"g{n}"}).status_code == 403
    throttled = web.post("/actions/decide", data=form | {"token": TOKEN})
    assert throttled.status_code == 429 and "retry-after" in throttled.headers
    clock.advance(FAILURE_WINDOW_SECONDS + 1)
    unknown = web.post("/actions/decide", data=form | {"token": TOKEN})
    assert unknown.status_code == 400 and "not done" in unknown.text  # let in: no such gate


def test_guesses_spread_over_addresses_are_throttled_in_all(
    client: durable.Client, clock: FakeClock
) -> None:
    app = create_app(client, token=TOKEN, reads_need_token=True)
    operator = _from(app, "203.0.113.5")
    assert _sign_in(operator, TOKEN).status_code == 303  # signed in before the attack
    per_address = FAILURES_PER_ADDRESS - 1  # each address stays under its own limit
    for n in range(FAILURES_OVERALL):
        address = f"198.51.100.{n // per_address + 10}"
        answer = _from(app, address).get("/workflows", auth=("anyone", f"g{n}"))
        assert answer.status_code == 401, n
    late = _from(app, "198.51.100.250").get("/workflows", headers={TOKEN_HEADER: TOKEN})
    assert late.status_code == 429 and int(late.headers["retry-after"]) > 0
    assert operator.get("/workflows").status_code == 200  # a session is no guess: not held back
    clock.advance(FAILURE_WINDOW_SECONDS + 1)
    again = _from(app, "198.51.100.250").get("/workflows", headers={TOKEN_HEADER: TOKEN})
    assert again.status_code == 200


def test_a_weak_token_is_refused_where_others_reach_the_console(
    client: durable.Client, database_url: str
) -> None:
    for weak in ("s3cret-token", "a" * 40, "abab" * 10):
        for beyond in ({"reads_need_token": True}, {"allowed_hosts": ["console.example.com"]}):
            with pytest.raises(durable.errors.WeakTokenError, match="token_urlsafe"):
                create_app(client, token=weak, **beyond)
    create_app(client, token="s3cret-token")  # over loopback only, and mounted apps: as before
    args = ["ui", "--host", "0.0.0.0", "--port", "0", "--token", "s3cret-token"]
    done = subprocess.run(
        [sys.executable, "-m", "durable.cli", *args, "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "too weak" in done.stderr and "secrets.token_urlsafe(32)" in done.stderr
    assert "durable console on" not in done.stderr  # refused before listening


def _at_gate(engine: durable.Engine, workflow_id: str) -> None:
    engine.start(gated, "hello", workflow_id=workflow_id)
    deadline = time.monotonic() + 20
    while not engine.list_approvals(workflow_id):
        assert time.monotonic() < deadline, "the workflow never reached its gate"
        time.sleep(0.05)


def test_a_console_action_is_recorded_as_its_client_and_session(engine: durable.Engine) -> None:
    _at_gate(engine, "sec-1")
    _at_gate(engine, "sec-2")
    app = create_app(engine.client, token=TOKEN)
    web = _from(app, "203.0.113.9", host=LOCAL)
    assert _sign_in(web, TOKEN).status_code == 303
    session = str(web.cookies.get("durable_session")).split(".")[1][:8]
    form = {"workflow_id": "sec-1", "reason": "stop it", "csrf": web.cookies.get("durable_csrf")}
    form |= {"actor": "mallory", "by": "mallory"}  # a form cannot say who acts
    assert web.post("/actions/cancel", data=form).status_code == 200
    script = _from(app, "203.0.113.10", host=LOCAL)
    decided = script.post(
        "/actions/decide",
        data={"workflow_id": "sec-2", "name": "ship", "decision": "deny", "by": "mallory"},
        headers={TOKEN_HEADER: TOKEN},
    )
    assert decided.status_code == 200
    ((cancel,),) = [engine.client.audit_log("sec-1", action="cancel")]
    assert cancel["actor"] == f"console 203.0.113.9 session {session}"
    ((deny,),) = [engine.client.audit_log("sec-2")]
    assert (deny["action"], deny["actor"]) == ("deny", "console 203.0.113.10 token")
    page = web.get("/workflows/sec-1")
    assert 'id="audit"' in page.text and f"console 203.0.113.9 session {session}" in page.text
    log = web.get("/audit")
    assert log.status_code == 200 and "console 203.0.113.10 token" in log.text
    assert "mallory" not in log.text.split('id="audit"')[1]


def test_the_audit_page_pages_back_through_rows_of_one_instant(client: durable.Client) -> None:
    """Sixty rows written by one statement share their time: the older link's keyset (time,
    id) still gives each row once."""
    from durable._client import audit as _audit

    entries = [(f"w-{n:02}", "cancel", None, None) for n in range(60)]
    client.db.atomically(lambda tx: _audit.record(tx, "ana", entries))
    web = _from(create_app(client, token=TOKEN), "127.0.0.1", host=LOCAL)
    seen: list[str] = []
    page = web.get("/audit")
    while True:
        assert page.status_code == 200
        seen += re.findall(r'href="/workflows/(w-\d\d)"', page.text)
        older = re.search(r'id="older" href="([^"]+)"', page.text)
        if older is None:
            break
        page = web.get(html.unescape(older.group(1)))
    assert sorted(seen) == [w for w, *_ in entries]
    assert web.get("/audit?before_at=2026-01-01").status_code == 400


def test_a_weak_token_does_not_guard_a_console_reached_beyond_loopback(
    client: durable.Client,
) -> None:
    app = create_app(client, token="x")  # mounted: the app does not know where it is served
    lan = _from(app, "198.51.100.7")
    # A guesser needs a few dozen tries for a one-character token, under the throttle's 100.
    assert lan.get("/workflows", headers={TOKEN_HEADER: "x"}).status_code != 200
    # Refused whatever it presents, with the fix; loopback clients are still served.
    refused = lan.get("/workflows", headers={TOKEN_HEADER: "x"})
    assert refused.status_code == 403 and "secrets.token_urlsafe(32)" in html.unescape(refused.text)
    local = _from(app, "127.0.0.1", host=LOCAL)
    assert local.get("/workflows", headers={TOKEN_HEADER: "x"}).status_code == 200
