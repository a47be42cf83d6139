"""An OpenAI Agents SDK agent (OpenAIResponsesModel on the local ModelStub, two tool calls)
in a durable workflow, SIGKILLed right after a model response or a tool call was
journaled, resumed by a worker in a fresh process: every tool call happened exactly once,
the stub answered each model request once (the responses before the kill came back from
the journal), and the budget holds exactly the stub's reported tokens."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import psycopg
import pytest

import durable
from tests.acceptance.workers import scalar, stop_worker, wait_for
from tests.apps.model_stub import ModelStub, usage_of

APP = "tests.apps.oa_app"
EVERYTHING = ["model:0", "tool:tides", "model:1", "tool:moon", "model:2"]


def world(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT what FROM agent_world ORDER BY id")]


@pytest.mark.parametrize(
    ("crash", "before"),
    [
        ("after_step_record:2", ["model:0", "tool:tides"]),  # after a tool call
        ("after_step_record:3", ["model:0", "tool:tides", "model:1"]),  # after a model response
    ],
)
def test_a_killed_agent_resumes_without_a_second_model_request_or_tool_call(
    database_url: str, subprocess_env: dict[str, str], crash: str, before: list[str]
) -> None:
    # The app is imported here, not with the module: every test process collects the
    # module, and the Agents SDK costs seconds of CPU to import.
    from tests.apps import oa_app

    def model(body: dict[str, Any]) -> list[dict[str, Any]]:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS agent_world (id bigserial, what text, pid int)"
            )
            conn.execute(
                "INSERT INTO agent_world (what, pid) VALUES (%s, 0)",
                [f"model:{oa_app.tool_results(body)}"],
            )
        return oa_app.script(body)

    stub = ModelStub(reply=model).start()
    try:
        env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url, "MODEL_STUB_URL": stub.url}
        first = subprocess.run(
            [sys.executable, "-m", APP, "oa-1"],
            env={**env, "DURABLE_CRASH_POINTS": crash},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert first.returncode == -signal.SIGKILL, first.stderr
        assert world(database_url) == before
        worker = subprocess.Popen(
            [sys.executable, "-m", "durable.cli", "worker", "--app", APP,
             "--lease-seconds", "1", "--poll-interval", "0.1"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_for(
                lambda: scalar(
                    database_url, "SELECT status FROM durable.workflows WHERE workflow_id = %s",
                    "oa-1",
                ) == "SUCCESS",
                timeout=60,
                what="the resumed agent",
            )  # fmt: skip
        finally:
            stop_worker(worker)
        # Each model request and tool call once: the resumed run replayed what came before.
        assert world(database_url) == EVERYTHING
        assert stub.count() == 3
        requests = [body for _, body in stub.requests]
    finally:
        stub.stop()
    output = scalar(database_url, "SELECT output FROM durable.workflows WHERE workflow_id = 'oa-1'")
    assert json.loads(str(output)) == oa_app.ANSWER
    with durable.Client(database_url) as client:
        steps = client.steps("oa-1")
        calls = client.tool_calls("oa-1")
        ledger = client.budget("oa-1")
    assert [s.step_name for s in steps] == [
        "openai_agents.model",
        "openai_agents.tool.lookup",
        "openai_agents.model",
        "openai_agents.tool.lookup",
        "openai_agents.model",
    ]
    assert [json.loads(c["arguments"]["args"][0]) for c in calls] == [
        {"topic": "tides"},
        {"topic": "moon"},
    ]
    # The budget holds what the stub reported for the three requests it answered.
    used = [usage_of(json.dumps(body["input"])) for body in requests]  # input: a list
    assert ledger is not None
    assert ledger["spent"]["tokens"] == sum(i + o for i, o in used)
    assert ledger["spent"]["dollars"] == pytest.approx(sum(i + 2 * o for i, o in used) / 1e6)
