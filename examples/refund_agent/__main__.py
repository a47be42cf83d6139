"""Run the chapter's refund example with real processes.

    python -m examples.refund_agent [--ledger-dir DIR]

1. start the vendor (HTTP, its own SQLite ledger);
2. submit a workflow refunding orders of 10, 25, 40 and 5;
3. a worker runs it and is SIGKILLed after the vendor accepted the third refund and before
   it was recorded;
4. a fresh worker resumes it: the pending refund is reconciled with the vendor, not paid
   again;
5. the same crash with the naive workflow (no ledger, random keys) pays 40 twice.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import durable
from examples.refund_agent import workflow
from examples.refund_agent.vendor import Client

ORDERS = [["o1", 10], ["o2", 25], ["o3", 40], ["o4", 5]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_vendor(ledger: Path) -> tuple[subprocess.Popen[bytes], Client]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.refund_agent.vendor", str(port), str(ledger)]
    )
    client = Client(f"http://127.0.0.1:{port}")
    for _ in range(100):
        try:
            client.moved()
            return proc, client
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the vendor did not start")


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
            "examples.refund_agent.workflow",
            "--lease-seconds",
            "1",
            "--poll-interval",
            "0.1",
        ],
        env=child,
    )


def run_once(
    engine: durable.Engine, env: dict[str, str], fn: object, crash: str, run_id: str
) -> object:
    handle = engine.submit(fn, ORDERS, workflow_id=run_id)  # type: ignore[arg-type]
    print(f"start  {run_id}", flush=True)
    first = worker(env, crash)
    first.wait(timeout=120)
    print(
        "  CRASH     worker SIGKILLed after the vendor acted on o3, before recording it", flush=True
    )
    print(f"resume {run_id} in a fresh worker", flush=True)
    second = worker(env)
    try:
        return handle.result(timeout=120)
    finally:
        second.terminate()
        second.wait(timeout=60)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description="the chapter's refund example")
    parser.add_argument("--ledger-dir", default=None, help="where the vendor keeps its ledgers")
    args = parser.parse_args(argv)
    ledger_dir = Path(args.ledger_dir or tempfile.mkdtemp(prefix="refund-vendor-"))
    ledger_dir.mkdir(parents=True, exist_ok=True)
    suffix = uuid.uuid4().hex[:6]
    summary: dict[str, object] = {}

    with durable.Engine(registry=workflow.registry) as engine:
        env = dict(os.environ)
        env["DURABLE_DATABASE_URL"] = engine.client.database_url
        env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
        env["DURABLE_LOG_LEVEL"] = "ERROR"

        vendor_proc, vendor = start_vendor(ledger_dir / "ledger.sqlite")
        env["REFUND_VENDOR_URL"] = vendor.base_url
        try:
            total = run_once(
                engine, env, workflow.refund_orders, "effect_after_call:3", f"run-4711-{suffix}"
            )
            moved = vendor.moved()
            effects = engine.client.effects(f"run-4711-{suffix}")
            ledger_total = sum(
                json.loads(e["result"])["cents"] for e in effects if e["status"] == "applied"
            )
            print(f"\npayments that actually moved: {moved}")
            print(
                f"total moved: {sum(moved)}   ledger total: {ledger_total}   "
                f"orders done: {len(effects)}/{len(ORDERS)}\n"
            )
            summary["durable"] = {"moved": moved, "total": total, "ledger_total": ledger_total}
        finally:
            vendor_proc.terminate()
            vendor_proc.wait()

        naive_proc, naive_vendor = start_vendor(ledger_dir / "naive-ledger.sqlite")
        env["REFUND_VENDOR_URL"] = naive_vendor.base_url
        try:
            run_once(
                engine,
                env,
                workflow.naive_refund_orders,
                "before_step_record:3",
                f"naive-4711-{suffix}",
            )
            naive_moved = naive_vendor.moved()
            doubled = [c for c in naive_moved if c == 40]
            print(f"\nwithout idempotency the same resume moves: {doubled}")
            summary["naive"] = {"moved": naive_moved}
        finally:
            naive_proc.terminate()
            naive_proc.wait()
    summary["ledger_dir"] = str(ledger_dir)
    return summary


if __name__ == "__main__":
    main()
