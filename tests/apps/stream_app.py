"""A workflow that streams N values, one every few milliseconds, then closes the stream.

    python -m tests.apps.stream_app (sync|async) WORKFLOW_ID N
Crash points: DURABLE_CRASH_POINTS=after_stream_write:K dies right after the K-th write.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import durable

registry = durable.Registry()


@durable.workflow(registry=registry, name="stream.producer")
def producer(n: int) -> int:
    for i in range(n):
        time.sleep(0.005)
        durable.write_stream("progress", {"i": i})
    durable.close_stream("progress")
    return n


@durable.workflow(registry=registry, name="stream.producer.async")
async def producer_async(n: int) -> int:
    for i in range(n):
        await asyncio.sleep(0.005)
        await durable.write_stream_async("progress", {"i": i})
    await durable.close_stream_async("progress")
    return n


async def main(driver: str, workflow_id: str, n: int) -> None:
    fn = producer_async if driver == "async" else producer
    url = os.environ["DURABLE_DATABASE_URL"]
    async with durable.Engine(url, registry=registry, lease_seconds=1) as engine:
        handle = await engine.start_async(fn, n, workflow_id=workflow_id)
        print(json.dumps(await handle.result(timeout=60)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
