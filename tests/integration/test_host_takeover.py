"""An engine starting on a host takes at once the claims of executors of that host whose
process is gone (no such pid, or the pid now belongs to a later process), and of no
other: not a live process's, and not of rows of another host key (another kernel or pid
namespace, where a pid means another process)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest

import durable
from durable import _host


@durable.workflow(registry=durable.Registry(), name="takeover.wf")
def wf() -> str:
    return "done"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def sleeper() -> Iterator[int]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield child.pid
    child.kill()
    child.wait()


def _held_by(url: str, executor: str, pid: int, key: str, registered_ago: float = 0) -> None:
    """A workflow RUNNING under `executor` (pid `pid`, host key `key`), its lease far off."""
    with durable.Client(url, migrate=True) as client:
        client.submit(wf, workflow_id=f"wf-{executor}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.executors (executor_id, hostname, pid, started_at, "
            "heartbeat_at, incarnation, host_key) VALUES (%s, 'h', %s, "
            "now() - make_interval(secs => %s), now(), 'inc-1', %s)",
            (executor, pid, registered_ago, key),
        )
        conn.execute(
            "UPDATE durable.workflows SET status = 'RUNNING', owner = %s, epoch = epoch + 1,"
            " lease_expires_at = now() + interval '1 hour' WHERE workflow_id = %s",
            (executor, f"wf-{executor}"),
        )


def _state(url: str, executor: str) -> tuple[str | None, bool, bool]:
    with psycopg.connect(url) as conn:
        owner, expired = conn.execute(
            "SELECT owner, lease_expires_at <= now() FROM durable.workflows WHERE workflow_id = %s",
            (f"wf-{executor}",),
        ).fetchone() or (None, False)
        row = conn.execute(
            "SELECT 1 FROM durable.executors WHERE executor_id = %s", (executor,)
        ).fetchone()
    return owner, bool(expired), row is not None


def test_the_claims_of_a_dead_process_of_this_host_are_taken_at_launch(
    database_url: str, sleeper: int
) -> None:
    here = _host.host_key()
    if not here:
        pytest.skip("no host key on this platform (/proc is needed)")
    _held_by(database_url, "dead", _dead_pid(), here)
    _held_by(database_url, "alive", sleeper, here, registered_ago=0)
    _held_by(database_url, "elsewhere", _dead_pid(), "another-host/boot/pid:[1]")
    _held_by(database_url, "reused", sleeper, here, registered_ago=3600)  # pid reused since
    with durable.Engine(database_url, registry=durable.Registry()):
        pass
    assert _state(database_url, "dead") == ("abandoned:dead", True, False)
    assert _state(database_url, "reused") == ("abandoned:reused", True, False)
    assert _state(database_url, "alive") == ("alive", False, True)
    assert _state(database_url, "elsewhere") == ("elsewhere", False, True)


def test_gone_is_judged_by_pid_and_start_time() -> None:
    assert not _host.gone(os.getpid(), 0.0)  # this process, whatever its row says
    assert _host.gone(_dead_pid(), time.time())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not _host.gone(child.pid, time.time() - 1)  # registered as it started
        assert _host.gone(child.pid, time.time() - 3600)  # the pid was someone else's then
    finally:
        child.kill()
        child.wait()
