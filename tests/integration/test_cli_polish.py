"""What a user expects of the command line: --version and -h, statuses in any case, ids
and values shown exactly as stored (no emoji, no markup), whole values on request, a
fork that says what it did, queues, and executors that can be pruned."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import psycopg

import durable


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args], capture_output=True, text=True, timeout=60
    )


def _in_a_terminal(*args: str) -> str:
    """What `durable ARGS` shows a person: stdout and stderr on one pseudo-terminal."""
    main, side = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "durable.cli", *args], stdout=side, stderr=side, stdin=side
    ) as proc:
        os.close(side)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the terminal closed: the command ended
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=60) == 0
    os.close(main)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_a_worker_app_that_cannot_be_loaded_is_a_usage_error() -> None:
    for app in ("nonexistent_module_xyz", "os:nothing"):
        done = cli("worker", "--app", app)
        assert done.returncode == 2, done.stderr
        assert "cannot be loaded" in done.stderr and "Traceback" not in done.stderr


def test_version_and_short_help() -> None:
    version = cli("--version")
    assert version.returncode == 0 and durable.__version__ in version.stdout
    short = cli("-h")
    assert short.returncode == 0 and "workflows" in short.stdout


def test_ids_and_values_are_shown_as_stored_and_whole_on_request(database_url: str) -> None:
    reg = durable.Registry()
    queue = durable.Queue("polish-q", registry=reg)

    @durable.step(registry=reg, name="polish.echo")
    def echo(text: str) -> str:
        return text

    @durable.workflow(registry=reg, name="polish.flow")
    def flow(text: str) -> str:
        durable.set_event("stage", "echoing")
        return echo(text)

    odd_id = "q-3:smile:child:0"  # rich would turn :smile: into an emoji
    long_text = "[bold]x[/bold] " + "y" * 300
    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(flow, long_text, workflow_id=odd_id).result(timeout=10) == long_text
        engine.enqueue(queue, flow, "later", workflow_id="queued-1")
    url = ("--database-url", database_url)
    listed = cli("workflows", "list", "--status", "success", *url)
    assert listed.returncode == 0, listed.stderr
    assert odd_id in listed.stdout and "😄" not in listed.stdout
    short = cli("workflows", "show", odd_id, *url)
    assert short.returncode == 0, short.stderr
    assert odd_id in short.stdout and "[bold]x[/bold]" in short.stdout
    assert "y" * 300 not in short.stdout
    assert 'event stage: "echoing"' in short.stdout
    full = cli("workflows", "show", odd_id, "--full", *url)
    assert "y" * 300 in full.stdout.replace("\n", "").replace("│", "").replace(" ", "")
    forked = cli("workflows", "fork", odd_id, "--from-step", "0", "--new-id", "fork-1", *url)
    assert forked.returncode == 0, forked.stderr
    # To a script: the id alone on stdout; the sentence on stderr names it too.
    assert forked.stdout.strip() == "fork-1"
    assert f"forked {odd_id} from step 0 as fork-1" in forked.stderr
    # To a person at a terminal: one sentence, naming the fork.
    said = _in_a_terminal(
        "workflows", "fork", odd_id, "--from-step", "0", "--new-id", "fork-2", *url
    )
    # (after the line on stderr that names the database it used)
    assert said.strip().splitlines()[1:] == [
        f"forked {odd_id} from step 0 as fork-2: steps before it are reused, the rest run anew "
        "on a worker"
    ]
    queues = json.loads(cli("queues", "list", "--json", *url).stdout)
    assert queues == [{"queue_name": "polish-q", "queued": 1, "active": 0, "finished": 0}]


def test_work_no_worker_can_run_is_shown_as_waiting_for_its_code(database_url: str) -> None:
    @durable.workflow(registry=durable.Registry(), name="polish.ghost")
    def ghost() -> None:
        """Registered nowhere a worker runs."""

    with durable.Client(database_url) as client:
        client.submit(ghost, workflow_id="ghost-1")
    url = ("--database-url", database_url)
    shown = cli("workflows", "show", "ghost-1", *url)
    assert (
        "waiting for a worker with polish.ghost; no live worker serves any version of "
        "polish.ghost" in shown.stdout
    )
    assert json.loads(cli("workflows", "show", "ghost-1", "--json", *url).stdout)[
        "waiting_for_code"
    ]
    assert "ghost-1 (polish.ghost)" in cli("executors", "list", *url).stdout


def test_dead_executors_are_hidden_and_pruned(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.executors (executor_id, hostname, pid, started_at, heartbeat_at)"
            " VALUES ('dead-1', 'h', 1, now() - interval '1 day', now() - interval '1 day')"
        )
    url = ("--database-url", database_url)
    assert "dead-1" not in cli("executors", "list", *url).stdout
    assert "dead-1" in cli("executors", "list", "--all", *url).stdout
    pruned = cli("executors", "prune", *url)
    assert pruned.returncode == 0 and "removed 1" in pruned.stdout
    assert "dead-1" not in cli("executors", "list", "--all", *url).stdout
