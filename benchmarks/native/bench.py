"""Client CPU per journaled step: durable's record path against a native one (an experiment).

Inside one running workflow (so its fence, `epoch` and `status = 'RUNNING'`, lets every
record in), in one process, in blocks of `--block` operations, the variants alternating
(rotated each round), this thread's CPU time (time.thread_time) per operation:

  step          a sync `@durable.step` called in the workflow: the whole step in place;
  step+native   the same step with the record path below swapped in (Run.keep and the
                sync driver's record call patched for the block): what adopting it gives;
  record        durable's record path alone: `run.keep` (encode, size check, exactness
                walk) and `SystemDB.run_on(conn, "record_step", params)` (psycopg);
  native        the extension's `record`: encode + exactness walk + PQsendQueryPrepared of
                the same statement on psycopg's own PGconn, the same parameters;
  psycopg       a bare psycopg `conn.execute` of the same statement with the output already
                encoded (psycopg's share of `record`);
  libpq         the extension's `execute` of the same prepared statement with the output
                already encoded (the floor of a native path: libpq and the kernel);
  keep          `run.keep` alone, no I/O: durable's encode, size check and exactness walk;
  encode        the extension's `encode` alone, no I/O: the same work in C.

`record`, `native`, `psycopg` and `libpq` write real journal rows of the running workflow
(positions from 1,000,000 on) through a second autocommit connection; each is one INSERT,
one round trip and one commit, as a step's record is. Medians over the rounds.

Build the extension first: sh benchmarks/native/build.sh
Run: python -m benchmarks.native.bench [--rounds 15] [--block 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg

import durable
from benchmarks.native.record import Statement, load
from benchmarks.step_overhead import DEFAULT_URL, prepared_target
from durable._core.run import Run
from durable._run.context import workflow_code_run
from durable.serialization import JSONSerializer, _plain, return_type

STEP_NAME = "bench.native.step"
VARIANTS = ("step", "step+native", "record", "native", "psycopg", "libpq", "keep", "encode")
WRITING = ("record", "native", "psycopg", "libpq")
DEFAULT_JSON = Path(__file__).resolve().parent.parent / "results" / "native_record.json"
_PAD = "x" * 64


def produce(i: int) -> dict[str, Any]:
    """The step's code: an output of about 100 bytes of JSON, as benchmarks/step_overhead.py."""
    return {"i": i, "ok": True, "pad": _PAD}


@contextmanager
def native_records(
    native: ModuleType, engine: durable.Engine, statement: Statement
) -> Iterator[None]:
    """Steps journaled through the extension for the duration: `Run.keep` encodes with it
    (durable's own keep when the value is not exact, or its annotation wants rebuilding)
    and the sync driver's record call sends with it."""
    db = engine.client.db
    original = Run.keep

    def keep(run: Run, value: Any, what: str, fn: Callable[..., Any]) -> tuple[str, Any]:
        s = run.settings
        if type(s.serializer) is JSONSerializer and _plain(return_type(fn)):
            text = native.encode(value, s.max_payload_bytes)
            if text is not None:
                return text, value
        return original(run, value, what, fn)

    def record(conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        return statement.execute(conn, params)

    Run.keep = keep  # type: ignore[method-assign]
    db.records.record = record  # type: ignore[method-assign]
    try:
        yield
    finally:
        Run.keep = original  # type: ignore[method-assign]
        del db.records.record


def measure(native: ModuleType, url: str, schema: str, rounds: int, block: int) -> dict[str, Any]:
    """Per-operation µs of thread CPU time of each variant, one sample per round."""
    registry = durable.Registry()
    step = durable.step(name=STEP_NAME, registry=registry)(produce)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}

    @durable.workflow(name="bench.native.workflow", registry=registry)
    def workflow() -> int:
        run = workflow_code_run()
        assert run is not None
        db = engine.client.db
        query = db._queries["record_step"]
        statement = Statement(native, "record_step", query)
        limit = run.settings.max_payload_bytes
        what = f"the output of step {STEP_NAME!r}"
        started = run.settings.clock.now()
        payload = JSONSerializer().dumps(produce(0))
        seqs = itertools.count(1_000_000)
        slot = statement.names.index("output")

        def params(seq: int, output: str | None) -> dict[str, Any]:
            return {
                "workflow_id": run.workflow_id,
                "epoch": run.epoch,
                "step_seq": seq,
                "step_name": STEP_NAME,
                "kind": "step",
                "output": output,
                "error": None,
                "attempts": 1,
                "child_workflow_id": None,
                "started_at": started,
            }

        with psycopg.connect(url, autocommit=True) as conn:
            address = statement.address(conn)
            written = 0

            def steps(n: int) -> None:
                for i in range(n):
                    step(i)

            def native_steps(n: int) -> None:
                with native_records(native, engine, statement):
                    for i in range(n):
                        step(i)

            def record(n: int) -> None:
                nonlocal written
                for _ in range(n):
                    seq = next(seqs)
                    text, _value = run.keep(produce(seq), what, produce)
                    written += db.run_on(conn, "record_step", params(seq, text), "count")

            def native_record(n: int) -> None:
                nonlocal written
                for _ in range(n):
                    seq = next(seqs)
                    values = statement.values(params(seq, None))
                    done = native.record(address, statement.name, values, slot, produce(seq), limit)
                    written += done[0]

            def bare_psycopg(n: int) -> None:
                nonlocal written
                for _ in range(n):
                    written += conn.execute(query, params(next(seqs), payload)).rowcount

            def bare_libpq(n: int) -> None:
                nonlocal written
                for _ in range(n):
                    values = statement.values(params(next(seqs), payload))
                    written += native.execute(address, statement.name, values)

            def keep_only(n: int) -> None:
                for i in range(n):
                    run.keep(produce(i), what, produce)

            def encode_only(n: int) -> None:
                for i in range(n):
                    native.encode(produce(i), limit)

            blocks: dict[str, Callable[[int], None]] = {
                "step": steps,
                "step+native": native_steps,
                "record": record,
                "native": native_record,
                "psycopg": bare_psycopg,
                "libpq": bare_libpq,
                "keep": keep_only,
                "encode": encode_only,
            }
            for name in VARIANTS:  # warm-up: statements prepared, caches filled
                blocks[name](20)
            for r in range(rounds):
                order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
                for name in order:
                    gc.collect()
                    start = time.thread_time_ns()
                    blocks[name](block)
                    samples[name].append((time.thread_time_ns() - start) / 1000.0 / block)
            expected = len(WRITING) * (20 + rounds * block)
            if written != expected:
                raise RuntimeError(f"{written} records written of {expected}: a fence refused")
        return rounds

    engine = durable.Engine(url, registry=registry, schema=schema)
    with engine:
        workflow()
    return samples


def summary(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, values in samples.items():
        p25, p50, p75 = statistics.quantiles(values, n=4, method="inclusive")
        out[name] = {"median": p50, "p25": p25, "p75": p75}
    return out


def table(summ: dict[str, dict[str, float]]) -> str:
    floor, step, record = (summ[n]["median"] for n in ("psycopg", "step", "record"))
    lines = [
        f"{'variant':<12} {'µs/op':>7} {'p25-p75':>13} {'x psycopg':>10} {'x record':>9} "
        f"{'x step':>7}",
    ]
    for name in VARIANTS:
        s = summ[name]
        lines.append(
            f"{name:<12} {s['median']:>7.1f} {s['p25']:>6.1f}-{s['p75']:<6.1f} "
            f"{s['median'] / floor:>10.2f} {s['median'] / record:>9.2f} "
            f"{s['median'] / step:>7.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.native.bench", description=__doc__)
    parser.add_argument(
        "--database-url", default=os.environ.get("DURABLE_BENCH_ADMIN_URL", DEFAULT_URL)
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None, help=f"e.g. {DEFAULT_JSON}")
    args = parser.parse_args(argv)
    native = load()
    if native is None:
        sys.exit("the extension is not built: sh benchmarks/native/build.sh")
    load_before = os.getloadavg()[0]
    with prepared_target(args.database_url, scratch=True) as target:
        samples = measure(native, target.url, target.schema, args.rounds, args.block)
    load_after = os.getloadavg()[0]
    summ = summary(samples)
    print(
        f"client CPU per operation (time.thread_time), medians of {args.rounds} rounds of "
        f"{args.block}, variants alternating; load average {load_before:.1f} before, "
        f"{load_after:.1f} after, {os.cpu_count()} CPUs"
    )
    print(table(summ))
    result = {
        "rounds": args.rounds,
        "block": args.block,
        "psycopg": psycopg.__version__,
        "psycopg_impl": psycopg.pq.__impl__,
        "libpq": psycopg.pq.version(),
        "python": sys.version.split()[0],
        "load_average": [load_before, load_after],
        "cpus": os.cpu_count(),
        "summary": summ,
        "samples": samples,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", "utf-8")
    return result


if __name__ == "__main__":
    main()
