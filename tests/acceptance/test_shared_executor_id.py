"""Two live processes under one --executor-id: worker A is paused past its lease, B starts
with A's id (allowed: A's heartbeat is stale), then A resumes. B holds the id now; A is
a stale incarnation of it and must touch nothing of B's: not B's workflows (releasing one
would let a third worker run the step B is inside), not B's executor row. It stops
claiming and exits non-zero. The world table records every entry into the step."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import durable
from tests.acceptance.workers import scalar, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app, twin_app

APP = "tests.apps.twin_app"
LEASE = 1.0
IDENT = ["--executor-id", "twin"]


def holder_pid(url: str) -> object:
    """The pid in the executor row of id 'twin' (None: there is no row)."""
    return scalar(url, "SELECT pid FROM durable.executors WHERE executor_id = 'twin'")


def heartbeat_age(url: str) -> float:
    age = scalar(
        url,
        "SELECT extract(epoch FROM clock_timestamp() - heartbeat_at)::float8"
        " FROM durable.executors WHERE executor_id = 'twin'",
    )
    return float(str(age))


def entries(url: str, workflow_id: str) -> list[tuple[str, int]]:
    return [(what, pid) for _, what, pid in world(url, workflow_id)]


def ownership(url: str, workflow_id: str) -> tuple[object, object]:
    status = scalar(url, "SELECT status FROM durable.workflows WHERE workflow_id = %s", workflow_id)
    owner = scalar(url, "SELECT owner FROM durable.workflows WHERE workflow_id = %s", workflow_id)
    return status, owner


def start(env: dict[str, str], url: str, log: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    return start_worker(env, url, lease=LEASE, app=APP, extra=extra, log=str(log))


def b_takes_the_id_of_a_paused(
    env: dict[str, str], url: str, tmp_path: Path
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """A (id 'twin') registers, is SIGSTOPped until its heartbeat is stale, and B starts
    under the same id."""
    a = start(env, url, tmp_path / "a.log", IDENT)
    wait_for(lambda: holder_pid(url) == a.pid, what="A to register")
    a.send_signal(signal.SIGSTOP)
    wait_for(lambda: heartbeat_age(url) > 2 * LEASE, what="A's heartbeat to go stale")
    b = start(env, url, tmp_path / "b.log", IDENT)
    wait_for(lambda: holder_pid(url) == b.pid, what="B to take the id")
    return a, b


def finish(*procs: subprocess.Popen[bytes] | None) -> None:
    for proc in procs:
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            stop_worker(proc)


def test_a_resumed_twin_shut_down_touches_nothing_of_the_new_holder(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    counter_app.setup(database_url)
    gate = tmp_path / "gate"
    a, b = b_takes_the_id_of_a_paused(subprocess_env, database_url, tmp_path)
    c = None
    try:
        with durable.Client(database_url) as client:
            client.submit(twin_app.hold, "w", str(gate), workflow_id="w")
            wait_for(lambda: entries(database_url, "w") == [("enter", b.pid)], what="B's step")
            a.send_signal(signal.SIGCONT)
            a_exit = stop_worker(a)  # SIGTERM: A shuts down
            holder_after_a, w_after_a = holder_pid(database_url), ownership(database_url, "w")
            # A third worker: had A released B's workflow, it (or B) would claim it again,
            # and by the time a later workflow is done it would have been claimed.
            c = start(subprocess_env, database_url, tmp_path / "c.log", [])
            assert client.submit(twin_app.quick, "q", workflow_id="q").result(timeout=60) == "q"
            inside = entries(database_url, "w")
            gate.touch()
            result = client.retrieve("w").result(timeout=60)
        # The step ran once, by B, and was not entered again while B was inside it.
        assert inside == [("enter", b.pid)]
        assert entries(database_url, "w") == [("enter", b.pid), ("leave", b.pid)]
        assert result == "done"
        # A's shutdown left B's workflow and B's executor row alone.
        assert w_after_a == ("RUNNING", "twin")
        assert holder_after_a == b.pid
        assert holder_pid(database_url) == b.pid
        # A knew it had lost its id: a supervisor sees it exit with an error.
        assert a_exit == 1
        assert stop_worker(b) == 0
    finally:
        finish(a, b, c)


def test_a_resumed_twin_claims_nothing_and_exits_on_its_own(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    counter_app.setup(database_url)
    gate = tmp_path / "gate"
    a, b = b_takes_the_id_of_a_paused(subprocess_env, database_url, tmp_path)
    try:
        with durable.Client(database_url) as client:
            client.submit(twin_app.hold, "w", str(gate), workflow_id="w")
            wait_for(lambda: entries(database_url, "w") == [("enter", b.pid)], what="B's step")
            a.send_signal(signal.SIGCONT)
            for i in range(6):
                client.submit(twin_app.quick, f"q{i}", workflow_id=f"q{i}")
            # Nobody signals A: it finds out by itself that B holds its id, and exits.
            a_exit = a.wait(timeout=20 * LEASE)
            for i in range(6):
                assert client.retrieve(f"q{i}").result(timeout=60) == f"q{i}"
            assert ownership(database_url, "w") == ("RUNNING", "twin")
            gate.touch()
            assert client.retrieve("w").result(timeout=60) == "done"
        assert a_exit == 1
        assert [r for r in world(database_url) if r[2] == a.pid] == []  # A ran nothing
        assert entries(database_url, "w") == [("enter", b.pid), ("leave", b.pid)]
        assert holder_pid(database_url) == b.pid
        assert stop_worker(b) == 0
    finally:
        finish(a, b)
