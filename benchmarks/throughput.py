"""Throughput: worker processes draining a queue of 10-step workflows, against the server's
own commit rate.

Measured in one run, on one server:

- the machine's limit: plain autocommit `INSERT`s of a small row from 1, 4 and 16
  connections at once (a thread and a connection each), in INSERTs per second;
- durable: for each durability mode (`sync`, `async`), with group commit off and on
  (`commit_delay=200`, `commit_siblings=2`, set per session in the workers' URL, so the
  server's configuration is untouched), N worker processes (`durable worker`, default 1, 2
  and 4) drain M enqueued workflows of 10 steps. Each configuration gets a scratch database
  of its own. Reported: workflows/s and steps/s over the window from the first dequeue to
  the last finish (the server's own timestamps, so process start-up is not counted); their
  ratio to the 16-connection INSERT rate; commits per step (pg_stat_database.xact_commit of
  the scratch database, read after its backends exited; polls and heartbeats count too) and
  WAL flushes per step (pg_stat_wal.wal_sync, the physical cost that group commit shares);
  statements per step (what the workers sent the system database, counted by each as it
  exits); the workers' CPU per step (all their threads, sampled from /proc as they run and
  read back over the window) and the server's (the utime + stime of the database's
  backends over the same window, summed), which tell what a step costs whatever a commit
  costs on this disk; and, over the whole run, start-up included, the workers' CPU and the
  rest of the machine's busy time (from /proc/stat) per 1,000 steps.

    python -m benchmarks.throughput [--workflows 2000] [--workers 1 2 4] [--modes sync async]
                                    [--out PATH | --save] [--plot PATH]

A run writes no results file unless given --out PATH, or --save (which overwrites the
committed benchmarks/results/throughput.json).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
from psycopg import sql
from rich.console import Console
from rich.table import Table

import durable
from benchmarks import throughput_app
from benchmarks._common import (
    CPUSampler,
    add_output_args,
    backend_pid,
    database_backends,
    wait_for_success,
    write_results,
)

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ROOT = Path(__file__).resolve().parent.parent
GROUP_COMMIT = "-c commit_delay=200 -c commit_siblings=2"


def _with(url: str, **params: str) -> str:
    return psycopg.conninfo.make_conninfo(url, **params)


@contextlib.contextmanager
def scratch(admin: str, label: str) -> Iterator[str]:
    name = f"durable_bench_tp_{os.getpid()}_{label}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _with(admin, dbname=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def insert_rate(url: str, connections: int, seconds: float) -> float:
    """INSERTs per second from `connections` autocommit connections at once."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS tp_floor (t int, i int, payload text, PRIMARY KEY (t, i))"
        )
    counts = [0] * connections
    start = threading.Barrier(connections + 1)
    deadline = [0.0]

    def run(t: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            start.wait()
            i = 0
            while time.perf_counter() < deadline[0]:
                conn.execute(
                    "INSERT INTO tp_floor VALUES (%s, %s, %s)", (t, i, '{"i": 1, "ok": true}')
                )
                i += 1
            counts[t] = i

    threads = [threading.Thread(target=run, args=(t,)) for t in range(connections)]
    for th in threads:
        th.start()
    deadline[0] = time.perf_counter() + seconds
    start.wait()
    for th in threads:
        th.join()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE tp_floor")
    return sum(counts) / seconds


def _busy_seconds() -> float:
    """The machine's CPU time spent not idle, from /proc/stat (0 where there is none)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    ticks = [int(f) for f in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _server_counters(admin: str, dbname: str) -> tuple[int, int, int]:
    """(xact_commit of the database, wal_sync, wal_records) once its backends are gone."""
    with psycopg.connect(admin, autocommit=True) as conn:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [dbname]
            ).fetchone()
            if row is not None and row[0] == 0:
                break
            time.sleep(0.05)
        time.sleep(0.2)  # the stats of exiting backends are flushed as they exit
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [dbname]
        ).fetchone()
        wal = conn.execute("SELECT wal_sync, wal_records FROM pg_stat_wal").fetchone()
    assert commits is not None and wal is not None
    return int(commits[0]), int(wal[0]), int(wal[1])


def start_workers(
    url: str | list[str],
    workers: int,
    concurrency: int,
    counts: Path | None = None,
    env: dict[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """`workers` processes of `durable worker` on the benchmark's app, polling every 50 ms;
    with `counts`, worker k writes the statements it sent to `counts`/k as it exits. Given
    several URLs, worker k connects to `url[k % len(url)]`; `env` is added to theirs."""
    urls = [url] if isinstance(url, str) else url
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    env["DURABLE_LOG_LEVEL"] = "WARNING"

    def env_of(k: int) -> dict[str, str]:
        return env if counts is None else {**env, "DURABLE_BENCH_COUNTS": str(counts / str(k))}

    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "durable.cli",
                "worker",
                "--app",
                "benchmarks.throughput_app",
                "--database-url",
                urls[k % len(urls)],
                "--concurrency",
                str(concurrency),
                "--poll-interval",
                "0.05",
                "--grace-seconds",
                "5",
            ],
            env=env_of(k),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for k in range(workers)
    ]


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> float:
    """SIGTERM the workers, wait for them; returns their CPU seconds (user + system)."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    cpu = 0.0
    for p in procs:
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        cpu += usage.ru_utime + usage.ru_stime
    return cpu


def run_config(
    admin: str, mode: str, workers: int, group: bool, n: int, concurrency: int
) -> dict[str, Any]:
    label = f"{mode}_{workers}_{int(group)}"
    with scratch(admin, label) as url, tempfile.TemporaryDirectory() as tmp:
        dbname = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
        with durable.Client(url, migrate=True) as client:
            for k in range(n):
                client.enqueue(
                    throughput_app.jobs,
                    throughput_app.WORKFLOWS[mode],
                    throughput_app.STEPS,
                    workflow_id=f"tp-{k}",
                )
        worker_url = _with(url, options=GROUP_COMMIT) if group else url
        with psycopg.connect(worker_url) as conn:
            shown = conn.execute("SHOW commit_delay").fetchone()
        assert shown is not None and shown[0] == ("200" if group else "0"), shown
        commits0, syncs0, records0 = _server_counters(admin, dbname)
        busy0, own0 = _busy_seconds(), time.process_time()
        procs = start_workers(worker_url, workers, concurrency, Path(tmp))
        worker_cpu = 0.0
        try:
            with (
                psycopg.connect(url, autocommit=True) as conn,
                psycopg.connect(admin, autocommit=True) as watcher,
            ):
                mine = [backend_pid(conn)]
                # The CPU of the workers and of their backends, sampled as they run: read
                # back over the window of the server's timestamps (start-up, polling before
                # the first dequeue and after the last finish, and shutdown excluded).
                with (
                    CPUSampler(lambda: [p.pid for p in procs]) as client_cpu,
                    CPUSampler(lambda: database_backends(watcher, dbname, mine)) as server_cpu,
                ):
                    wait_for_success(conn, n, max(120.0, n / 20), label, poll=0.1)
            busy1, own1 = _busy_seconds(), time.process_time()
        finally:
            worker_cpu = stop_workers(procs)
        statements = sum(int(f.read_text()) for f in Path(tmp).iterdir())
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM min(dequeued_at))::float8,"
                " extract(epoch FROM max(finished_at))::float8 FROM durable.workflows"
            ).fetchone()
        assert row is not None and row[0] is not None and row[1] is not None
        t0, t1 = float(row[0]), float(row[1])
        window = max(t1 - t0, 1e-6)
        commits1, syncs1, records1 = _server_counters(admin, dbname)
    steps = n * throughput_app.STEPS
    # Busy time of the machine over the run, less what the workers and this process used:
    # the server's (and the rest of the machine's) share. The workers' CPU counts their
    # start-up and shutdown too, so this leans low.
    rest = max(0.0, (busy1 - busy0) - worker_cpu - (own1 - own0))
    in_window = client_cpu.used(t0, t1)
    backends = server_cpu.used(t0, t1)
    return {
        "mode": mode,
        "group_commit": group,
        "workers": workers,
        "concurrency": concurrency,
        "workflows": n,
        "seconds": window,
        "workflows_per_s": n / window,
        "steps_per_s": steps / window,
        "commits_per_step": (commits1 - commits0) / steps,
        "statements_per_step": statements / steps,
        "wal_syncs_per_step": (syncs1 - syncs0) / steps,
        "wal_records_per_step": (records1 - records0) / steps,
        # Per step, over the window: the worker processes' CPU (all their threads), and
        # their backends' (utime + stime of each, summed). None: the server is remote.
        "worker_cpu_us_per_step": None if in_window is None else in_window / steps * 1e6,
        "server_cpu_us_per_step": None if backends is None else backends / steps * 1e6,
        # Over the whole run, start-up and shutdown included (as measured before).
        "server_cpu_s_per_1k_steps": rest / steps * 1000,
        "worker_cpu_s_per_1k_steps": worker_cpu / steps * 1000,
    }


def write_plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib  # type: ignore[import-not-found,unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    rows = results["durable"]
    labels = [f"{r['mode']}\n{r['workers']}w{' gc' if r['group_commit'] else ''}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.7), 4))
    ax.bar(range(len(rows)), [r["steps_per_s"] for r in rows], color="#4c72b0")
    for conns, rate in results["insert_rate"].items():
        ax.axhline(rate, linestyle="--", linewidth=1, color="#dd8452")
        ax.text(
            len(rows) - 0.5, rate, f"INSERTs/s, {conns} conn", fontsize=7, va="bottom", ha="right"
        )
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("steps per second")
    ax.set_title("durable steps/s with N workers (gc: group commit) vs plain INSERTs/s")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main(argv: list[str] | None = None, console: Console | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__)
    parser.add_argument(
        "--database-url", default=os.environ.get("DURABLE_BENCH_ADMIN_URL", DEFAULT_URL)
    )
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--modes", nargs="+", choices=["sync", "async"], default=["sync", "async"])
    parser.add_argument("--group-commit", choices=["off", "on", "both"], default="both")
    parser.add_argument("--concurrency", type=int, default=8, help="workflows per worker")
    parser.add_argument("--insert-seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 4, 16])
    add_output_args(parser, "throughput")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument(
        "--citus",
        action="store_true",
        help="instead: throughput and step cost on a Citus cluster beside one server "
        "(benchmarks/citus.py, given --workflows, --workers, --concurrency, --plot)",
    )
    args = parser.parse_args(argv)
    console = console or Console()
    if args.citus:
        from benchmarks import citus

        return citus.main(
            [
                "--workflows",
                str(args.workflows),
                "--workers",
                *map(str, args.workers),
                "--concurrency",
                str(args.concurrency),
                *(["--plot", str(args.plot)] if args.plot else []),
            ],
            console,
        )
    groups = {"off": [False], "on": [True], "both": [False, True]}[args.group_commit]
    with scratch(args.database_url, "floor") as url:
        rates = {c: insert_rate(url, c, args.insert_seconds) for c in args.connections}
    rows = [
        run_config(args.database_url, mode, w, g, args.workflows, args.concurrency)
        for mode in args.modes
        for g in groups
        for w in args.workers
    ]
    limit = rates[max(rates)]
    for r in rows:
        r["ratio_to_insert_rate"] = r["steps_per_s"] / limit
    results = {
        "benchmark": "throughput",
        "insert_rate": {str(c): v for c, v in rates.items()},
        "insert_rate_connections": max(rates),
        "durable": rows,
        "median_ratio": statistics.median(r["ratio_to_insert_rate"] for r in rows),
    }
    floor = Table(title="the machine's limit: autocommit INSERTs")
    floor.add_column("connections", justify="right")
    floor.add_column("INSERTs / s", justify="right")
    for c, v in rates.items():
        floor.add_row(str(c), f"{v:,.0f}")
    console.print(floor)
    table = Table(title=f"durable: {args.workflows} queued workflows of 10 steps")
    for col in (
        "mode",
        "group commit",
        "workers",
        "workflows/s",
        "steps/s",
        f"x INSERTs/s ({max(rates)} conn)",
        "statements/step",
        "commits/step",
        "WAL flushes/step",
        "worker CPU µs/step",
        "server CPU µs/step",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["mode"],
            "on" if r["group_commit"] else "off",
            str(r["workers"]),
            f"{r['workflows_per_s']:,.0f}",
            f"{r['steps_per_s']:,.0f}",
            f"{r['ratio_to_insert_rate']:.2f}",
            f"{r['statements_per_step']:.2f}",
            f"{r['commits_per_step']:.2f}",
            f"{r['wal_syncs_per_step']:.3f}",
            _us(r["worker_cpu_us_per_step"]),
            _us(r["server_cpu_us_per_step"]),
        )
    console.print(table)
    write_results(args.out, results)
    if args.plot is not None:
        write_plot(results, args.plot)
    return results


if __name__ == "__main__":
    main()
