"""The official openai and anthropic SDKs, wrapped by durable.llm and pointed at a local
stub that counts requests: a run SIGKILLed after its second of four model calls and
resumed by a worker in a fresh process sends four requests in all (not six), and the
budget holds exactly the four responses' tokens and their price. A call the budget's cap
refuses waits at its gate unsent, across a SIGKILL, and is sent once after the raise."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal

import pytest

import durable
from durable._base.labels import LLM_OPENAI_CHAT as LLM_CHAT
from tests.acceptance.workers import scalar, stop_worker, wait_for
from tests.apps.model_stub import ModelStub, usage_of

APP = "tests.apps.llm_app"
PRICES = {"openai": (0.15, 0.60), "anthropic": (3.00, 15.00)}


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    server = ModelStub().start()
    yield server
    server.stop()


# One real kill, through the async SDK that streams every other call; every SDK, in one
# process: tests/integration/test_crash_inprocess.py.
@pytest.mark.parametrize("kind", ["openai-async"])
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


def _capped(client: durable.Client, workflow_id: str, stub: ModelStub) -> dict[str, object]:
    """What the world and the journal say of `capped_agent` at a stop: the stub's
    prompts, the calls journaled, the charges, and the workflow's status and gates."""
    ledger = client.budget(workflow_id)
    assert ledger is not None
    journaled = [s for s in client.steps(workflow_id) if s.step_name == LLM_CHAT]
    return {
        "status": client.get_workflow(workflow_id).status,
        "gates": [g["name"] for g in client.list_approvals(workflow_id)],
        "sent": sorted(_prompt(body) for _, body in stub.requests),
        "journaled": len([s for s in journaled if s.error is None]),
        "charged": [(c["dollars"], c["tokens"]) for c in ledger["charges"]],
        "spent": (ledger["spent"]["dollars"], ledger["spent"]["tokens"]),
    }


def _stopped(client: durable.Client, workflow_id: str) -> bool:
    return client.get_workflow(workflow_id).status in ("SUSPENDED", "SUCCESS", "ERROR")


def _worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "durable.cli", "worker", "--app", APP,
         "--lease-seconds", "1", "--poll-interval", "0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_call_the_cap_refuses_reaches_the_vendor_only_after_the_raise_and_once(
    database_url: str, subprocess_env: dict[str, str], stub: ModelStub
) -> None:
    """A worker runs two calls in sequence and then three gathered, $1.36 each, under a
    $2.50 cap: the second call's worst case ($1.94, set aside before sending) does not fit,
    so it waits at the gate unsent. The worker is SIGKILLed there; the budget is raised by
    $2.50, room for one gathered call more, and a second worker sends it and parks the
    workflow again; raised once more, the workflow finishes. The stub saw each call once,
    exactly the calls journaled, and every request it answered is charged what its usage
    says."""
    # The app is imported here, not with the module: every test process collects the
    # module, and the SDKs the app imports (openai, anthropic) cost seconds of CPU.
    from tests.apps import llm_app

    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url, "LLM_STUB_URL": stub.url}
    workflow_id = "capped"
    one = usage_of("q0")  # every prompt is two characters long: all cost the same
    price = (Decimal(one[0]) + Decimal(one[1])) / Decimal(100)  # $0.01 a token
    first = _worker(env)
    second = None
    try:
        with durable.Client(database_url) as client:
            client.submit(llm_app.capped_agent, workflow_id, workflow_id=workflow_id)
            wait_for(lambda: _stopped(client, workflow_id), timeout=30, what="the first gate")
            at_gate = _capped(client, workflow_id, stub)
            assert at_gate["status"] == "SUSPENDED", at_gate
            assert at_gate["gates"] and all(str(g).startswith("budget@") for g in at_gate["gates"])
            assert at_gate["sent"] == ["q0"], at_gate  # the refused call was not sent
            assert at_gate["charged"] == [(float(price), sum(one))], at_gate
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            second = _worker(env)
            client.raise_budget(workflow_id, dollars=2.5)  # $5: q1 and one gathered call
            wait_for(
                lambda: _stopped(client, workflow_id) and stub.count() > 1,
                timeout=30,
                what="the second gate",
            )
            at_gate = _capped(client, workflow_id, stub)
            assert at_gate["status"] == "SUSPENDED", at_gate
            assert stub.count() == 3, at_gate
            assert len(at_gate["charged"]) == 3, at_gate  # every request sent is charged
            client.raise_budget(workflow_id, dollars=10.0)
            wait_for(
                lambda: client.get_workflow(workflow_id).status in ("SUCCESS", "ERROR"),
                timeout=30,
                what="the workflow to finish",
            )
            done = _capped(client, workflow_id, stub)
            output = json.loads(str(client.get_workflow(workflow_id).output))
    finally:
        for worker in (first, second):
            if worker is not None:
                stop_worker(worker)
    prompts = [f"q{i}" for i in range(5)]
    assert done["status"] == "SUCCESS", done
    assert output == [f"answer to {p}" for p in prompts]
    assert done["sent"] == prompts  # each call sent once, none twice
    assert done["journaled"] == stub.count() == 5
    assert done["charged"] == [(float(price), sum(one))] * 5
    assert done["spent"][0] == pytest.approx(float(price * 5), abs=1e-9)
    assert done["spent"][1] == sum(one) * 5
