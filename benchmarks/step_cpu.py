"""The client CPU a step costs, measured in place, beside the floor INSERT's.

Wall times on a shared machine mostly measure the server and the neighbours; what durable
itself adds on the client is its CPU. This benchmark measures it where a step runs:
inside one running workflow, `time.thread_time()` (the CPU of the thread that runs the
workflow body, the step's code and its record) around blocks of steps, and around blocks
of the floor between them, in the same thread and process:

  floor        one bare psycopg autocommit `INSERT` of the same payload (`conn.execute`,
               a new cursor each, as an application writes);
  sync step    a `@durable.step` of a sync workflow (its record is one statement);
  async step   an `async def` step of an `async def` workflow, on the benchmark's event
               loop (the loop's thread: the driver, the step, its record);
  start        `engine.start(wf).result()` of a workflow of one step, this process's CPU
               (all its threads: the run may go on a worker's), per call.

Blocks alternate (floor, steps, floor, steps, ...) so that drift cancels; the report is
the median over blocks, in µs per operation. `--json PATH` writes the numbers.

    python -m benchmarks.step_cpu [--blocks 40] [--per-block 50] [--starts 200]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

import durable
from benchmarks.step_overhead import (
    DEFAULT_URL,
    Target,
    floor_payload,
    prepared_target,
    step_output,
)

# Per-block CPU samples, in µs per operation, appended by the workflows' bodies.
_samples: dict[str, list[float]] = {}


def _note(kind: str, cpu_ns: int, n: int) -> None:
    _samples.setdefault(kind, []).append(cpu_ns / 1000.0 / n)


def make_app(
    conn: psycopg.Connection[Any], insert: bytes, payload: str
) -> tuple[durable.Registry, Any, Any, Any]:
    """(registry, sync workflow, async workflow, one-step workflow); the first two measure
    blocks of `per` steps, each after a block of `per` floor INSERTs."""
    registry = durable.Registry()

    def floor_block(per: int) -> None:
        wid = str(uuid.uuid4())
        t = time.thread_time_ns()
        for i in range(per):
            conn.execute(insert, (wid, i, "bench.step", payload))
        _note("floor", time.thread_time_ns() - t, per)

    @durable.step(name="bench.cpu.step", registry=registry)
    def step(i: int) -> dict[str, Any]:
        return step_output(i)

    @durable.workflow(name="bench.cpu.workflow", registry=registry)
    def workflow(blocks: int, per: int) -> int:
        for _ in range(blocks):
            floor_block(per)
            t = time.thread_time_ns()
            for i in range(per):
                step(i)
            _note("sync_step", time.thread_time_ns() - t, per)
        return blocks

    @durable.step(name="bench.cpu.astep", registry=registry)
    async def astep(i: int) -> dict[str, Any]:
        return step_output(i)

    @durable.workflow(name="bench.cpu.aworkflow", registry=registry)
    async def aworkflow(blocks: int, per: int) -> int:
        for _ in range(blocks):
            floor_block(per)
            t = time.thread_time_ns()
            for i in range(per):
                await astep(i)
            _note("async_step", time.thread_time_ns() - t, per)
        return blocks

    @durable.workflow(name="bench.cpu.one", registry=registry)
    def one() -> int:
        step(0)
        return 1

    return registry, workflow, aworkflow, one


def measure(target: Target, blocks: int, per: int, starts: int) -> dict[str, Any]:
    _samples.clear()
    with psycopg.connect(target.url, autocommit=True) as conn:
        insert = target.floor_insert(conn)
        registry, workflow, aworkflow, one = make_app(conn, insert, floor_payload())
        engine = target.engine(registry)
        loop = asyncio.new_event_loop()
        try:
            with engine:
                workflow(2, per)  # warm-up: connections, prepared statements, caches
                loop.run_until_complete(aworkflow(2, per))
                for _ in range(20):
                    engine.start(one).result()
                _samples.clear()
                gc.collect()
                gc.disable()
                try:
                    workflow(blocks, per)
                    loop.run_until_complete(aworkflow(blocks, per))
                    start_cpu = []
                    for _ in range(max(1, starts // 20)):
                        t = time.process_time_ns()
                        for _ in range(20):
                            engine.start(one).result()
                        start_cpu.append((time.process_time_ns() - t) / 1000.0 / 20)
                finally:
                    gc.enable()
                # As asyncio.run ends a loop: what is left is cancelled (the engine's host
                # of this loop then gives back its connections).
                left = asyncio.all_tasks(loop)
                for task in left:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        finally:
            loop.close()
    out: dict[str, Any] = {k: statistics.median(v) for k, v in _samples.items()}
    out["start_result"] = statistics.median(start_cpu)
    out["sync_over_floor"] = out["sync_step"] / out["floor"]
    out["async_over_sync"] = out["async_step"] / out["sync_step"]
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default=DEFAULT_URL, help="admin URL (a scratch DB is made)")
    parser.add_argument("--blocks", type=int, default=40, help="blocks of each kind (40)")
    parser.add_argument("--per-block", type=int, default=50, help="operations per block (50)")
    parser.add_argument("--starts", type=int, default=200, help="start().result() calls (200)")
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    with prepared_target(args.url, scratch=True) as target:
        result = measure(target, args.blocks, args.per_block, args.starts)
    for key, value in result.items():
        unit = "" if "_over_" in key else " µs"
        print(f"{key:16} {value:8.2f}{unit}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
