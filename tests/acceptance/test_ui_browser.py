"""The console in a real headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by Selenium), served by a real `durable ui` process, as an operator uses it:

- the inbox shows a waiting gate with its workflow's name, payload, state and last steps,
  and no way to act until the operator signs in; a wrong token is refused and leaves no
  cookie; the right one leaves an HttpOnly, SameSite=Strict session cookie that page
  scripts cannot read, and the operator approves with no token box, after which the gate
  says who decided when and the workflow finishes (checked in the database); signing out
  takes the forms away again;
- a workflow's page draws its step timeline (bars for steps, waits, retries and children,
  the total duration, durations written for people) and offers only the actions its status
  allows; while it waits, the open page refreshes itself when it finishes elsewhere,
  without losing the scroll position, and its Cancel button goes;
- the list shows top-level workflows with their children folded under them, counts and
  searches them, and refreshes itself when a new workflow starts; the executors page hides
  a dead executor until asked;
- a stored `<script>` is shown as text and never runs.

Outside CI the test skips when the browser is missing (`apt-get install -y chromium
chromium-driver`); under CI=true it fails. With DURABLE_UI_SCREENSHOTS=<dir> it saves the
screenshots of the list, a workflow page, the inbox and the sign-in page there (docs/
holds them).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import durable
from tests.acceptance.workers import scalar, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
TOKEN = "browser-token-7f3a"
SCRIPT = "<script>document.title='owned';alert('owned')</script>"

reg = durable.Registry()


@durable.step(registry=reg, name="shop.quote")
def quote(order: str, cents: int) -> dict[str, Any]:
    return {"order": order, "cents": cents}


@durable.step(registry=reg, name="shop.charge")
def charge(order: str) -> str:
    return f"charged {order}"


@durable.workflow(registry=reg, name="shop.refund", budget=durable.Budget(dollars=2))
def refund(order: str, cents: int, note: str) -> str:
    quoted = quote(order, cents)
    durable.state.set({"order": order, "stage": "quoted"})
    decision = durable.approval("refund-over-limit", payload=quoted | {"note": note})
    if not decision.approved:
        return "held"
    durable.state.set({"order": order, "stage": "approved"})
    return charge(order)


reserve_calls: dict[str, int] = {}


@durable.step(registry=reg, name="shop.reserve", retries=2, initial_delay=0.05)
def reserve(order: str) -> str:
    reserve_calls[order] = reserve_calls.get(order, 0) + 1
    if reserve_calls[order] == 1:
        raise RuntimeError("the warehouse timed out")
    return f"reserved {order}"


@durable.workflow(registry=reg, name="shop.pack")
def pack(order: str, box: int) -> str:
    return quote(order, box)["order"] + f" box {box}"


@durable.workflow(registry=reg, name="shop.order")
def order(order_id: str) -> str:
    reserve(order_id)
    durable.sleep(0.2)
    packed = [pack(order_id, 1), pack(order_id, 2)]
    charge(order_id)
    return ", ".join(packed)


@durable.workflow(registry=reg, name="shop.fails")
def fails(order: str) -> str:
    quote(order, 1)
    raise ValueError(f"no stock for {order}")


def _browser() -> Any:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if missing:
        message = (
            f"no headless browser: {', '.join(missing)} missing; run "
            "apt-get install -y chromium chromium-driver"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {message}")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,900")
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def console(database_url: str) -> Iterator[str]:
    """A `durable ui` process on a free port; yields its base URL."""
    port = _free_port()
    env = dict(os.environ, DURABLE_UI_TOKEN=TOKEN)
    args = ["ui", "--port", str(port), "--database-url", database_url]
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable.cli", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(base + "/workflows", timeout=2) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "durable ui never answered"
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def _status(url: str, workflow_id: str) -> object:
    return scalar(url, "SELECT status FROM durable.workflows WHERE workflow_id = %s", workflow_id)


def _shot(driver: Any, name: str, height: int = 900) -> None:
    shots = os.environ.get("DURABLE_UI_SCREENSHOTS")
    if shots:
        driver.set_window_size(1400, height)
        driver.save_screenshot(str(Path(shots) / name))
        driver.set_window_size(1400, 900)


def _sign_in(driver: Any, token: str) -> str:
    """Type a token into the sign-in page; the message it answers with ("" if none)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    form = driver.find_element(By.ID, "signin")
    field = form.find_element(By.NAME, "token")
    field.clear()
    field.send_keys(token)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    def answered(_: Any) -> bool:
        """The form is gone: the answer's page replaced it. (Chromedriver may say so with
        "Node ... does not belong to the document" rather than a stale element.)"""
        try:
            form.is_enabled()
        except WebDriverException:
            return True
        return False

    WebDriverWait(driver, 30).until(answered)
    wait_for(lambda: driver.execute_script("return document.readyState") == "complete", 30)
    found = driver.find_elements(By.ID, "message")
    return str(found[0].text) if found else ""


def _session_cookie(driver: Any) -> dict[str, Any] | None:
    return next((c for c in driver.get_cookies() if c["name"] == "durable_session"), None)


def _auto_refresh(driver: Any, on: bool) -> None:
    """Turn the page's auto-refresh on or off (the browser remembers it): off while the test
    holds elements of a page, which a refresh would replace."""
    from selenium.webdriver.common.by import By

    toggle = driver.find_element(By.ID, "auto-refresh")
    if toggle.is_selected() != on:
        toggle.click()
    assert toggle.is_selected() == on


def _text(driver: Any, selector: str) -> str | None:
    """An element's text, read in one script (a refresh may replace the element between
    finding it and reading it)."""
    found = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e && e.textContent.trim()",
        selector,
    )
    return None if found is None else str(found)


def _refreshed(driver: Any) -> int:
    return int(driver.execute_script("return Number(document.body.dataset.refreshed || 0)"))


def test_an_operator_signs_in_follows_a_workflow_and_approves_it(
    database_url: str, console: str
) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    driver = _browser()
    try:
        with durable.Engine(database_url, registry=reg) as engine:
            for i in range(3):
                engine.start(quote_only, i, workflow_id=f"quote-{i}").result(timeout=20)
            with pytest.raises(durable.errors.WorkflowFailedError):
                engine.start(fails, "o-13", workflow_id="order-13").result(timeout=20)
            assert engine.start(order, "o-7", workflow_id="order-7").result(timeout=30)
            engine.start(refund, "o-42", 4000, SCRIPT, workflow_id="refund-o-42")
            engine.start(refund, "o-43", 900, "small", workflow_id="refund-o-43")
            for gated in ("refund-o-42", "refund-o-43"):
                wait_for(lambda g=gated: engine.list_approvals(g), 30, "the gate")

            # The inbox, before signing in: each gate's context, and no way to act.
            driver.get(console + "/approvals")
            _auto_refresh(driver, False)
            gate = driver.find_element(By.CSS_SELECTOR, 'section.gate[data-workflow="refund-o-42"]')
            assert gate.find_element(By.CSS_SELECTOR, ".workflow-name").text == "shop.refund"
            assert SCRIPT in gate.find_element(By.CSS_SELECTOR, "pre.payload").text  # as text
            assert '"stage": "quoted"' in gate.find_element(By.CSS_SELECTOR, "pre.state").text
            last = gate.find_elements(By.CSS_SELECTOR, "ol.last-steps .step-name")
            assert [e.text for e in last] == ["shop.quote"]
            with pytest.raises(NoAlertPresentException):
                driver.switch_to.alert  # noqa: B018 (the script never ran)
            assert driver.title != "owned"
            assert not driver.find_elements(By.CSS_SELECTOR, "form.action")
            assert not driver.find_elements(By.CSS_SELECTOR, "input[type=password]")

            # Sign in: a wrong token is refused and remembered nowhere; the right one
            # leaves a session cookie that page scripts cannot read.
            driver.find_element(By.ID, "signin-link").click()
            _shot(driver, "console-signin.png", 500)
            refused = _sign_in(driver, "not-the-token")
            assert "refused" in refused and "not the token" in refused
            assert _session_cookie(driver) is None
            assert not driver.find_elements(By.ID, "signout")
            assert _sign_in(driver, TOKEN) == ""
            assert driver.current_url == console + "/approvals"  # back where it was
            cookie = _session_cookie(driver)
            assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            assert TOKEN not in cookie["value"]
            assert "durable_session" not in driver.execute_script("return document.cookie")
            assert driver.find_elements(By.ID, "signout")
            assert not driver.find_elements(By.CSS_SELECTOR, "input[type=password]")
            _shot(driver, "console-approvals.png", 1000)

            # Approve in the inbox: no token box, the session acts.
            gate = driver.find_element(By.CSS_SELECTOR, 'section.gate[data-workflow="refund-o-42"]')
            form = gate.find_element(By.CSS_SELECTOR, "form.action")
            form.find_element(By.NAME, "comment").send_keys("within policy")
            form.find_element(By.NAME, "by").send_keys("ana")
            form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
            wait_for(lambda: driver.find_elements(By.ID, "message"), 30, "the answer")
            message = driver.find_element(By.ID, "message").text
            assert message == "approved refund-over-limit of refund-o-42"
            wait_for(lambda: _status(database_url, "refund-o-42") == "SUCCESS", 30, "SUCCESS")
            assert engine.retrieve("refund-o-42").result(timeout=5) == "charged o-42"
            driver.get(console + "/approvals?all=1")
            decided = driver.find_element(
                By.CSS_SELECTOR, 'section.gate[data-workflow="refund-o-42"] .decided'
            ).text
            assert decided.startswith("approved by ana at ") and decided.endswith("within policy")

            # A waiting workflow's page: its timeline, only the actions its status allows;
            # it refreshes itself when the workflow finishes elsewhere, keeping the scroll.
            driver.set_window_size(1400, 500)
            driver.get(console + "/workflows/refund-o-43")
            buttons = [b.text for b in driver.find_elements(By.CSS_SELECTOR, "#actions button")]
            assert buttons == ["Pause", "Cancel", "Terminate", "Fork", "Send", "Export JSON"]
            fork_label = driver.find_element(By.CSS_SELECTOR, 'label[for="fork-step"]').text
            assert fork_label == "Fork, running again from step"
            kinds = [
                r.get_attribute("data-kind")
                for r in driver.find_elements(By.CSS_SELECTOR, "#timeline tr.bar-row")
            ]
            assert kinds == ["step", "state", "waiting"]
            _auto_refresh(driver, True)
            driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
            scrolled = int(driver.execute_script("return window.scrollY"))
            assert scrolled > 0
            engine.client.decide("refund-o-43", "refund-over-limit", True, decided_by="bo")
            wait_for(
                lambda: _text(driver, "h1 .status") == "SUCCESS",
                60,
                "the open page to show SUCCESS by itself",
            )
            assert _refreshed(driver) >= 1
            assert abs(int(driver.execute_script("return window.scrollY")) - scrolled) <= 2
            buttons = [b.text for b in driver.find_elements(By.CSS_SELECTOR, "#actions button")]
            assert buttons == ["Fork", "Export JSON"]  # no Cancel, no Resume on a SUCCESS one
            driver.set_window_size(1400, 900)

            # A finished workflow with a retried step, a sleep and two children.
            driver.get(console + "/workflows/order-7")
            rows = driver.find_elements(By.CSS_SELECTOR, "#timeline tr.bar-row")
            kinds = [r.get_attribute("data-kind") for r in rows]
            assert kinds == ["step", "sleep", "child", "child", "step"]
            assert (
                "\N{MULTIPLICATION SIGN}2" in rows[0].find_element(By.CSS_SELECTOR, "td.took").text
            )
            assert rows[2].find_element(By.LINK_TEXT, "order-7:child:2")
            took = [
                r.find_element(By.CSS_SELECTOR, "td.took").text.split(" \N{MULTIPLICATION SIGN}")[0]
                for r in rows
            ]
            human = r"(<0\.01 ms|\d{1,3}(\.\d{1,2})? (ms|s)|\d+ min \d+ s)"
            assert all(re.fullmatch(human, t) for t in took), took
            total = driver.find_element(By.ID, "total").text
            assert re.fullmatch(human, total), total
            sleep_bar = rows[1].find_element(By.CSS_SELECTOR, "rect")
            assert int(sleep_bar.get_attribute("width")) > 100  # the sleep is most of it
            _shot(driver, "console-workflow.png", 1100)

            # The list: top-level workflows, children folded under them, counted; it
            # refreshes itself when a workflow starts, and searches inputs and outputs.
            driver.get(console + "/workflows")
            _auto_refresh(driver, False)
            ids = [
                r.get_attribute("data-workflow")
                for r in driver.find_elements(By.CSS_SELECTOR, "#workflows tr.workflow")
            ]
            assert "order-7" in ids and not any(":child:" in i for i in ids)
            assert driver.find_element(By.ID, "count").text.startswith("7 top-level workflows")
            fold = driver.find_element(By.CSS_SELECTOR, 'tr[data-workflow="order-7"] details')
            fold.find_element(By.TAG_NAME, "summary").click()
            children = fold.find_elements(By.CSS_SELECTOR, "li.child")
            assert [c.get_attribute("data-workflow") for c in children] == [
                "order-7:child:2",
                "order-7:child:3",
            ]
            _shot(driver, "console-workflows.png")
            before = _refreshed(driver)
            _auto_refresh(driver, True)
            engine.start(quote_only, 9, workflow_id="quote-9").result(timeout=20)
            wait_for(
                lambda: driver.find_elements(By.CSS_SELECTOR, 'tr[data-workflow="quote-9"]'),
                60,
                "the new workflow in the open list",
            )
            assert _refreshed(driver) > before
            # The list was replaced, and the fold the operator opened is still open.
            opened = "return document.querySelector('tr[data-workflow=\"order-7\"] details').open"
            assert driver.execute_script(opened) is True
            _auto_refresh(driver, False)
            search = driver.find_element(By.NAME, "q")
            search.send_keys("O-42")
            search.submit()
            wait_for(lambda: "q=O-42" in driver.current_url, 30, "the search")
            ids = [
                r.get_attribute("data-workflow")
                for r in driver.find_elements(By.CSS_SELECTOR, "#workflows tr.workflow")
            ]
            assert ids == ["refund-o-42"]

            # Sorted by name: a click on the column's header, another turns it round.
            driver.get(console + "/workflows")
            driver.find_element(By.CSS_SELECTOR, 'a.sort[data-sort="name"]').click()
            wait_for(lambda: "sort=name" in driver.current_url, 30, "the sorted list")

            def names() -> list[str]:
                cells = driver.find_elements(
                    By.CSS_SELECTOR, "#workflows tr.workflow td:nth-child(2)"
                )
                return [c.text for c in cells]

            assert names() == sorted(names()) and len(set(names())) > 1
            driver.find_element(By.CSS_SELECTOR, 'a.sort[data-sort="name"]').click()
            wait_for(lambda: "sort=-name" in driver.current_url, 30, "the order turned round")
            assert names() == sorted(names(), reverse=True)

            # Executors: the live ones; a dead one only when asked.
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO durable.executors (executor_id, hostname, pid, started_at,"
                    " heartbeat_at, capabilities, incarnation) VALUES ('gone-exec', 'old-host',"
                    " 1, now() - interval '2 days', now() - interval '1 day', '[]', 'i0')"
                )
            driver.get(console + "/executors")
            _auto_refresh(driver, False)
            table = driver.find_element(By.ID, "executors").text
            assert "gone-exec" not in table and "old-host" not in table
            assert driver.find_elements(By.CSS_SELECTOR, "#executors tr.executor")  # this one
            assert driver.find_element(By.ID, "dead").text.startswith("1 dead executor hidden")
            driver.find_element(By.ID, "show-dead").click()
            wait_for(lambda: "all=1" in driver.current_url, 30, "the dead executors")
            assert "gone-exec" in driver.find_element(By.ID, "executors").text

            # Signing out takes the actions away.
            driver.get(console + "/approvals?all=1")
            driver.find_element(By.CSS_SELECTOR, "#signout button").click()
            wait_for(lambda: driver.find_elements(By.ID, "signin"), 30, "the sign-in page")
            assert _session_cookie(driver) is None
            driver.get(console + "/workflows/order-13")
            assert not driver.find_elements(By.CSS_SELECTOR, "form.action")
            assert driver.find_elements(By.ID, "signin-link")
    finally:
        driver.quit()


@durable.workflow(registry=reg, name="shop.quote_only")
def quote_only(i: int) -> dict[str, Any]:
    return quote(f"o-{i}", 100 * i)


def test_an_operator_filters_by_an_attribute_and_cancels_the_matches_in_bulk(
    database_url: str, console: str
) -> None:
    """The list filters by an attribute; its bulk cancel counts the matches first, and the
    confirmed action cancels exactly those (checked in the database)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = _browser()
    try:
        with durable.Client(database_url) as client:  # no worker: the runs stay PENDING
            for i in range(3):
                client.submit(quote_only, i, workflow_id=f"c1-{i}", attributes={"customer": "c-1"})
            client.submit(quote_only, 9, workflow_id="c2-9", attributes={"customer": "c-2"})
        driver.get(console + "/signin?next=/workflows")
        assert _sign_in(driver, TOKEN) == ""
        _auto_refresh(driver, False)
        field = driver.find_element(By.ID, "attr-filter")
        field.send_keys("customer=c-1")
        field.submit()
        wait_for(lambda: "attr=customer" in driver.current_url, 30, "the attribute filter")
        _auto_refresh(driver, False)
        ids = {
            r.get_attribute("data-workflow")
            for r in driver.find_elements(By.CSS_SELECTOR, "#workflows tr.workflow")
        }
        assert ids == {"c1-0", "c1-1", "c1-2"}
        assert (_text(driver, "#count") or "").startswith("3 ")

        bulk = driver.find_element(By.ID, "bulk")
        Select(bulk.find_element(By.NAME, "action")).select_by_value("cancel")
        bulk.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for(lambda: driver.find_elements(By.ID, "bulk-count"), 30, "the count")
        assert driver.find_element(By.ID, "bulk-count").get_attribute("data-count") == "3"
        assert all(_status(database_url, f"c1-{i}") == "PENDING" for i in range(3))
        button = driver.find_element(By.ID, "bulk-confirm-button")
        assert button.text == "Cancel 3 runs"
        button.click()
        wait_for(lambda: driver.find_elements(By.ID, "message"), 30, "the answer")
        assert "3 run(s) changed" in driver.find_element(By.ID, "message").text
        assert [_status(database_url, f"c1-{i}") for i in range(3)] == ["CANCELLED"] * 3
        assert _status(database_url, "c2-9") == "PENDING"
        cancels = scalar(
            database_url,
            "SELECT count(*) FROM durable.audit_log WHERE action = 'cancel' AND actor LIKE "
            "'console %%'",
        )
        assert cancels == 3
    finally:
        driver.quit()
