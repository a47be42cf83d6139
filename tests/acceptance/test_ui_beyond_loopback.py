"""`durable ui --host 0.0.0.0`, a real process: it says at start that every page needs the
token (and makes one even for a read-only console), then answers no page without it, over
loopback too; a name given with --allowed-host is answered, any other is refused."""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import durable
from tests.acceptance.workers import wait_for

reg = durable.Registry()


@durable.workflow(registry=reg, name="net.secret")
def secret(n: int) -> int:
    return n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def console(database_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`durable ui --host 0.0.0.0 --read-only` with no token given; yields its loopback
    base URL and what it printed at start."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_UI_TOKEN"}
    log = tmp_path / "ui.log"
    args = ["--host", "0.0.0.0", "--port", str(port), "--read-only"]
    args += ["--allowed-host", "console.example.com", "--database-url", database_url]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "durable.cli", "ui", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    base = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            _get(base + "/static/console.css")
        except OSError:
            return False
        return True

    try:
        wait_for(answering, 30, "durable ui to answer")
        yield base, log.read_text()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_beyond_loopback_every_page_needs_the_token(
    database_url: str, console: tuple[str, str]
) -> None:
    base, started = console
    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(secret, 42, workflow_id="secret-42").result(timeout=20)
    assert "beyond loopback" in started and "every page needs" in started
    found = re.search(r"token[^:\n]*: (\S+)", started)
    assert found, started
    token = found.group(1)

    assert len(token) >= 32  # a strong one: a weak one is refused beyond loopback
    assert "sign-in form" in started and "asks for it as a password" not in started

    status, text = _get(base + "/workflows/secret-42")
    assert status == 401 and "net.secret" not in text  # a sign-in form, nothing of it
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(base + "/workflows", timeout=10)
    # The challenge names a scheme the console takes, and a browser shows the form for it.
    challenge = refused.value.headers["WWW-Authenticate"]
    refused.value.close()
    assert challenge == 'Bearer realm="durable console"'
    assert _get(base + "/workflows", {"Authorization": f"Bearer {token}"})[0] == 200
    basic = "Basic " + base64.b64encode(f"ana:{token}".encode()).decode()
    status, text = _get(base + "/workflows/secret-42", {"Authorization": basic})
    assert status == 200 and "secret-42" in text
    status, _ = _get(base + "/workflows", {"X-Durable-Token": token})
    assert status == 200

    proxied = {"Host": "console.example.com", "X-Durable-Token": token}
    assert _get(base + "/workflows", proxied)[0] == 200
    assert _get(base + "/workflows", proxied | {"Host": "evil.example"})[0] == 400
