"""Run the research agent the way it runs in production: real worker processes.

    python -m examples.research_agent [--outbox DIR]

1. submit the agent (budget $0.20); a worker plans and calls tools, printing the budget
   left after each step;
2. the worker is SIGKILLed right after its second tool call was recorded;
3. a fresh worker resumes: the journaled calls are not made again and the budget goes on
   from what was spent, not from zero;
4. the budget runs out before the third tool call: the agent pauses at a budget gate
   (SUSPENDED, no worker slot held); an operator raises the budget by $0.25;
5. the agent finishes and sends its report (an effect: exactly one file in the outbox).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import durable
from examples.research_agent import workflow


def worker(env: dict[str, str], crash: str | None = None) -> subprocess.Popen[bytes]:
    child = dict(env)
    if crash:
        child["DURABLE_CRASH_POINTS"] = crash
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "durable.cli",
            "worker",
            "--app",
            "examples.research_agent.workflow",
            "--lease-seconds",
            "1",
            "--poll-interval",
            "0.1",
        ],
        env=child,
    )


def wait_until(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the agent did not get there in time")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="a research agent that survives a SIGKILL")
    parser.add_argument("--outbox", default=None, help="where tools log and reports go")
    args = parser.parse_args(argv)
    outbox = Path(args.outbox or tempfile.mkdtemp(prefix="research-outbox-"))
    run_id = f"research-{uuid.uuid4().hex[:6]}"

    with durable.Engine(registry=workflow.registry) as engine:
        env = dict(os.environ)
        env["DURABLE_DATABASE_URL"] = engine.client.database_url
        env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
        env["DURABLE_LOG_LEVEL"] = "ERROR"
        env["RESEARCH_OUTBOX"] = str(outbox)

        handle = engine.submit(
            workflow.research_agent, "What does tidal energy cost in 2026?", workflow_id=run_id
        )
        print(f"start  {run_id}  budget ${workflow.BUDGET.dollars:.2f}", flush=True)
        # Charged records: plan, decide, search, decide, read -> killed after the 5th.
        first = worker(env, crash="after_step_record:5")
        first.wait(timeout=120)
        spent = engine.budget(run_id)
        assert spent is not None
        print(
            f"  CRASH     worker SIGKILLed after its second tool call; "
            f"spent so far ${spent['spent']['dollars']:.2f}",
            flush=True,
        )
        print(f"  state     {json.dumps(engine.get_state(run_id))}", flush=True)
        print(f"resume {run_id} in a fresh worker", flush=True)
        second = worker(env)
        try:
            wait_until(lambda: handle.status() == durable.WorkflowStatus.SUSPENDED)
            gate = next(g for g in engine.list_approvals() if g["workflow_id"] == run_id)
            ledger = engine.budget(run_id)
            assert ledger is not None
            print(
                f"  PAUSED    at gate {gate['name']}: {ledger['exhausted']}",
                flush=True,
            )
            raised = engine.raise_budget(run_id, dollars=0.25, decided_by="operator")
            print(f"  raised    budget to ${raised['limits']['dollars']:.2f}", flush=True)
            result = handle.result(timeout=120)
        finally:
            second.terminate()
            second.wait(timeout=60)

        ledger = engine.budget(run_id)
        assert ledger is not None
        calls = engine.client.tool_calls(run_id)
        turns = engine.client.conversation(run_id)
        state = engine.get_state(run_id)
    runs = [json.loads(line) for line in (outbox / "tool_runs.jsonl").read_text().splitlines()]
    reports = sorted(p.name for p in outbox.glob("report-*.txt"))
    print(f"\ntool calls made: {[r['tool'] for r in runs]}")
    print(f"tool calls recorded: {[c['tool'].split('.')[-1] for c in calls]}")
    print(
        f"spent ${ledger['spent']['dollars']:.2f} of ${ledger['limits']['dollars']:.2f}, "
        f"{ledger['spent']['tokens']} tokens, {len(ledger['charges'])} charged steps"
    )
    print(f"conversation: {len(turns)} turns; progress {state['done']}/{len(state['plan'])}")
    print(f"outbox: {reports}")
    return {
        "workflow_id": run_id,
        "result": result,
        "outbox": str(outbox),
        "tool_runs": runs,
        "ledger": ledger,
        "reports": reports,
    }


if __name__ == "__main__":
    main()
