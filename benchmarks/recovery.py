"""How fast workers recover interrupted workflows.

Sets up N workflows of 10 journaled steps each that look exactly like the aftermath of a
crash (status RUNNING, owned by a dead executor, lease expired, every step recorded but
the outcome never written), then starts a worker and times until all N are SUCCESS.
Each recovery is a claim (batched, FOR UPDATE SKIP LOCKED), a journal read (batched), a
replay of 10 steps from the journal and one fenced status write.

With `--processes P` (repeatable) the worker is the command users run, `durable worker
--processes P` (P processes sharing the claims), timed from its start, start-up included;
without it, an engine's worker loop in this process.

Beside the times, per workflow: the worker's CPU, the server's (the utime + stime of the
database's backends from /proc, sampled as they run), statements and commits.

    python -m benchmarks.recovery --n 1000 --n 10000 [--processes 1 --processes 2]
                                  [--out PATH | --save]   (no results file unless asked)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

import durable
from benchmarks._common import (
    CPUSampler,
    add_output_args,
    backend_pid,
    database_backends,
    database_commits,
    wait_for_success,
    write_results,
)

ADMIN_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
ROOT = Path(__file__).resolve().parent.parent
STEPS = 10

registry = durable.Registry()


@durable.step(registry=registry, name="bench.step")
def bench_step(i: int) -> int:
    return i


@durable.workflow(registry=registry, name="bench.ten_steps")
def ten_steps(n: int) -> int:
    return sum(bench_step(i) for i in range(n))


def _with_db(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo("", **{k: str(v) for k, v in info.items()})


def make_interrupted(url: str, n: int) -> None:
    """N crashed workflows: every step journaled, outcome never written, lease expired."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO durable.workflows (workflow_id, name, status, inputs, owner, epoch,
                lease_expires_at)
            SELECT 'wf-' || g, 'bench.ten_steps', 'RUNNING',
                '{"args":[10],"kwargs":{}}', 'dead-executor', 1, now() - interval '1 minute'
            FROM generate_series(1, %(n)s) AS g
            """,
            {"n": n},
        )
        conn.execute(
            """
            INSERT INTO durable.steps (workflow_id, step_seq, step_name, kind, output)
            SELECT 'wf-' || g, s, 'bench.step', 'step', s::text
            FROM generate_series(1, %(n)s) AS g, generate_series(0, %(steps)s - 1) AS s
            """,
            {"n": n, "steps": STEPS},
        )
        conn.execute("VACUUM ANALYZE durable.workflows")
        conn.execute("VACUUM ANALYZE durable.steps")


def recover_all(
    url: str, n: int, concurrency: int, timeout: float = 600.0
) -> tuple[float, float, int]:
    """(seconds until one worker has finished all N, this process's CPU seconds over them,
    the statements its engine sent); checks every workflow's output (the sum its 10
    replayed steps return), so a recovery that skips or garbles work fails."""
    engine = durable.Engine(url, registry=registry, max_workers=concurrency, poll_interval=0.05)
    with engine:
        stop = threading.Event()
        statements = engine.client.db.counters.statements
        cpu = time.process_time()
        start = time.perf_counter()
        thread = threading.Thread(target=engine.run_worker, args=(stop,), daemon=True)
        thread.start()
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                wait_for_success(conn, n, timeout, "recovery")
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - cpu
                statements = engine.client.db.counters.statements - statements
                right = conn.execute(
                    "SELECT count(*) FROM durable.workflows WHERE output = %s",
                    [json.dumps(sum(range(STEPS)))],
                ).fetchone()
                if right is None or right[0] != n:
                    raise RuntimeError(f"{n - (right[0] if right else 0)} outputs are wrong")
        finally:
            stop.set()
            thread.join()
    return elapsed, cpu, statements


def recover_with_processes(
    url: str, n: int, concurrency: int, processes: int, timeout: float = 600.0
) -> tuple[float, float, None]:
    """recover_all through `durable worker --processes P` (subprocesses, start-up timed);
    the CPU is the command's and its processes' (start-up included); statements are not
    counted."""
    env = {**os.environ, "DURABLE_DATABASE_URL": url, "DURABLE_LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "durable.cli", "worker", "--app", "benchmarks.recovery"]
    command += ["--concurrency", str(concurrency), "--poll-interval", "0.05"]
    command += ["--processes", str(processes), "--grace-seconds", "5"]
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, cwd=ROOT)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            wait_for_success(conn, n, timeout, "recovery")
            elapsed = time.perf_counter() - start
    finally:
        proc.send_signal(signal.SIGTERM)
        _, _, usage = os.wait4(proc.pid, 0)  # its processes' CPU counted in, once reaped
        proc.returncode = 0
    return elapsed, usage.ru_utime + usage.ru_stime, None


def run(
    admin_url: str,
    sizes: list[int],
    rounds: int,
    concurrency: int,
    timeout: float = 600.0,
    processes: list[int] | None = None,
) -> list[dict[str, Any]]:
    results = []
    for n, procs in [(n, p) for n in sizes for p in (processes or [0])]:
        times: list[float] = []
        client_cpu: list[float] = []
        server_cpu: list[float | None] = []
        statements: list[int | None] = []
        commits: list[int] = []
        for _ in range(rounds):
            name = f"durable_bench_recovery_{os.getpid()}_{uuid.uuid4().hex[:6]}"
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            url = _with_db(admin_url, name)
            try:
                with durable.Engine(url, registry=registry):
                    pass  # migrate
                make_interrupted(url, n)
                with (
                    psycopg.connect(admin_url, autocommit=True) as watcher,
                    psycopg.connect(url, autocommit=True) as mine,
                ):
                    own = [backend_pid(mine)]
                    commits0 = database_commits(watcher, name)
                    # The server's CPU: its backends for this database, sampled as they run.
                    with CPUSampler(partial(database_backends, watcher, name, own)) as server:
                        t0 = time.time()
                        if procs:
                            took = recover_with_processes(url, n, concurrency, procs, timeout)
                        else:
                            took = recover_all(url, n, concurrency, timeout)
                        t1 = time.time()
                    mine.close()
                    commits.append(database_commits(watcher, name) - commits0)
                times.append(took[0])
                client_cpu.append(took[1])
                statements.append(took[2])
                server_cpu.append(server.used(t0, t1))
            finally:
                with psycopg.connect(admin_url, autocommit=True) as conn:
                    conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(name)
                        )
                    )
        median = statistics.median(times)
        results.append(
            {
                "workflows": n,
                "processes": procs or "in-process",
                "steps_per_workflow": STEPS,
                "rounds": rounds,
                "median_seconds": median,
                "min_seconds": min(times),
                "max_seconds": max(times),
                "per_workflow_ms": median / n * 1000,
                "workflows_per_second": n / median,
                # Per workflow, medians of the rounds: the worker's CPU (this process, or
                # the command's processes, start-up included), the server's (its backends'
                # utime + stime; None when it is not on this machine), statements the
                # worker sent (None: not counted in another process), server-side commits.
                "client_cpu_ms_per_workflow": statistics.median(client_cpu) / n * 1000,
                "server_cpu_ms_per_workflow": _median_per(server_cpu, n, 1000),
                "statements_per_workflow": _median_per(statements, n),
                "commits_per_workflow": statistics.median(commits) / n,
            }
        )
    return results


def _median_per(values: Sequence[float | None], n: int, scale: float = 1.0) -> float | None:
    if any(v is None for v in values):
        return None
    return statistics.median(cast(float, v) for v in values) / n * scale


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DURABLE_BENCH_ADMIN_URL", ADMIN_DEFAULT),
        help="admin URL; a scratch database is created and dropped per round",
    )
    parser.add_argument("--n", type=int, action="append", help="workflows (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    add_output_args(parser, "recovery")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per round")
    parser.add_argument(
        "--processes",
        type=int,
        action="append",
        help="durable worker --processes P (repeatable; 0: a worker loop in this process)",
    )
    args = parser.parse_args(argv)
    sizes = args.n or [1000, 10000]
    results = run(
        args.database_url, sizes, args.rounds, args.concurrency, args.timeout, args.processes
    )
    table = Table(title=f"recovery of interrupted {STEPS}-step workflows")
    for col in (
        "workflows",
        "processes",
        "median s",
        "min s",
        "max s",
        "ms / workflow",
        "workflows / s",
        "statements / wf",
        "commits / wf",
        "client CPU ms / wf",
        "server CPU ms / wf",
    ):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            str(r["workflows"]),
            str(r["processes"]),
            f"{r['median_seconds']:.2f}",
            f"{r['min_seconds']:.2f}",
            f"{r['max_seconds']:.2f}",
            f"{r['per_workflow_ms']:.3f}",
            f"{r['workflows_per_second']:.0f}",
            _f(r["statements_per_workflow"], 1),
            _f(r["commits_per_workflow"], 2),
            _f(r["client_cpu_ms_per_workflow"], 3),
            _f(r["server_cpu_ms_per_workflow"], 3),
        )
    Console().print(table)
    write_results(args.out, results)
    return results


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
