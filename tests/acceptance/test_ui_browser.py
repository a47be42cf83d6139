"""The console in a real headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by Selenium), served by a real `durable ui` process: a workflow waits at an
approval gate, the operator finds it in the inbox and approves it with the token, and the
workflow finishes (checked in the database); without the token the action is refused; a
stored `<script>` is shown as text and never runs.

Outside CI the test skips when the browser is missing (`apt-get install -y chromium
chromium-driver`); under CI=true it fails. With DURABLE_UI_SCREENSHOTS=<dir> it saves the
screenshots of the list, a workflow page and the inbox there (docs/ holds them).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    decision = durable.approval("refund-over-limit", payload=quoted | {"note": note})
    if not decision.approved:
        return "held"
    durable.state.set({"order": order, "stage": "approved"})
    return charge(order)


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


def _decide(driver: Any, workflow_id: str, token: str, comment: str) -> str:
    from selenium.webdriver.common.by import By

    row = driver.find_element(By.CSS_SELECTOR, f'tr.gate[data-workflow="{workflow_id}"]')
    form = row.find_element(By.CSS_SELECTOR, "form.action")
    token_field = form.find_element(By.NAME, "token")
    token_field.clear()
    token_field.send_keys(token)
    form.find_element(By.NAME, "comment").send_keys(comment)
    form.find_element(By.NAME, "by").send_keys("ana")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(lambda: driver.find_elements(By.ID, "message"), 30, "an answer to the decision")
    return str(driver.find_element(By.ID, "message").text)


def test_an_operator_approves_in_the_inbox_and_the_workflow_finishes(
    database_url: str, console: str
) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    shots = os.environ.get("DURABLE_UI_SCREENSHOTS")
    driver = _browser()
    try:
        with durable.Engine(database_url, registry=reg) as engine:
            for i in range(3):
                engine.start(quote_only, i, workflow_id=f"quote-{i}").result(timeout=20)
            with pytest.raises(durable.errors.WorkflowFailedError):
                engine.start(fails, "o-13", workflow_id="order-13").result(timeout=20)
            engine.start(refund, "o-42", 4000, SCRIPT, workflow_id="refund-o-42")
            wait_for(lambda: engine.list_approvals("refund-o-42"), 30, "the gate")

            driver.get(console + "/workflows")
            assert "refund-o-42" in driver.find_element(By.ID, "workflows").text
            if shots:
                driver.save_screenshot(str(Path(shots) / "console-workflows.png"))

            driver.get(console + "/approvals")
            row = driver.find_element(By.CSS_SELECTOR, 'tr.gate[data-workflow="refund-o-42"]')
            assert SCRIPT in row.find_element(By.CSS_SELECTOR, "pre.payload").text  # as text
            with pytest.raises(NoAlertPresentException):
                driver.switch_to.alert  # noqa: B018 (the script never ran)
            assert driver.title != "owned"
            if shots:
                driver.save_screenshot(str(Path(shots) / "console-approvals.png"))

            refused = _decide(driver, "refund-o-42", "not-the-token", "looks fine")
            assert "refused" in refused and "token" in refused
            assert _status(database_url, "refund-o-42") == "SUSPENDED"
            assert engine.list_approvals("refund-o-42")  # still waiting

            driver.get(console + "/approvals")
            approved = _decide(driver, "refund-o-42", TOKEN, "within policy")
            assert approved == "approved refund-over-limit of refund-o-42"
            wait_for(lambda: _status(database_url, "refund-o-42") == "SUCCESS", 30, "SUCCESS")
            assert engine.retrieve("refund-o-42").result(timeout=5) == "charged o-42"

            driver.get(console + "/workflows/refund-o-42")
            page = driver.find_element(By.TAG_NAME, "main").text
            assert "shop.charge" in page and "within policy" in page and SCRIPT in page
            if shots:
                driver.set_window_size(1400, 1500)
                driver.save_screenshot(str(Path(shots) / "console-workflow.png"))
    finally:
        driver.quit()


@durable.workflow(registry=reg, name="shop.quote_only")
def quote_only(i: int) -> dict[str, Any]:
    return quote(f"o-{i}", 100 * i)
