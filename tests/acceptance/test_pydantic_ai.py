"""A pydantic-ai agent (scripted model, two tools) in a durable workflow, SIGKILLed after
its first model call and tool call were journaled, resumed by a worker in a fresh
process: every model call and every tool call happened exactly once, and the budget holds
exactly the model responses' tokens."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import psycopg
import pytest

import durable
from tests.acceptance.workers import scalar, stop_worker, wait_for

APP = "tests.apps.pai_app"


def world(url: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        return [(r[0], r[1]) for r in conn.execute("SELECT what, pid FROM agent_world ORDER BY id")]


def test_a_killed_agent_resumes_without_calling_a_model_or_tool_twice(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url}
    first = subprocess.run(
        [sys.executable, "-m", APP, "agent-1"],
        env={**env, "DURABLE_CRASH_POINTS": "after_step_record:2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert [w for w, _ in world(database_url)] == ["model:0", "tool:tides"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "durable.cli", "worker", "--app", APP,
         "--lease-seconds", "1", "--poll-interval", "0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(
            lambda: scalar(
                database_url, "SELECT status FROM durable.workflows WHERE workflow_id = %s",
                "agent-1",
            ) == "SUCCESS",
            timeout=60,
            what="the resumed agent",
        )  # fmt: skip
    finally:
        stop_worker(worker)
    # Each model call and tool call once: the resumed run replayed the first two.
    assert [w for w, _ in world(database_url)] == [
        "model:0",
        "tool:tides",
        "model:1",
        "tool:moon",
        "model:2",
    ]
    output = scalar(
        database_url, "SELECT output FROM durable.workflows WHERE workflow_id = 'agent-1'"
    )
    assert json.loads(str(output)) == "the moon pulls the tides"
    with durable.Client(database_url) as client:
        steps = client.steps("agent-1")
        ledger = client.budget("agent-1")
    model_steps = [s for s in steps if s.step_name.endswith("model.request")]
    assert len(model_steps) == 3
    usage = [json.loads(str(s.output))["usage"] for s in model_steps]
    tokens = sum(u.get("input_tokens", 0) + u.get("output_tokens", 0) for u in usage)
    assert ledger is not None and tokens > 0
    assert ledger["spent"]["tokens"] == tokens
    dollars = sum(u.get("input_tokens", 0) * 1.0 + u.get("output_tokens", 0) * 2.0 for u in usage)
    assert ledger["spent"]["dollars"] == pytest.approx(dollars / 1e6)
