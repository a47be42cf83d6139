"""N async workflows in one process, each awaiting a 1 s async step and then a durable
sleep long enough to suspend (its task ends; the engine's keeper resumes it when due).
Prints one JSON line: how many finished, the wall time, the most threads the process
ever ran (sampled every 50 ms) and its peak memory.

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

import durable

registry = durable.Registry()


@durable.step(registry=registry)
async def call_model(i: int) -> int:
    await asyncio.sleep(1.0)  # a slow model call: no thread, no connection held
    return i


@durable.workflow(registry=registry)
async def agent(i: int) -> int:
    value = await call_model(i)
    await durable.sleep_async(2.0)  # suspends: the workflow holds nothing while it waits
    return value


async def main(n: int) -> None:
    peak = {"threads": threading.active_count()}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak["threads"] = max(peak["threads"], threading.active_count())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    url = os.environ["DURABLE_DATABASE_URL"]
    began = time.monotonic()
    async with durable.Engine(url, registry=registry, max_workers=4, max_async=n) as engine:
        handles = [await engine.start_async(agent, i, workflow_id=f"agent-{i}") for i in range(n)]
        started = time.monotonic() - began
        results = await asyncio.gather(*(h.result(timeout=600) for h in handles))
    wall = time.monotonic() - began
    stop.set()
    print(
        json.dumps(
            {
                "finished": sum(1 for i, r in enumerate(results) if r == i),
                "wall_seconds": round(wall, 2),
                "start_seconds": round(started, 2),
                "peak_threads": peak["threads"],
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
