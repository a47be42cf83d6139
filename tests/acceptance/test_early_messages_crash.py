"""Messages sent before their workflow existed, across SIGKILLed processes (the world
table and the messages tables say what happened, not logs):

- a sender killed right after its kept message committed (before its second look), and a
  process killed right after its start_or_send committed (before it launched the run): the
  workflow, recovered by a worker, receives both, each once, the early one first;
- the worker running it killed right after it consumed the early message: the recovered
  run neither receives it again nor loses it;
- two processes calling start_or_send for one id at once: one workflow, both messages.

In one process: tests/integration/test_early_messages.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psycopg

import durable
from tests.acceptance.workers import start_worker, stop_worker, world
from tests.apps import early_app

APP = "tests.apps.early_app"


def sender(env: dict[str, str], url: str, *args: str, crash: str | None = None) -> int:
    child = {**env, "DURABLE_DATABASE_URL": url}
    if crash:
        child["DURABLE_CRASH_POINTS"] = crash
    proc = subprocess.run(
        [sys.executable, "-m", APP, args[0], url, *args[1:]],
        env=child,
        timeout=120,
        check=False,
        capture_output=True,
    )
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr.decode()
    return proc.returncode


def messages(url: str, workflow_id: str) -> list[tuple[str, int | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT payload, consumed_seq FROM durable.messages WHERE workflow_id = %s"
            " ORDER BY created_at",
            [workflow_id],
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def test_killed_senders_and_a_killed_receiver_lose_nothing_and_deliver_once(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    early_app.setup(database_url)
    w = "order-7"
    # (a) The sender dies right after its message was kept, before it looked again.
    code = sender(
        subprocess_env, database_url, "send", w, "early", crash="after_keep_early_message"
    )
    assert code == -signal.SIGKILL
    # (a) An engine's start_or_send dies right after its commit, before it ran anything:
    # the workflow is RUNNING under a dead owner, its message delivered.
    code = sender(
        subprocess_env,
        database_url,
        "engine_start_or_send",
        w,
        "second",
        crash="after_start_or_send",
    )
    assert code == -signal.SIGKILL
    with durable.Client(database_url) as client:
        assert client.get_workflow(w).status == "RUNNING"
        # (b) The worker that recovers it dies right after consuming the early message.
        first = start_worker(subprocess_env, database_url, app=APP, crash="after_recv:1")
        assert first.wait(timeout=60) == -signal.SIGKILL
        second = start_worker(subprocess_env, database_url, app=APP)
        try:
            assert client.retrieve(w).result(timeout=60) == ["early", "second"]
        finally:
            stop_worker(second)
    assert [what for _, what, _ in world(database_url, w)] == ["got early", "got second"]
    rows = messages(database_url, w)
    assert [payload for payload, _ in rows] == ['"early"', '"second"']  # each once
    assert all(seq is not None for _, seq in rows)
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM durable.early_messages").fetchone() == (0,)


def test_two_processes_start_or_send_one_id_at_once(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    early_app.setup(database_url)
    w = "order-9"
    go_at = time.time() + 2.0  # both interpreters are up by then
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", APP, "client_start_or_send", database_url, w, m, str(go_at)],
            env=env,
            stderr=subprocess.PIPE,
        )
        for m in ("from-a", "from-b")
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    with psycopg.connect(database_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM durable.workflows WHERE workflow_id = %s", [w]
        ).fetchone() == (1,)
    worker = start_worker(subprocess_env, database_url, app=APP)
    try:
        with durable.Client(database_url) as client:
            got = client.retrieve(w).result(timeout=60)
    finally:
        stop_worker(worker)
    assert sorted(got) == ["from-a", "from-b"]
    assert sorted(what for _, what, _ in world(database_url, w)) == ["got from-a", "got from-b"]
