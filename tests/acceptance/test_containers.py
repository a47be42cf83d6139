"""Workers in containers, each `durable worker` in a pid namespace of its own (`unshare
--pid`, with /proc mounted for it) and a hostname set in its own uts namespace: what a
container runtime gives it. Pids there are the namespace's own, and a pid one container
sees says nothing of another's.

- A worker killed and started again in its container, at the very pid its predecessor had
  (as pid 1 of a restarted container does when the kernel gives the namespace back), under
  the same hostname and executor id, takes its predecessor's workflows over at once: the
  row's pid is its own, but at another start tick.
- A twin under the same hostname and executor id in another container (a replica given the
  same --executor-id by mistake) is refused while the first's heartbeat is fresh, whatever
  pid it cannot see; it takes over only once that heartbeat is a lease old.

The world table records each step's effect with the pid (as its namespace sees it) of the
process that ran it. Needs root (or CAP_SYS_ADMIN) for the namespaces: skipped otherwise.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import durable
from tests.acceptance.workers import scalar, wait_for, world
from tests.apps import counter_app, twin_app

UNSHARE = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts"]


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return False
    try:
        done = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


pytestmark = pytest.mark.skipif(
    not _namespaces_work(),
    reason="needs unshare(1) and nsenter(1) (util-linux) allowed to make pid, mount and uts "
    "namespaces: run the tests as root, or in a container with CAP_SYS_ADMIN "
    "(docker run --privileged)",
)


def worker_command(app: str, executor_id: str, lease: float) -> str:
    return shlex.join(
        [
            sys.executable,
            "-m",
            "durable.cli",
            "worker",
            "--app",
            app,
            "--executor-id",
            executor_id,
            "--lease-seconds",
            str(lease),
            "--poll-interval",
            "0.1",
            "--concurrency",
            "8",
            "--grace-seconds",
            "5",
        ]
    )


def worker_env(env: dict[str, str], url: str) -> dict[str, str]:
    return {**env, "DURABLE_DATABASE_URL": url, "DURABLE_LOG_LEVEL": "WARNING"}


def at_pid(pid: int, command: str) -> str:
    """A shell line that runs `command` as pid `pid` of the namespace it runs in (the next
    pid the kernel gives there is ns_last_pid + 1)."""
    return f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid; {command} & wait $!"


def container(
    env: dict[str, str], hostname: str, script: str, log: Path
) -> subprocess.Popen[bytes]:
    """`script` run by sh as pid 1 of new pid, mount and uts namespaces named `hostname`;
    SIGKILL to the returned process kills all of it."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*UNSHARE, "sh", "-c", f"hostname {hostname}; {script}"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def kill_container(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()  # unshare --kill-child: its pid 1, and so its namespace, dies with it
    proc.wait(timeout=30)


def holder(url: str, executor_id: str) -> tuple[object, object]:
    """(pid, host key) in the executor row of `executor_id`."""
    query = "SELECT {} FROM durable.executors WHERE executor_id = %s"
    return scalar(url, query.format("pid"), executor_id), scalar(
        url, query.format("host_key"), executor_id
    )


def inside(url: str) -> int:
    """How many steps were entered (twin_app's held step)."""
    return sum(1 for _, what, _ in world(url) if what == "enter")


def assert_each_ran_once_but_the_step_in_flight(url: str) -> None:
    """Each workflow's finished step ran once; the step it was inside at the kill ran again
    (entered twice), to its end once."""
    runs = Counter((wid, what) for wid, what, _ in world(url))
    once_but_in_flight = {"mark": 1, "enter": 2, "leave": 1}
    assert runs == {(f"w{k}", what): n for k in range(8) for what, n in once_but_in_flight.items()}


def test_a_worker_restarted_at_its_predecessors_pid_takes_over_at_once(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    counter_app.setup(database_url)
    env = worker_env(subprocess_env, database_url)
    lease = 120.0  # long: only a takeover at once finishes the workflows before it runs out
    gate = tmp_path / "gate"
    command = worker_command("tests.apps.twin_app", "box", lease)
    # The container: its pid 1 keeps the namespace; the worker runs in it at pid 100.
    box = container(env, "box", "exec sleep 3600", tmp_path / "box.log")
    workers: list[subprocess.Popen[bytes]] = []

    def init_pid() -> int:
        children = Path(f"/proc/{box.pid}/task/{box.pid}/children").read_text().split()
        return int(children[0]) if children else 0

    def start() -> subprocess.Popen[bytes]:
        enter = ["nsenter", "--target", str(init_pid()), "--pid", "--mount", "--uts", "--"]
        with open(tmp_path / "worker.log", "ab") as out:
            proc = subprocess.Popen(
                [*enter, "sh", "-c", at_pid(100, command)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        workers.append(proc)
        return proc

    try:
        wait_for(lambda: init_pid() > 0, what="the container's pid 1")
        first = start()
        wait_for(lambda: holder(database_url, "box")[0] == 100, what="the worker at pid 100")
        key = holder(database_url, "box")[1]
        with durable.Client(database_url) as client:
            handles = [
                client.submit(twin_app.mark_then_hold, f"w{k}", str(gate), workflow_id=f"w{k}")
                for k in range(8)
            ]
            wait_for(lambda: inside(database_url) == 8, what="8 workflows inside a step")
            subprocess.run(
                ["nsenter", "--target", str(init_pid()), "--pid", "--mount", "kill", "-9", "100"],
                check=True,
            )
            first.wait(timeout=30)
            # Started again at once: the same hostname, pid namespace, pid and executor id.
            gate.touch()
            second = start()
            results = [h.result(timeout=lease / 4) for h in handles]
        assert second.poll() is None  # not refused as a twin of itself
        assert holder(database_url, "box") == (100, key)
        assert results == ["done"] * 8
        assert_each_ran_once_but_the_step_in_flight(database_url)
    finally:
        kill_container(box)  # and the workers in it
        for proc in workers:
            proc.wait(timeout=30)


def test_a_live_twin_in_another_container_is_refused_until_its_heartbeat_is_stale(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    counter_app.setup(database_url)
    env = worker_env(subprocess_env, database_url)
    lease = 2.0
    command = worker_command("tests.apps.twin_app", "twin", lease)
    gate = tmp_path / "gate"
    # Container A: the worker at pid 50, a pid that container B does not have.
    a = container(env, "box", at_pid(50, command), tmp_path / "a.log")
    b: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: holder(database_url, "twin")[0] == 50, what="A to register")
        with durable.Client(database_url) as client:
            for k in range(8):
                client.submit(twin_app.hold, f"w{k}", str(gate), workflow_id=f"w{k}")
            wait_for(lambda: len(world(database_url)) == 8, what="A inside 8 steps")
            # Container B: the same hostname and executor id, its worker at pid 1.
            b = twin = container(env, "box", f"exec {command}", tmp_path / "b.log")
            wait_for(
                lambda: twin.poll() is not None or len(world(database_url)) > 8,
                what="B to exit or to run a step",
            )
            # While A lives, B runs nothing: it is refused, with the fix in its message.
            entered = [(what, pid) for _, what, pid in world(database_url)]
            assert entered == [("enter", 50)] * 8
            b_exit = b.wait(timeout=30)
            holder_after_b = holder(database_url, "twin")[0]
            # A dies (a kill -9 of its container): B, started again and again as a
            # runtime restarts it, takes over once A's heartbeat is a lease old.
            kill_container(a)
            while True:
                b = container(env, "box", f"exec {command}", tmp_path / "b.log")
                try:
                    b.wait(timeout=2 * lease)
                except subprocess.TimeoutExpired:
                    break  # running: it holds the id
            gate.touch()
            results = [client.retrieve(f"w{k}").result(timeout=60) for k in range(8)]
        assert b_exit == 75
        assert "give each process its own --executor-id" in (tmp_path / "b.log").read_text()
        assert holder_after_b == 50
        assert results == ["done"] * 8
        # Then B ran each step A was inside when it died, once to its end.
        runs = Counter((wid, what, pid) for wid, what, pid in world(database_url))
        for k in range(8):
            assert runs[(f"w{k}", "enter", 50)] == 1
            assert runs[(f"w{k}", "enter", 1)] == 1
            assert runs[(f"w{k}", "leave", 1)] == 1
        assert holder(database_url, "twin")[0] == 1
    finally:
        kill_container(a)
        if b is not None:
            kill_container(b)


def test_a_container_restarted_in_a_new_namespace_waits_out_the_lease_instead_of_failing(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """The worker is pid 1 of its container; the container is killed and started again at
    once, with a new pid namespace, the same hostname and executor id. Nothing here tells
    its predecessor's death from a live twin's but the heartbeat: the new worker watches
    it, and takes over once it is a lease old, instead of exiting (a crash loop)."""
    counter_app.setup(database_url)
    env = worker_env(subprocess_env, database_url)
    lease = 3.0
    gate = tmp_path / "gate"
    command = f"exec {worker_command('tests.apps.twin_app', 'box', lease)}"
    old = container(env, "box", command, tmp_path / "old.log")
    new = None
    try:
        wait_for(lambda: holder(database_url, "box")[0] == 1, what="the worker at pid 1")
        with durable.Client(database_url) as client:
            handles = [
                client.submit(twin_app.mark_then_hold, f"w{k}", str(gate), workflow_id=f"w{k}")
                for k in range(8)
            ]
            wait_for(lambda: inside(database_url) == 8, what="8 workflows inside a step")
            kill_container(old)
            gate.touch()
            new = container(env, "box", command, tmp_path / "new.log")
            results = [h.result(timeout=60) for h in handles]
        assert new.poll() is None  # it waited, and runs: no exit to be restarted from
        assert results == ["done"] * 8
        assert_each_ran_once_but_the_step_in_flight(database_url)
    finally:
        kill_container(old)
        if new is not None:
            kill_container(new)
