"""2,000 async workflows in one process, each awaiting a 1 s step and then a durable sleep
that suspends it: all finish, and the process never runs more than a small fixed number of
threads (a waiting async workflow holds no thread)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.acceptance.workers import scalar

N = 2000
MAX_THREADS = 24  # main, heartbeat, keeper, writer, one event loop, the pools' workers


def test_two_thousand_async_workflows_finish_on_a_few_threads(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.apps.concurrency_app", str(N)],
        env={**subprocess_env, "DURABLE_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)  # wall time and peak memory, for the record
    assert report["finished"] == N
    # Python's threads and the kernel's count of them (native threads included).
    assert report["peak_threads"] <= MAX_THREADS, report
    assert 0 < report["peak_os_threads"] <= MAX_THREADS, report
    assert (
        scalar(database_url, "SELECT count(*) FROM durable.workflows WHERE status = 'SUCCESS'") == N
    )
    # Each workflow slept durably: a wake-up time journaled between its step and its end.
    assert scalar(database_url, "SELECT count(*) FROM durable.steps WHERE kind = 'sleep'") == N
    # Many were parked at once, holding no task: SUSPENDED rows, each resumed by a claim of
    # its own (a new epoch). A sleep whose journal write came back with 1 s or less to go
    # sleeps in place instead (under this load the write can wait seconds for a connection),
    # so not all of them need to have suspended.
    assert report["peak_suspended"] >= N // 10, report
    resumed = scalar(database_url, "SELECT count(*) FROM durable.workflows WHERE epoch >= 2")
    assert isinstance(resumed, int) and resumed >= N // 10, resumed
