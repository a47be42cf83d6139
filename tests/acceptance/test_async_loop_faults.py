"""The event loop of a worker's async workflows, against real `durable worker` processes.

- SystemExit or KeyboardInterrupt out of an async step (in the workflow's own task or in a
  branch of an asyncio.gather) gives that run up and counts it, as for a sync step: the
  poison workflow ends MAX_RECOVERY_ATTEMPTS_EXCEEDED, the harmless ones beside it finish,
  and the worker lives on and keeps running workflows.
- When the loop itself dies anyway (its machinery raises), the worker stops renewing the
  leases of the runs it held and exits non-zero at once, and another worker takes its runs
  over.

Judged by the world (tests/apps/counter_app.py's `world` table, with the pid of the process
that ran each step) and the stored statuses, never by log lines. The workers run
tests/apps/loop_faults_app.py.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

import durable
from tests.acceptance.workers import scalar, start_worker, stop_worker, wait_for, world
from tests.apps import loop_faults_app

APP = "tests.apps.loop_faults_app:engine"
HARMLESS = [f"n{i}" for i in range(3)]


@contextmanager
def client(url: str) -> Iterator[durable.Client]:
    """Submits and reads workflows; runs none."""
    loop_faults_app.setup(url)
    with durable.Client(url) as c:
        yield c


def worker(env: dict[str, str], url: str, name: str) -> subprocess.Popen[bytes]:
    """A `durable worker` under executor id `name`, once it has registered (its signal
    handlers are set by then: a SIGTERM during a slow start would kill it outright). Its
    output goes to a log file that `alive` shows when it has exited."""
    log = tempfile.NamedTemporaryFile(prefix=f"durable-{name}-", suffix=".log", delete=False)
    log.close()
    proc = start_worker(env, url, app=APP, extra=["--executor-id", name], log=log.name)
    _logs[proc.pid] = log.name
    wait_for(
        lambda: (
            not alive(proc)
            or scalar(url, "SELECT count(*) FROM durable.executors WHERE executor_id = %s", name)
        ),
        timeout=120,
        what=f"worker {name} to register",
    )
    return proc


_logs: dict[int, str] = {}


def alive(proc: subprocess.Popen[bytes]) -> bool:
    """True while `proc` runs; once it has exited, an assertion error with its output."""
    if proc.poll() is None:
        return True
    with open(_logs[proc.pid], encoding="utf-8", errors="replace") as f:
        raise AssertionError(f"the worker exited with {proc.returncode}:\n{f.read()[-4000:]}")


def statuses(url: str) -> dict[str, tuple[str, str | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT workflow_id, status, owner FROM durable.workflows").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def pids(url: str, workflow_id: str, what: str) -> list[int]:
    return [pid for _, w, pid in world(url, workflow_id) if w == what]


def say(url: str, workflow_id: str, what: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO world (workflow_id, what, pid) VALUES (%s, %s, 0)", [workflow_id, what]
        )


def say_go(url: str, workflow_id: str) -> None:
    say(url, workflow_id, "go")


# SystemExit as well, in one process: tests/integration/test_twins_inprocess.py.
@pytest.mark.parametrize("kind", ["KeyboardInterrupt"])
def test_exit_in_an_async_step_gives_up_its_run_and_the_worker_lives_on(
    database_url: str, subprocess_env: dict[str, str], kind: str
) -> None:
    url = database_url
    a = b = None
    try:
        with client(url) as c:
            harmless = [c.submit(loop_faults_app.napping, w, 2.0, workflow_id=w) for w in HARMLESS]
            a = worker(subprocess_env, url, "worker-a")
            # A holds the harmless ones (their steps are running) before any poison comes.
            wait_for(
                lambda: alive(a) and all(pids(url, w, "nap-start") for w in HARMLESS),
                timeout=60,
                what="worker A to run the harmless workflows",
            )
            poison = c.submit(loop_faults_app.exiting, "x1", kind, 99, False, workflow_id="x1")
            branch = c.submit(loop_faults_app.exiting, "x2", kind, 99, True, workflow_id="x2")
            once = c.submit(loop_faults_app.exiting, "x3", kind, 1, True, workflow_id="x3")
            wait_for(lambda: pids(url, "x1", "exit-step"), timeout=30, what="the first exit")
            b = worker(subprocess_env, url, "worker-b")
            for h in harmless:
                assert h.result(timeout=60) == "rested"
            assert once.result(timeout=60) == 2
            for h in (poison, branch):
                wait_for(
                    lambda h=h: h.status() == "MAX_RECOVERY_ATTEMPTS_EXCEEDED",
                    timeout=60,
                    what=f"{h.workflow_id} to be given up",
                )
            assert a.poll() is None and b.poll() is None  # both workers live on
            # B leaves; A alone runs a new async workflow to its end.
            assert stop_worker(b) == 0
            late = c.submit(loop_faults_app.napping, "late", 0.1, workflow_id="late")
            assert late.result(timeout=60) == "rested"
            assert pids(url, "late", "nap-end") == [a.pid]
            assert stop_worker(a) == 0
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    found = statuses(url)
    # Each run of a poison workflow exited once and was given up and counted: the first run
    # and one per recovery, then no more.
    for w in ("x1", "x2"):
        assert found[w] == ("MAX_RECOVERY_ATTEMPTS_EXCEEDED", None)
        attempts = pids(url, w, "exit-step")
        assert len(attempts) == loop_faults_app.MAX_RECOVERY_ATTEMPTS + 1, attempts
    assert (
        scalar(url, "SELECT recovery_attempts FROM durable.workflows WHERE workflow_id = 'x3'") == 1
    )
    for w in HARMLESS:
        assert found[w] == ("SUCCESS", None)
        assert len(pids(url, w, "nap-end")) >= 1


def test_a_worker_whose_event_loop_dies_exits_and_another_takes_its_runs_over(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    url = database_url
    a = b = None
    try:
        with client(url) as c:
            # The naps last until the test wakes them (at most 120 s): still under way on A
            # when its loop dies, however long B takes to start.
            harmless = [
                c.submit(loop_faults_app.napping, w, 120.0, True, workflow_id=w) for w in HARMLESS
            ]
            breaking = c.submit(loop_faults_app.breaking, "k1", workflow_id="k1")
            a = worker(subprocess_env, url, "worker-a")
            wait_for(
                lambda: (
                    all(pids(url, w, "nap-start") for w in HARMLESS) and pids(url, "k1", "break")
                ),
                timeout=60,
                what="worker A to run every workflow",
            )
            b = worker(subprocess_env, url, "worker-b")
            wait_for(
                lambda: scalar(url, "SELECT count(*) FROM durable.executors") == 2,
                timeout=60,
                what="worker B to start",
            )
            held = statuses(url)
            assert all(held[w] == ("RUNNING", "worker-a") for w in [*HARMLESS, "k1"]), held
            say_go(url, "k1")
            began = time.monotonic()
            code = a.wait(timeout=30)
            exited = time.monotonic() - began
            assert code != 0, "a worker whose event loop died must exit with an error"
            wait_for(
                lambda: all(b.pid in pids(url, w, "nap-start") for w in HARMLESS),
                timeout=60,
                what="worker B to take the harmless workflows over",
            )
            taken = time.monotonic() - began
            for w in HARMLESS:
                say(url, w, "wake")
            for h in harmless:
                assert h.result(timeout=60) == "rested"
            assert breaking.result(timeout=60) == "intact"
            assert stop_worker(b) == 0
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"worker A exited {exited:.2f} s after its loop broke; B ran its runs by {taken:.2f} s")
    assert b is not None
    for w in HARMLESS:
        # Started on A, whose loop died under them; finished on B.
        assert pids(url, w, "nap-end")[-1] == b.pid
    assert pids(url, "k1", "after-break") == [b.pid]
    assert all(status == ("SUCCESS", None) for status in statuses(url).values())
