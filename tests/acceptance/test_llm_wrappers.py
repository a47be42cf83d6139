"""The official openai and anthropic SDKs, wrapped by durable.llm and pointed at a local
stub that counts requests: a run SIGKILLed after its second of four model calls and
resumed by a worker in a fresh process sends four requests in all (not six), and the
budget holds exactly the four responses' tokens and their price."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal

import pytest

import durable
from tests.acceptance.workers import scalar, stop_worker, wait_for
from tests.apps.model_stub import ModelStub, usage_of

APP = "tests.apps.llm_app"
PRICES = {"openai": (0.15, 0.60), "anthropic": (3.00, 15.00)}


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    server = ModelStub().start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "kind", ["openai", "openai-async", "responses", "anthropic", "anthropic-async"]
)
def test_a_kill_after_two_of_four_model_calls_costs_no_request_and_no_charge_twice(
    database_url: str, subprocess_env: dict[str, str], stub: ModelStub, kind: str
) -> None:
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url, "LLM_STUB_URL": stub.url}
    workflow_id = f"agent-{kind}"
    first = subprocess.run(
        [sys.executable, "-m", APP, kind, workflow_id],
        env={**env, "DURABLE_CRASH_POINTS": "after_step_record:2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert stub.count() == 2
    worker = subprocess.Popen(
        [sys.executable, "-m", "durable.cli", "worker", "--app", APP,
         "--lease-seconds", "1", "--poll-interval", "0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(
            lambda: (
                scalar(
                    database_url,
                    "SELECT status FROM durable.workflows WHERE workflow_id = %s",
                    workflow_id,
                )
                == "SUCCESS"
            ),
            timeout=60,
            what="the resumed agent",
        )
    finally:
        stop_worker(worker)
    prompts = [f"{workflow_id} question {i}" for i in range(4)]
    assert stub.count() == 4  # not 6: the two journaled calls replayed
    assert sorted(_prompt(body) for _, body in stub.requests) == sorted(prompts)
    output = scalar(
        database_url, "SELECT output FROM durable.workflows WHERE workflow_id = %s", workflow_id
    )
    assert json.loads(str(output)) == [f"answer to {p}" for p in prompts]
    with durable.Client(database_url) as client:
        ledger = client.budget(workflow_id)
    assert ledger is not None
    tokens = sum(sum(usage_of(p)) for p in prompts)
    price_in, price_out = PRICES[kind.split("-")[0] if kind != "responses" else "openai"]
    dollars = sum(
        Decimal(str(price_in)) * usage_of(p)[0] + Decimal(str(price_out)) * usage_of(p)[1]
        for p in prompts
    ) / Decimal(1_000_000)
    assert ledger["spent"]["tokens"] == tokens
    assert ledger["spent"]["steps"] == 4
    assert ledger["spent"]["dollars"] == pytest.approx(float(dollars), abs=1e-9)


def _prompt(body: dict[str, object]) -> str:
    if "input" in body:
        return str(body["input"])
    messages = body["messages"]
    assert isinstance(messages, list)
    return str(messages[-1]["content"])
