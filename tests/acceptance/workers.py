"""Helpers to run `durable worker` processes against a test database."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import durable
from tests import reads
from tests.apps import counter_app

APP = "tests.apps.counter_app"


def start_worker(
    env: dict[str, str],
    url: str,
    *,
    crash: str | None = None,
    lease: float = 1.0,
    concurrency: int = 4,
    log: str | None = None,
    grace: float = 5.0,
    clock_file: str | None = None,
    extra: list[str] | None = None,
    app: str = APP,
) -> subprocess.Popen[bytes]:
    child_env = dict(env)
    if clock_file:
        child_env["DURABLE_FAKE_CLOCK"] = clock_file  # the test's FakeClock(path=...)
    child_env["DURABLE_DATABASE_URL"] = url
    child_env["DURABLE_LOG_LEVEL"] = env.get("DURABLE_LOG_LEVEL", "WARNING")
    if crash:
        child_env["DURABLE_CRASH_POINTS"] = crash
    with open(log, "wb") if log else contextlib.nullcontext(subprocess.DEVNULL) as out:
        return _popen(app, lease, concurrency, grace, extra, child_env, out, log)


def _popen(
    app: str,
    lease: float,
    concurrency: int,
    grace: float,
    extra: list[str] | None,
    child_env: dict[str, str],
    out: object,
    log: str | None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "durable.cli",
            "worker",
            "--app",
            app,
            "--lease-seconds",
            str(lease),
            "--poll-interval",
            "0.1",
            "--concurrency",
            str(concurrency),
            "--grace-seconds",
            str(grace),
            *(extra or []),
        ],
        env=child_env,
        stdout=out,  # type: ignore[arg-type]
        stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
    )


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@contextlib.contextmanager
def client(url: str) -> Iterator[durable.Engine]:
    counter_app.setup(url)
    with durable.Engine(url, registry=counter_app.registry, max_workers=1) as engine:
        yield engine


def wait_for(predicate: object, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def world(url: str, workflow_id: str | None = None) -> list[tuple[str, str, int]]:
    found = reads.rows(
        url,
        "SELECT workflow_id, what, pid FROM world"
        " WHERE %(w)s::text IS NULL OR workflow_id = %(w)s::text ORDER BY id",
        {"w": workflow_id},
    )
    return [(r[0], r[1], r[2]) for r in found]


def scalar(url: str, query: str, *params: object) -> object:
    # The test's own reads (tests/reads.py: one kept connection, at READ COMMITTED).
    return reads.scalar(url, query, list(params))
