"""N async workflows in one process, each awaiting a 1 s async step and then a durable
sleep long enough to suspend (its task ends; the engine's keeper resumes it when due).
Prints one JSON line: how many finished, the wall time, the most threads the process
ever ran (Python threads and the kernel's count, sampled every 50 ms), the most workflows
seen SUSPENDED at once, and the peak memory.

    python -m tests.apps.concurrency_app N
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import threading
import time
from typing import Any

import psycopg

import durable

registry = durable.Registry()


@durable.step(registry=registry)
async def call_model(i: int) -> int:
    await asyncio.sleep(1.0)  # a slow model call: no thread, no connection held
    return i


@durable.workflow(registry=registry)
async def agent(i: int) -> int:
    value = await call_model(i)
    await durable.sleep_async(3.0)  # suspends: the workflow holds nothing while it waits
    return value


def proc_status(field: str) -> int:
    """A number from /proc/self/status (Threads, or VmHWM in kB); 0 where there is none."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Every 50 ms: the process's threads; every 250 ms: how many workflows are SUSPENDED
    (on a connection of its own, in this same thread)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name="sampler")
        self.url = url
        self.stop = threading.Event()
        self.peak: dict[str, int] = {"threads": 0, "os_threads": 0, "suspended": 0}

    def sample_threads(self) -> None:
        self.peak["threads"] = max(self.peak["threads"], threading.active_count())
        self.peak["os_threads"] = max(self.peak["os_threads"], proc_status("Threads"))

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            k = 0
            while not self.stop.wait(0.05):
                self.sample_threads()
                k += 1
                if k % 5 == 0:
                    row = conn.execute(
                        "SELECT count(*) FROM durable.workflows WHERE status = 'SUSPENDED'"
                    ).fetchone()
                    if row is not None:
                        self.peak["suspended"] = max(self.peak["suspended"], int(row[0]))


async def main(n: int) -> None:
    url = os.environ["DURABLE_DATABASE_URL"]
    sampler = Sampler(url)
    sampler.sample_threads()
    sampler.start()
    began = time.monotonic()
    # max_async=n: all n may be in their 1 s step at once (the default admits 1000).
    async with durable.Engine(url, registry=registry, max_workers=4, max_async=n) as engine:
        handles = [await engine.start_async(agent, i, workflow_id=f"agent-{i}") for i in range(n)]
        started = time.monotonic() - began
        results = await asyncio.gather(*(h.result(timeout=600) for h in handles))
    wall = time.monotonic() - began
    sampler.stop.set()
    sampler.join()
    report: dict[str, Any] = {
        "finished": sum(1 for i, r in enumerate(results) if r == i),
        "wall_seconds": round(wall, 2),
        "start_seconds": round(started, 2),
        "peak_threads": sampler.peak["threads"],
        "peak_os_threads": sampler.peak["os_threads"],
        "peak_suspended": sampler.peak["suspended"],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "vm_hwm_mb": round(proc_status("VmHWM") / 1024, 1),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
