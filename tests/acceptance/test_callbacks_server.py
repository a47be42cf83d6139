"""`durable callbacks serve`, a real process: a POST to a callback URL completes the wait of
a workflow run by an engine elsewhere (here, the test's); the server is SIGKILLed and
started again, and the second POST to the same URL still answers 409 with the first
outcome (it is the database's, not the process's)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import durable
from tests.acceptance.workers import wait_for

SECRET = "callback-secret-for-the-server-test-0123456789"

reg = durable.Registry()


@durable.workflow(registry=reg, name="cbserve.pay")
def pay(base: str) -> Any:
    durable.set_event("url", durable.callback_url("payment", base_url=base))
    return durable.recv("payment")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, value: Any) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(value).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


@contextmanager
def server(database_url: str, port: int, log: Path, env: dict[str, str]) -> Iterator[Any]:
    args = ["callbacks", "serve", "--port", str(port), "--database-url", database_url]
    with log.open("a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "durable.cli", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )

    def answering() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            post(f"http://127.0.0.1:{port}/callbacks/x", {})
        except OSError:
            return False
        return True

    try:
        wait_for(answering, 30, "durable callbacks serve to answer")
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_a_second_post_after_the_server_was_killed_is_still_409(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    subprocess_env: dict[str, str],
) -> None:
    monkeypatch.setenv("DURABLE_CALLBACK_SECRET", SECRET)
    port = _free_port()
    log = tmp_path / "callbacks.log"
    env = {k: v for k, v in subprocess_env.items() if k != "DURABLE_CALLBACK_SECRET"}
    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(pay, f"http://127.0.0.1:{port}")
        url = engine.get_event(handle.workflow_id, "url", timeout=30)
        assert isinstance(url, str)
        with server(database_url, port, log, env) as proc:
            status, first = post(url, {"paid": 42})
            assert status == 200, first
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert handle.result(timeout=30) == {"paid": 42}
        with server(database_url, port, log, env):
            status, second = post(url, {"paid": 43})
        assert status == 409, second
        assert second["outcome"] == first["outcome"] == {"status": "delivered"}
        assert second["used_at"] == first["used_at"]
    # The server needed no secret: it only hashes what it is given.
    assert "DURABLE_CALLBACK_SECRET" not in env
    assert os.environ["DURABLE_CALLBACK_SECRET"] == SECRET
