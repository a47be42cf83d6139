"""Human approval gates: a workflow waits across a worker restart holding no worker, is
approved from the CLI in another process, resumes and finishes; the first decision wins."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import durable
from durable import errors
from tests.acceptance.workers import client, scalar, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app, vendor


def cli(env: dict[str, str], url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args, "--database-url", url],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_gate_survives_restart_and_first_decision_wins(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(counter_app.big_refund, 5000, None, workflow_id="gate-1")
        first = start_worker(subprocess_env, database_url, concurrency=1)
        wait_for(lambda: handle.status() == "SUSPENDED", what="the workflow to suspend")
        # Waiting holds nothing: no owner, no lease, the worker's only slot is free.
        assert scalar(database_url, "SELECT owner FROM durable.workflows") is None
        other = engine.submit(counter_app.three_steps, "other", workflow_id="other")
        assert other.result(timeout=30) == ["S1", "S2", "S3"]
        assert stop_worker(first) == 0  # the worker restarts while the gate waits

        listed = cli(subprocess_env, database_url, "approvals", "list", "--json")
        gates = json.loads(listed.stdout)
        assert [(g["workflow_id"], g["name"], g["status"]) for g in gates] == [
            ("gate-1", "refund-over-limit", "waiting")
        ]
        assert gates[0]["payload"] == {"cents": 5000}
        approved = cli(
            subprocess_env,
            database_url,
            "approvals",
            "approve",
            "gate-1",
            "refund-over-limit",
            "--comment",
            "ok by ops",
        )
        assert approved.returncode == 0, approved.stderr

        second = start_worker(subprocess_env, database_url)
        try:
            assert handle.result(timeout=60) == "refunded 5000 (ok by ops)"
        finally:
            stop_worker(second)
        assert vendor.moved(database_url) == [5000]
        # The step before the gate ran once, though the workflow was resumed.
        assert [w for _, w, _ in world(database_url, "big")] == ["before-gate"]

        denied = cli(
            subprocess_env, database_url, "approvals", "deny", "gate-1", "refund-over-limit"
        )
        assert denied.returncode == 1
        assert (
            "already decided (approved)" in denied.stderr and "first decision wins" in denied.stderr
        )
        with pytest.raises(errors.ApprovalConflictError):
            engine.decide("gate-1", "refund-over-limit", False)
        engine.decide("gate-1", "refund-over-limit", True)  # repeating the decision is harmless
        unknown = cli(subprocess_env, database_url, "approvals", "approve", "gate-1", "nope")
        assert unknown.returncode == 1 and "approvals list" in unknown.stderr
        with pytest.raises(errors.UnknownApprovalError):
            engine.decide("missing", "refund-over-limit", True)


def test_gate_timeout_decides_by_default(database_url: str) -> None:
    counter_app.setup(database_url)
    with durable.Engine(
        database_url, registry=counter_app.registry, worker=True, poll_interval=0.05
    ) as engine:
        handle = engine.submit(counter_app.big_refund, 7000, 0.5, workflow_id="gate-2")
        assert handle.result(timeout=30) == "not refunded (timed out)"
        (gate,) = engine.list_approvals("gate-2", waiting_only=False)
        assert gate["status"] == "timed_out"
    assert vendor.moved(database_url) == []


def test_effect_that_requires_approval(database_url: str) -> None:

    reg = durable.Registry()
    calls: list[str] = []

    @durable.effect(registry=reg, name="wire", idempotent=True, requires_approval=True)
    def wire(to: str, *, idempotency_key: str) -> str:
        calls.append(to)
        return f"wired:{to}"

    @durable.workflow(registry=reg, name="wires")
    def wires() -> list[str]:
        out = [wire("ann")]
        try:
            out.append(wire("bob"))
        except errors.ApprovalDeniedError as exc:
            out.append(f"denied:{exc.comment}")
        return out

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.submit(wires, workflow_id="w1")

        def gate_waiting(name: str) -> bool:
            return any(g["name"] == name for g in engine.list_approvals("w1"))

        wait_for(lambda: gate_waiting("wire#0"), what="the first gate")
        assert calls == []  # nothing is wired before a person approves
        engine.decide("w1", "wire#0", True)
        wait_for(lambda: gate_waiting("wire#1"), what="the second gate")
        engine.decide("w1", "wire#1", False, comment="not bob")
        assert handle.result(timeout=20) == ["wired:ann", "denied:not bob"]
    assert calls == ["ann"]
