"""`durable worker --processes N`: N worker processes under one command, each with its own
executor id and heartbeat, sharing the claims; one killed is started again; SIGTERM stops
them all."""

from __future__ import annotations

import os
import signal
from collections import Counter

import psycopg

from tests.acceptance.workers import client, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app


def live_executors(url: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT executor_id, pid FROM durable.executors"
            " WHERE heartbeat_at > now() - interval '3 seconds' AND executor_id LIKE 'pw-%'"
            " ORDER BY 1"
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_processes_share_the_work_and_a_killed_one_comes_back(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        first = [
            engine.submit(counter_app.slow, f"a{k}", 3, 0.1, workflow_id=f"a{k}") for k in range(12)
        ]
        supervisor = start_worker(
            subprocess_env,
            database_url,
            concurrency=2,
            extra=["--processes", "2", "--executor-id", "pw"],
        )
        try:
            for h in first:
                assert h.result(timeout=60) == ["s0", "s1", "s2"]
            # Two workers, one heartbeat each, under the ids the command made unique.
            wait_for(lambda: len(live_executors(database_url)) == 2, what="two executors")
            executors = live_executors(database_url)
            assert [e for e, _ in executors] == ["pw-0", "pw-1"]
            # Both took a share of the claims: the steps ran in both processes.
            pids = {pid for _, _, pid in world(database_url)}
            assert pids == {pid for _, pid in executors}
            # One is killed: the command starts it again, and it works.
            os.kill(executors[0][1], signal.SIGKILL)
            wait_for(
                lambda: any(
                    e == executors[0][0] and pid != executors[0][1]
                    for e, pid in live_executors(database_url)
                ),
                what="the killed process to be started again",
            )
            second = [
                engine.submit(counter_app.slow, f"b{k}", 2, 0.05, workflow_id=f"b{k}")
                for k in range(8)
            ]
            for h in second:
                assert h.result(timeout=60) == ["s0", "s1"]
            children = [pid for _, pid in live_executors(database_url)]
        finally:
            code = stop_worker(supervisor)
    assert code == 0
    assert not any(alive(pid) for pid in children)
    runs = Counter((wid, what) for wid, what, _ in world(database_url))
    assert all(n == 1 for n in runs.values())  # nothing was in flight at the kill
    assert len(runs) == 12 * 3 + 8 * 2


def test_processes_that_cannot_start_stop_the_command_with_their_code(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    supervisor = start_worker(
        subprocess_env, database_url, app="no_such_module_here", extra=["--processes", "2"]
    )
    try:
        code = supervisor.wait(timeout=60)
    finally:
        stop_worker(supervisor)
    assert code == 2  # click's usage error, from each process in turn: not restarted forever


def test_an_engine_given_its_id_in_code_gets_one_id_per_process(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    supervisor = start_worker(
        subprocess_env,
        database_url,
        app="tests.apps.coded_engine_app:engine",
        extra=["--processes", "2"],
    )
    try:

        def ids() -> list[str]:
            with psycopg.connect(database_url) as conn:
                rows = conn.execute(
                    "SELECT executor_id FROM durable.executors"
                    " WHERE heartbeat_at > now() - interval '3 seconds' ORDER BY 1"
                ).fetchall()
            return [r[0] for r in rows]

        wait_for(lambda: ids() == ["coded-0", "coded-1"], what="one id per process")
    finally:
        code = stop_worker(supervisor)
    assert code == 0


def executor_pid(url: str, executor_id: str) -> int | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT pid FROM durable.executors WHERE executor_id = %s", [executor_id]
        ).fetchone()
    return None if row is None else int(row[0])


def test_a_process_killed_again_and_again_at_start_backs_off_alone(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    """An OOM kill loop: one process SIGKILLed three times, each soon after its start. It
    is not a process that cannot start: it comes back after a backoff, and its sibling
    works all along."""
    with client(database_url) as engine:
        supervisor = start_worker(
            subprocess_env,
            database_url,
            concurrency=2,
            extra=["--processes", "2", "--executor-id", "pw"],
        )
        try:
            wait_for(lambda: len(live_executors(database_url)) == 2, what="two executors")
            for _ in range(4):
                pid = executor_pid(database_url, "pw-0")
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                wait_for(
                    lambda pid=pid: (
                        executor_pid(database_url, "pw-0") not in (pid, None)
                        or supervisor.poll() is not None
                    ),
                    what="pw-0 to be started again",
                )
                assert supervisor.poll() is None  # the command did not stop
            # The sibling runs workflows meanwhile, and so does pw-0 once back.
            handles = [
                engine.submit(counter_app.slow, f"c{k}", 2, 0.05, workflow_id=f"c{k}")
                for k in range(8)
            ]
            for h in handles:
                assert h.result(timeout=60) == ["s0", "s1"]
            assert supervisor.poll() is None
            wait_for(lambda: len(live_executors(database_url)) == 2, what="pw-0 back")
        finally:
            code = stop_worker(supervisor)
    assert code == 0
    runs = Counter((wid, what) for wid, what, _ in world(database_url))
    assert len(runs) == 8 * 2 and set(runs.values()) == {1}


def test_processes_die_with_their_command_and_a_new_one_takes_over_at_once(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    """The command is SIGKILLed: its processes stop (handing their workflows back at a
    step boundary); the command started again runs at once and finishes the interrupted
    workflows, no step running twice."""
    extra = ["--processes", "2", "--executor-id", "box"]
    with client(database_url) as engine:
        first = start_worker(subprocess_env, database_url, concurrency=4, extra=extra)
        second = None
        children: list[int] = []
        try:
            handles = [
                engine.submit(counter_app.slow, f"w{k}", 8, 0.3, workflow_id=f"w{k}")
                for k in range(8)
            ]
            wait_for(lambda: len(live_executors_of(database_url, "box")) == 2, what="two")
            children = [pid for _, pid in live_executors_of(database_url, "box")]
            wait_for(lambda: len(world(database_url)) >= 8, what="steps to run")
            first.kill()
            first.wait()
            wait_for(
                lambda: not any(alive(pid) for pid in children),
                timeout=30,
                what="the processes of the killed command to exit",
            )
            second = start_worker(subprocess_env, database_url, concurrency=4, extra=extra)
            for h in handles:
                assert h.result(timeout=60) == [f"s{i}" for i in range(8)]
            assert second.poll() is None  # it ran, no "in use" failure
        finally:
            first.kill()
            first.wait()
            for pid in children:  # left running if they outlived their command
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            code = stop_worker(second) if second is not None else None
    assert code == 0
    runs = Counter((wid, what) for wid, what, _ in world(database_url))
    assert len(runs) == 8 * 8 and set(runs.values()) == {1}


def live_executors_of(url: str, prefix: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT executor_id, pid FROM durable.executors"
            " WHERE heartbeat_at > now() - interval '3 seconds' AND executor_id LIKE %s"
            " ORDER BY 1",
            [prefix + "-%"],
        ).fetchall()
    return [(r[0], r[1]) for r in rows]
