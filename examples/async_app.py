"""An asyncio application that starts durable workflows and awaits them without blocking
its event loop: while five research workflows call a (simulated) model in parallel, a
heartbeat coroutine keeps ticking on the same loop.

    python examples/async_app.py

Uses DURABLE_DATABASE_URL if set, else the embedded PostgreSQL server. Run it twice: the
second run finds the workflows finished and replays nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import durable


@durable.step(name="async_app.ask_model", retries=2, timeout=10)
async def ask_model(question: str, part: str) -> str:
    await asyncio.sleep(0.5)  # an awaited model call: the loop runs other work meanwhile
    return f"{part} of {question}"


@durable.workflow(name="async_app.research")
async def research(question: str) -> list[str]:
    parts = ("history", "causes", "effects")
    return list(await asyncio.gather(*(ask_model(question, p) for p in parts)))


async def heartbeat(ticks: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        ticks.append(time.monotonic())
        await asyncio.sleep(0.05)


async def main() -> None:
    ticks: list[float] = []
    stop = asyncio.Event()
    beating = asyncio.create_task(heartbeat(ticks, stop))
    async with durable.Engine() as engine:
        questions = ["tides", "eclipses", "seasons", "monsoons", "auroras"]
        began = time.monotonic()
        handles = [
            await engine.start_async(research, q, workflow_id=f"async-app-{q}") for q in questions
        ]
        # Awaiting the results lets the loop run the workflows (they are tasks on it) and
        # the heartbeat alike; the five run at once, so this takes ~0.5 s, not 2.5 s.
        results = await asyncio.gather(*(h.result(timeout=60) for h in handles))
        ended = time.monotonic()
        for handle, result in zip(handles, results, strict=True):
            print(handle.workflow_id, result)
    stop.set()
    await beating
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    during = sum(1 for t in ticks if began <= t <= ended)
    print(f"workflows: {len(handles)} in {ended - began:.2f} s")
    print(f"heartbeat: {len(ticks)} ticks, longest gap {max(gaps, default=0) * 1000:.0f} ms")
    print(f"heartbeat while the workflows ran: {during} ticks")


if __name__ == "__main__":
    asyncio.run(main())
