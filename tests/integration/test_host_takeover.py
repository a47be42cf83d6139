"""An engine starting on a host takes at once the claims of executors of that host whose
process is gone (no such pid, or the pid now belongs to a later process), and of no
other: not a live process's, and not of rows of another host key (another kernel or pid
namespace, where a pid means another process)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import psycopg
import pytest

import durable
from durable._io import machine as _machine
from durable.errors import ExecutorIdInUseError


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


def _held_by(
    url: str, executor: str, pid: int, key: str, start: int | None, registered_ago: float = 0
) -> None:
    """A workflow RUNNING under `executor` (pid `pid` that started at tick `start`, host key
    `key`, registered `registered_ago` seconds ago by the database's clock), its lease far
    off."""
    with durable.Client(url, migrate=True) as client:
        client.submit(wf, workflow_id=f"wf-{executor}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.executors (executor_id, hostname, pid, started_at, "
            "heartbeat_at, incarnation, host_key, pid_start) VALUES (%s, 'h', %s, "
            "now() - make_interval(secs => %s), now(), 'inc-1', %s, %s)",
            (executor, pid, registered_ago, key, start),
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
    here = _machine.host_key()
    if not here:
        pytest.skip("no host key on this platform (/proc is needed)")
    dead = _dead_pid()
    _held_by(database_url, "dead", dead, here, None)
    _held_by(database_url, "alive", sleeper, here, _machine.start_tick(sleeper))
    # The database's clock a year behind (a skewed server, a fake clock): no matter.
    skewed = _machine.start_tick(sleeper)
    _held_by(database_url, "skewed", sleeper, here, skewed, registered_ago=365 * 86400)
    _held_by(database_url, "unknown", sleeper, here, None)  # start unknown: alive
    _held_by(database_url, "elsewhere", _dead_pid(), "another-host/boot/pid:[1]", None)
    reused = (_machine.start_tick(sleeper) or 0) - 100  # the pid named another process then
    _held_by(database_url, "reused", sleeper, here, reused)
    with durable.Engine(database_url, registry=durable.Registry()):
        pass
    assert _state(database_url, "dead") == ("abandoned:dead", True, False)
    assert _state(database_url, "reused") == ("abandoned:reused", True, False)
    assert _state(database_url, "alive") == ("alive", False, True)
    assert _state(database_url, "skewed") == ("skewed", False, True)
    assert _state(database_url, "unknown") == ("unknown", False, True)
    assert _state(database_url, "elsewhere") == ("elsewhere", False, True)


def test_gone_is_judged_by_pid_and_start_tick() -> None:
    me = os.getpid()
    mine = _machine.start_tick(me)
    assert mine is not None
    assert not _machine.gone(me, None) and not _machine.gone(me, mine)  # this process
    # This pid at another start tick: a predecessor whose pid came round to this process.
    assert _machine.gone(me, mine - 1)
    assert _machine.gone(_dead_pid(), None)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tick = _machine.start_tick(child.pid)
        assert tick is not None
        assert not _machine.gone(child.pid, tick)  # the very process
        assert not _machine.gone(child.pid, None)  # unknown start: taken as alive
        assert _machine.gone(child.pid, tick - 1)  # the pid was another process's then
    finally:
        child.kill()
        child.wait()


def _beating(url: str, executor: str, stop: threading.Event) -> None:
    """The heartbeat of a live process of another container, as its row shows it."""
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.wait(0.1):
            conn.execute(
                "UPDATE durable.executors SET heartbeat_at = now() WHERE executor_id = %s",
                (executor,),
            )


def _engine(url: str, executor_id: str) -> durable.Engine:
    return durable.Engine(
        url, registry=durable.Registry(), executor_id=executor_id, lease_seconds=1.0
    )


def test_an_explicit_id_is_judged_by_host_key_and_start_tick_at_launch(
    database_url: str,
) -> None:
    """Its own row, left by a predecessor of this pid namespace whose pid came round to
    this process (pid 1 of a container restarted): a dead predecessor, taken over at once.
    A row of another host key (another container, the same hostname): judged by its
    heartbeat alone, never by a pid that means nothing here: refused while it beats, taken
    over once it is a lease old."""
    here = _machine.host_key()
    if not here:
        pytest.skip("no host key on this platform (/proc is needed)")
    me = os.getpid()
    mine = _machine.start_tick(me)
    assert mine is not None
    _held_by(database_url, "restarted", me, here, mine - 1)
    with _engine(database_url, "restarted"):
        assert _state(database_url, "restarted") == ("abandoned:restarted", True, True)
    # Another container, whose pid is not one here, beating: refused.
    elsewhere = here.rsplit("/", 1)[0] + "/pid:[1]"
    _held_by(database_url, "twin", _dead_pid(), elsewhere, None)
    stop = threading.Event()
    beats = threading.Thread(target=_beating, args=(database_url, "twin", stop))
    beats.start()
    try:
        with pytest.raises(ExecutorIdInUseError) as refused:
            _engine(database_url, "twin").launch()
    finally:
        stop.set()
        beats.join()
    assert "give each process its own --executor-id" in str(refused.value)
    assert _state(database_url, "twin") == ("twin", False, True)
    # It stops beating (its container died): the id is taken once it is a lease old, and
    # only the leases that ran out with it (the process may yet be alive, paused).
    with _engine(database_url, "twin"):
        assert _state(database_url, "twin") == ("twin", False, True)
    # The same pid and start tick as this process: an engine of this very process.
    _held_by(database_url, "same", me, here, mine)
    with pytest.raises(ExecutorIdInUseError):
        _engine(database_url, "same").launch()
