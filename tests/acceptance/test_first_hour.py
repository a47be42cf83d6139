"""A new user's first program, run as `python app.py`: it finishes its own waits under a
plain `with durable.Engine():`, and when it is killed, `durable worker --app app`
recovers what it started (the same function has the same name however it was loaded)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import durable
from tests.conftest import ROOT

SCRIPT = ROOT / "tests" / "apps" / "script" / "app.py"


@pytest.fixture
def project(tmp_path: Path, database_url: str, subprocess_env: dict[str, str]) -> dict[str, str]:
    shutil.copy(SCRIPT, tmp_path / "app.py")
    env = {
        **subprocess_env,
        "DURABLE_DATABASE_URL": database_url,
        "APP_LOG": str(tmp_path / "calls.log"),
        "DURABLE_LOG_LEVEL": "WARNING",
    }
    return {"cwd": str(tmp_path), **env}


def _run(project: dict[str, str], *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in project.items() if k != "cwd"}
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=project["cwd"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_status(client: durable.Client, workflow_id: str, status: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if client.get_workflow(workflow_id).status == status:
                return
        except durable.errors.WorkflowNotFoundError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{workflow_id} never reached {status}")


def _calls(project: dict[str, str]) -> list[str]:
    path = Path(project["APP_LOG"])
    return path.read_text().splitlines() if path.exists() else []


def test_a_plain_engine_finishes_its_own_waits(database_url: str, project: dict[str, str]) -> None:
    proc = _run(project, "app.py", "wait", "first")
    with durable.Client(database_url) as client:
        _wait_status(client, "first", "SUSPENDED")
        assert client.get_workflow("first").name == "app.support_flow"  # not __main__.
        client.send("first", "hi", topic="reply")
        deadline = time.monotonic() + 30
        while not client.list_approvals("first") and time.monotonic() < deadline:
            time.sleep(0.05)
        client.decide("first", "ship", True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1] == "HELLO:hi:True"
    assert _calls(project) == ["prepare hello"]


def test_a_killed_script_is_recovered_by_a_worker(
    database_url: str, project: dict[str, str]
) -> None:
    proc = _run(project, "app.py", "hang", "killed")
    with durable.Client(database_url) as client:
        _wait_status(client, "killed", "SUSPENDED")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)  # reaps it and closes its pipes
        client.send("killed", "later", topic="reply")  # nobody runs it now
        env = {k: v for k, v in project.items() if k != "cwd"}
        env["PYTHONPATH"] = os.pathsep.join([project["cwd"], env.get("PYTHONPATH", "")])
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "durable.cli", "worker", "--app", "app"),
                *("--poll-interval", "0.1", "--grace-seconds", "2"),
            ],
            cwd=project["cwd"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not client.list_approvals("killed") and time.monotonic() < deadline:
                time.sleep(0.05)
            client.decide("killed", "ship", True)
            assert client.retrieve("killed").result(timeout=30) == "HELLO:later:True"
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
    assert _calls(project) == ["prepare hello"]  # the journaled step was not run again


def test_a_workflow_that_enqueues_children_and_waits_exits_cleanly(
    project: dict[str, str],
) -> None:
    began = time.monotonic()
    proc = _run(project, "app.py", "fan-out", "kids-1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1] == "14"  # 0 + 1 + 4 + 9
    assert time.monotonic() - began < 30


def test_a_killed_script_run_again_recovers_its_workflow_at_once(
    database_url: str, project: dict[str, str]
) -> None:
    """On the same host a dead process's claims are taken as soon as it is seen dead: the
    script run again resumes at once, though the lease has most of an hour to run."""
    project = {**project, "APP_LEASE_SECONDS": "3000"}
    first = _run(project, "app.py", "long", "long-1")
    deadline = time.monotonic() + 30
    while "long_step HELLO" not in _calls(project) and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)  # inside the step, its claim held for 3000 s
    first.communicate(timeout=10)
    again = _run(project, "app.py", "long", "long-1")
    out, err = again.communicate(timeout=60)  # without the takeover: 3000 s
    assert again.returncode == 0, err
    assert out.strip().splitlines()[-1] == "OLLEH"
    # The journaled step ran once; the one cut off ran again (steps run at least once).
    assert _calls(project) == ["prepare hello", "long_step HELLO", "long_step HELLO"]
    with durable.Client(database_url) as client:
        info = client.get_workflow("long-1")
    assert info.status == "SUCCESS" and info.recovery_attempts == 1


def test_a_start_that_waits_for_a_live_holder_says_until_when(
    database_url: str, project: dict[str, str]
) -> None:
    """Elsewhere (here: a holder that still beats) the wait is said, with its end."""
    project = {**project, "APP_LEASE_SECONDS": "3000", "APP_LOG_LEVEL": "INFO"}
    first = _run(project, "app.py", "long", "long-2")
    try:
        deadline = time.monotonic() + 30
        while "long_step HELLO" not in _calls(project) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = _run(project, "app.py", "long", "long-2")
        try:
            said = ""
            deadline = time.monotonic() + 30
            assert second.stderr is not None
            while "waiting for its lease" not in said and time.monotonic() < deadline:
                said += second.stderr.readline()
        finally:
            second.kill()
            second.communicate(timeout=10)
    finally:
        first.kill()
        first.communicate(timeout=10)
    assert "workflow long-2 is held by executor" in said and "UTC (in " in said, said
