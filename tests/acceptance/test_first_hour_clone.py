"""The first hour, as a new user lives it, from a fresh clone: the README's two commands
(in root's home, mode 0700; in a world-readable temporary directory, the first, the test
command being what CI runs there whole), the example run
twice (the second time from a subdirectory: it replays), and a script killed in a step and
run again (it resumes at once), or recovered by `durable worker --app`. The embedded
database is used, as the README's first command does (a data directory of the test's own).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT
from tests.integration.test_embedded import new_data_dir  # noqa: F401

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None, reason="needs git, to clone the project as a user would"
)


def _readme_commands() -> tuple[str, str]:
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split("\n## Two commands\n", 1)[1].split("\n## ", 1)[0]
    run, test = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)
    return run.strip(), test.strip()


@pytest.fixture(params=["home", "tmp"])
def clone(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh clone of this project: under the user's home (as root: 0700) or under /tmp
    (world-readable)."""
    if request.param == "home":
        base = Path.home() / f".durable-first-hour-{uuid.uuid4().hex[:8]}"
        base.mkdir()
    else:
        base = Path(tempfile.mkdtemp(prefix="durable-first-hour-", dir="/tmp"))
        base.chmod(0o755)
    target = base / "durable"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True, timeout=120)
    yield target
    shutil.rmtree(base, ignore_errors=True)


def _env(data_dir: Path) -> dict[str, str]:
    """A user's environment: no database URL (the embedded server, in a data directory of
    this test's own), nothing of the test run's own Python path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_", "PYTHON"))}
    env["DURABLE_DATA_DIR"] = str(data_dir)
    # pip leaves compiling the bytecode to the first import (about a third of an install's
    # CPU otherwise); nothing the commands do depends on it. (`--no-compile` in pip's
    # environment is PIP_COMPILE=0: PIP_NO_COMPILE=1 reads as "compile".)
    env["PIP_COMPILE"] = "0"
    if "DURABLE_TEST_DATABASE_URL" in os.environ:  # the suite's own server, for the tests
        env["DURABLE_TEST_DATABASE_URL"] = os.environ["DURABLE_TEST_DATABASE_URL"]
    return env


def _sh(command: str, cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_first_hour_from_a_fresh_clone(
    clone: Path,
    new_data_dir: Callable[[str], Path],  # noqa: F811
) -> None:
    env = _env(new_data_dir("pgdata"))
    run, test = _readme_commands()

    # 1. The example, as the README runs it: three steps.
    first = _sh(run, clone, env)
    assert first.count("  step ") == 3, first
    # Again, from a subdirectory: the same project, the same database: it replays.
    again = _sh("../.venv/bin/python hello.py", clone / "examples", env)
    assert "  step " not in again, again
    assert again.splitlines()[-2] == first.splitlines()[-2]  # the same result line

    if clone.parent.parent != Path.home():
        # The test command from a clone in a world-readable temporary directory is what CI
        # runs whole (.ci/run, on a clean clone under /tmp); the rest does not depend on
        # where the clone is.
        return
    # 2. The tests, as the README runs them (a few: the suite cannot run inside itself),
    # including those that run the embedded server's programs as another account, which
    # failed from a clone under root's home (0700).
    picked = "tests/unit/test_labels.py tests/integration/test_embedded_security.py"
    tested = _sh(f"{test} -q -p no:cacheprovider {picked} -k 'labels or locked_down'", clone, env)
    assert " passed" in tested and "failed" not in tested, tested
    # 2b. A project of one's own, as the README makes it ("A project of your own"), with
    # the clone's virtualenv on the PATH: `durable init`, the project's tests, its example.
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split("\n## A project of your own\n", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    venv_env = {**env, "PATH": f"{clone / '.venv' / 'bin'}:{env.get('PATH', '')}"}
    made = _sh(" && ".join(line for line in lines if line), clone, venv_env)
    assert " passed" in made and "failed" not in made, made
    # (The README's "Install" wheel, built in a fresh clone and installed in a fresh
    # virtualenv: tests/acceptance/test_package.py.)
    # 3. A script killed inside a step, then run again: it resumes at once (its lease is
    # an hour), the journaled step replayed, the cut-off one run again.
    script = clone / "tests" / "apps" / "script"
    env = {**env, "APP_LOG": str(clone / "calls.log"), "APP_LEASE_SECONDS": "3600"}
    python = str(clone / ".venv" / "bin" / "python")
    killed = subprocess.Popen([python, "app.py", "long", "first-hour"], cwd=script, env=env)
    _wait_for(lambda: "long_step HELLO" in _calls(clone), killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=10)
    resumed = subprocess.run(
        [python, "app.py", "long", "first-hour"],
        cwd=script,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip().splitlines()[-1] == "OLLEH"
    assert _calls(clone) == ["prepare hello", "long_step HELLO", "long_step HELLO"]

    # 4. The same, recovered by a worker instead: `durable worker --app app`.
    (clone / "calls.hung").unlink()
    killed = subprocess.Popen([python, "app.py", "long", "by-worker"], cwd=script, env=env)
    _wait_for(lambda: _calls(clone).count("long_step HELLO") == 3, killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=10)
    url = _sh(".venv/bin/durable db url", clone, env).strip()
    worker = subprocess.Popen(
        [str(clone / ".venv" / "bin" / "durable"), "worker", "--app", "app"],
        cwd=script,
        env={**env, "PYTHONPATH": str(script)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while _status(url, "by-worker") != "SUCCESS" and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert _status(url, "by-worker") == "SUCCESS"
    assert _calls(clone).count("prepare hello") == 2  # once per workflow, never replayed
    assert _calls(clone).count("long_step HELLO") == 4


def _calls(clone: Path) -> list[str]:
    path = clone / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def _wait_for(done: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not done():
        assert proc.poll() is None, "the script ended before it was killed"
        assert time.monotonic() < deadline, "the script never reached its step"
        time.sleep(0.05)


def _status(url: str, workflow_id: str) -> str | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status FROM durable.workflows WHERE workflow_id = %s", (workflow_id,)
        ).fetchone()
    return None if row is None else str(row[0])
