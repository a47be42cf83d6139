"""A pydantic-ai agent run durably by worker processes.

    python -m examples.agent_pydantic_ai [--outbox DIR]

1. submit the agent (3 questions, budget $0.45); a worker runs it, streaming progress;
2. the worker is SIGKILLed after the agent's third journaled call (model, tool, model);
3. a fresh worker resumes: the recorded model responses and tool result replay, nothing is
   called twice, and the budget goes on from what was spent;
4. the cap refuses a request that would pass $0.45: the agent pauses at the budget gate;
   an operator raises the budget by $0.20;
5. the agent finishes; a reader that followed the stream saw every progress value once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import durable

try:
    from examples.agent_pydantic_ai import workflow
except ModuleNotFoundError as missing:  # the extra is not installed: say how to get it
    sys.exit(f"{missing}: this example needs pip install 'durable-pg[pydantic-ai]'")


def worker(env: dict[str, str], crash: str | None = None) -> subprocess.Popen[bytes]:
    child = {**env, **({"DURABLE_CRASH_POINTS": crash} if crash else {})}
    app = "examples.agent_pydantic_ai.workflow"
    return subprocess.Popen(
        [sys.executable, "-m", "durable.cli", "worker", "--app", app,
         "--lease-seconds", "1", "--poll-interval", "0.1"],
        env=child,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="a durable pydantic-ai agent")
    parser.add_argument("--outbox", default=None, help="where real calls are logged")
    args = parser.parse_args(argv)
    outbox = Path(args.outbox or tempfile.mkdtemp(prefix="agent-outbox-"))
    run_id = f"agent-{uuid.uuid4().hex[:6]}"
    progress: list[dict[str, Any]] = []
    with durable.Engine(registry=workflow.registry) as engine:
        env = {
            **os.environ,
            "DURABLE_DATABASE_URL": engine.client.database_url,
            "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
            "DURABLE_LOG_LEVEL": "ERROR",
            "AGENT_OUTBOX": str(outbox),
        }
        handle = engine.submit(workflow.research, workflow.QUESTIONS, workflow_id=run_id)
        reader = threading.Thread(
            target=lambda: progress.extend(engine.read_stream(run_id, "progress")), daemon=True
        )
        reader.start()
        print(f"start  {run_id}  budget ${workflow.BUDGET.dollars:.2f}", flush=True)
        first = worker(env, crash="after_step_record:3")
        first.wait(timeout=120)
        spent = engine.budget(run_id)
        assert spent is not None
        print(f"  CRASH   worker SIGKILLed mid-agent; spent ${spent['spent']['dollars']:.2f}")
        second = worker(env)
        try:
            deadline = time.monotonic() + 60
            while handle.status() != durable.WorkflowStatus.SUSPENDED:
                assert time.monotonic() < deadline, "the agent did not pause"
                time.sleep(0.05)
            gate = engine.list_approvals(run_id)[0]
            print(f"  PAUSED  at {gate['name']}: the cap refused a request past $0.45")
            raised = engine.raise_budget(run_id, dollars=0.20, decided_by="operator")
            print(f"  raised  budget to ${raised['limits']['dollars']:.2f}")
            answers = handle.result(timeout=120)
            reader.join(timeout=30)
        finally:
            second.terminate()
            second.wait(timeout=60)
        ledger = engine.budget(run_id)
        assert ledger is not None
    calls = [json.loads(line) for line in (outbox / "calls.jsonl").read_text().splitlines()]
    made = Counter((c["call"], c["topic"]) for c in calls)
    print(f"answers: {answers}")
    print(f"progress seen by the reader: {[p['done'] for p in progress]}")
    print(f"real calls: {sum(made.values())} ({dict(made)})")
    print(f"spent ${ledger['spent']['dollars']:.2f}, {ledger['spent']['tokens']} tokens")
    return {"answers": answers, "calls": calls, "progress": progress, "ledger": ledger}


if __name__ == "__main__":
    main()
