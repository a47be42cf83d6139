"""A user's first program, run as a script (`python app.py MODE ID`): its workflows are
stored under the module's import name (`app.support_flow`), so `durable worker --app app`
can recover what the script started."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import durable

LOG = Path(os.environ.get("APP_LOG", "calls.log"))
kids = durable.Queue("kids", concurrency=2)


@durable.step()
def prepare(text: str) -> str:
    with LOG.open("a") as f:
        f.write(f"prepare {text}\n")
    return text.upper()


@durable.workflow()
def support_flow(text: str) -> str:
    ready = prepare(text)
    reply = durable.recv("reply", timeout=600)
    decision = durable.approval("ship")
    return f"{ready}:{reply}:{decision.approved}"


@durable.step()
def long_step(text: str) -> str:
    """Hangs on its first run (the test kills the script there), returns on the next."""
    with LOG.open("a") as f:
        f.write(f"long_step {text}\n")
    marker = LOG.with_suffix(".hung")
    if not marker.exists():
        marker.touch()
        time.sleep(3600)
    return text[::-1]


@durable.workflow()
def long_flow(text: str) -> str:
    return long_step(prepare(text))


@durable.workflow()
def child(n: int) -> int:
    return n * n


@durable.workflow()
def fan_out(n: int) -> int:
    handles = [kids.enqueue(child, i) for i in range(n)]
    return sum(h.result(timeout=60) for h in handles)


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("APP_LOG_LEVEL", "WARNING"))
    mode, workflow_id = sys.argv[1], sys.argv[2]
    lease = float(os.environ.get("APP_LEASE_SECONDS", "30"))
    with durable.Engine(grace_seconds=5, lease_seconds=lease) as engine:
        if mode == "long":
            print(engine.start(long_flow, "hello", workflow_id=workflow_id).result(), flush=True)
        elif mode == "fan-out":
            print(engine.start(fan_out, 4, workflow_id=workflow_id).result(timeout=60))
        else:
            handle = engine.start(support_flow, "hello", workflow_id=workflow_id)
            print("started", flush=True)
            if mode == "hang":
                time.sleep(3600)  # killed by the test
            print(handle.result(timeout=60), flush=True)
