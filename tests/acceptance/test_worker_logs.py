"""A worker says what it does: one structured log line per claim, recovery, failure,
nondeterminism error and gate (asserted on `durable worker --log-format json`)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

import durable
from durable._base.urls import redact
from tests.apps import logs_app


@durable.workflow(registry=durable.Registry(), name="logs.ghost")
def ghost() -> None:
    """Registered nowhere a worker runs."""


def _events(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.startswith("{")]


def _has(path: Path, event: str, workflow_id: str) -> bool:
    return any(
        e.get("event") == event and e.get("workflow_id") == workflow_id for e in _events(path)
    )


def test_the_worker_logs_one_json_line_per_event(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    with durable.Client(database_url) as client:
        client.submit(logs_app.steps, workflow_id="plain")
        client.submit(logs_app.fails, workflow_id="failing")
        client.submit(logs_app.gated, workflow_id="gated")
        client.submit(logs_app.steps, workflow_id="changed")
        client.submit(logs_app.steps, workflow_id="orphan")
        client.submit(logs_app.napper, workflow_id="napper")  # recovered, then sleeps
        client.submit(ghost, workflow_id="ghost-1")  # no worker has its code
    with psycopg.connect(database_url, autocommit=True) as conn:
        # Code changed under a journal: position 0 was another step.
        conn.execute(
            "INSERT INTO durable.steps (workflow_id, step_seq, step_name, kind, output)"
            " VALUES ('changed', 0, 'logs.other', 'step', '\"x\"')"
        )
        # A run whose worker died: RUNNING, its lease long expired.
        conn.execute(
            "UPDATE durable.workflows SET status = 'RUNNING', owner = 'dead-worker',"
            " epoch = epoch + 1, lease_expires_at = now() - interval '1 minute'"
            " WHERE workflow_id IN ('orphan', 'napper')"
        )
    log = tmp_path / "worker.log"
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url, "DURABLE_LOG_LEVEL": "INFO"}
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "durable.cli", "worker", "--app", "tests.apps.logs_app"),
                *("--poll-interval", "0.1", "--log-format", "json"),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            expected = [
                ("claim", "plain"),
                ("failed", "failing"),
                ("gate", "gated"),
                ("nondeterminism", "changed"),
                ("recover", "orphan"),
                ("orphan", "ghost-1"),
                ("claim", "napper"),  # its wake-up
            ]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(_has(log, *e) for e in expected):
                time.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
    events = _events(log)
    for event, workflow_id in expected:
        assert _has(log, event, workflow_id), (event, workflow_id, events)
    failed = next(e for e in events if e.get("event") == "failed")
    assert failed["error_type"] == "ValueError" and failed["level"] == "WARNING"
    gate = next(e for e in events if e.get("event") == "gate")
    assert gate["gate"] == "ship"
    recover = next(e for e in events if e.get("event") == "recover")
    assert recover["attempt"] == 1 and recover["workflow"] == "logs.steps"
    # A wake-up after a recovery is a claim, not another recovery.
    napper = [e["event"] for e in events if e.get("workflow_id") == "napper"]
    assert napper.count("recover") == 1 and "claim" in napper[napper.index("recover") :], napper
    # Which database it works on, first, as a line a log shipper can parse.
    assert events[0]["event"] == "database_in_use", events[0]
    assert events[0]["database"] == f"the database at {redact(database_url)}"
    # Routine steps log nothing at INFO: no INFO line mentions the step.
    assert not any(e["level"] == "INFO" and "logs.a" in e["message"] for e in events)


def test_the_text_log_escapes_what_workflows_stored(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    evil = logs_app.HOSTILE
    workflow_id = "h" + evil
    with durable.Client(database_url) as client:
        client.submit(logs_app.hostile, evil, workflow_id=workflow_id)
        log = tmp_path / "worker.log"
        env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url, "DURABLE_LOG_LEVEL": "INFO"}
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [
                    *(
                        sys.executable,
                        "-m",
                        "durable.cli",
                        "worker",
                        "--app",
                        "tests.apps.logs_app",
                    ),
                    *("--poll-interval", "0.1", "--executor-id", "x" + evil),
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            try:
                deadline = time.monotonic() + 30
                while client.get_workflow(workflow_id).status is not durable.WorkflowStatus.ERROR:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.1)
            finally:
                worker.send_signal(signal.SIGTERM)
                worker.wait(timeout=30)
    text = log.read_bytes().decode()  # as written: read_text() would turn \r into \n
    raw = {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F}
    assert not raw | ({"\u202e"} & set(text)), text
    # Visible instead: the id, the executor and the error as their escapes.
    assert "h\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\r\\u202e" in text
    assert "x\\x1b[2J" in text and "refused\\x1b[2J" in text
