"""How much a durable step costs compared with the floor: one INSERT and one commit.

A sync `@durable.step` journals its output with one autocommit INSERT, so the least it
can cost is one round trip and one commit. This benchmark measures, in one run, on the
same database and the same kind of connection (psycopg, autocommit, default prepare
threshold, same URL):

  floor        one bare psycopg `INSERT` of the same payload into a table of a similar
               shape (workflow_id text, seq int, name text, output text, primary key
               (workflow_id, seq)), autocommit: one round trip, one commit;
  durable      a workflow of N steps called directly inside `with engine:`, minus the
               time of an empty workflow measured in the same round, divided by N;
  async        the same with `async def` workflow and steps, awaited on an event loop of
               the benchmark's (the async driver); its ratio to the sync step is the
               async driver's cost (target: at most ASYNC_TARGET);
  round trip   a bare `SELECT 1`, for context (a round trip with no durable commit);
  transaction  a workflow of N `@durable.transaction` steps, each inserting one row into an
               application table through SQLAlchemy, against the same insert in a plain
               SQLAlchemy transaction (`with engine.app_connection() as c, c.begin()`): the
               journal's cost inside the application's own commit;
  effect       a workflow of N `@durable.effect` calls (write-ahead intent, the call, the
               settled outcome with its journal row), per effect, with its statements and
               server-side commits;
  client CPU   this process's CPU time per step (time.process_time, all its threads) of
               either driver, measured alongside: the async driver's own cost, which wall
               times on a busy machine can hide or inflate.

Rounds interleave floor and durable (ABBA order, so drift cancels) after warm-up rounds
that are not recorded; the table shows medians over the rounds with the quartiles.

It also counts the statements durable sent per step (`engine.client.db.counters.statements`)
and the commits per step seen by the server: `pg_stat_database.xact_commit` of the
database, read by an observer connected to a different database, before and after a
session whose connections are then closed. A backend flushes its statistics when it
exits, before it leaves pg_stat_activity, so once the session's backends are gone the
counter is complete. Each count is the difference between a session of 10 + N operations
and one of 10 (which cancels connection and engine start-up and psycopg's one-time
statement preparation), and the floor calibrates it: if
the floor does not come out at 1 commit per INSERT, the numbers are reported as
unreliable instead of being printed.

The benchmark creates a scratch database (`durable_bench_<pid>_<hex>`) from the admin URL
and drops it at the end. With --no-scratch it works in the given database instead, inside
a schema of its own (`durable_bench_<pid>_<hex>`) that it drops at the end.

It also gives, for the floor and a sync step, the CPU each costs (the measuring thread's,
the whole process's, and the server's: the utime + stime of the backends of the measured
sessions from /proc, when the server is on this machine): wall ratios move with the disk's
flush time, CPU and counts do not.

Run: python -m benchmarks.step_overhead [--steps 200] [--rounds 7] [--out PATH | --save]
(no results file is written unless asked: --save overwrites benchmarks/results/).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import psycopg
import psycopg.conninfo
import sqlalchemy
from psycopg import sql
from rich.console import Console
from rich.table import Table

import durable
from benchmarks._common import ServerCPU, add_output_args, cpu_per, cpu_snapshot, write_results

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TARGET_RATIO = 1.25
ASYNC_TARGET = 1.2  # an async step costs at most this many sync steps
STEP_NAME = "bench.step"
WORKFLOW_NAME = "bench.workflow"
# Filler that makes one step's JSON output about 100 bytes, like a small real result.
_PAD = "x" * 64

Workflow = Callable[[int], int]
AsyncWorkflow = Callable[[int], Coroutine[Any, Any, int]]


# -- the workload -------------------------------------------------------------------------------


def step_output(i: int) -> dict[str, Any]:
    return {"i": i, "ok": True, "pad": _PAD}


def make_app() -> tuple[durable.Registry, Workflow, AsyncWorkflow]:
    """A dedicated registry holding the benchmark's workflows and steps (sync and async)."""
    registry = durable.Registry()

    @durable.step(name=STEP_NAME, registry=registry)
    def bench_step(i: int) -> dict[str, Any]:
        return step_output(i)

    @durable.workflow(name=WORKFLOW_NAME, registry=registry)
    def bench_workflow(n: int) -> int:
        for i in range(n):
            bench_step(i)
        return n

    @durable.step(name=STEP_NAME + ".async", registry=registry)
    async def bench_async_step(i: int) -> dict[str, Any]:
        return step_output(i)

    @durable.workflow(name=WORKFLOW_NAME + ".async", registry=registry)
    async def bench_async_workflow(n: int) -> int:
        for i in range(n):
            await bench_async_step(i)
        return n

    return registry, bench_workflow, bench_async_workflow


APP_TABLE = "bench_app_rows"


def make_units(schema: str) -> tuple[durable.Registry, Workflow, Workflow]:
    """The transaction and effect workloads: (registry, N transaction steps, N effects)."""
    registry = durable.Registry()
    insert = app_insert(schema)

    @durable.transaction(name="bench.tx", registry=registry)
    def bench_tx(conn: sqlalchemy.Connection, i: int) -> int:
        conn.execute(insert, {"i": i, "payload": _PAD})
        return i

    @durable.workflow(name="bench.tx_workflow", registry=registry)
    def tx_workflow(n: int) -> int:
        for i in range(n):
            bench_tx(i)
        return n

    @durable.effect(name="bench.effect", registry=registry, idempotent=True)
    def bench_effect(i: int, *, idempotency_key: str) -> dict[str, Any]:
        return step_output(i)

    @durable.workflow(name="bench.effect_workflow", registry=registry)
    def effect_workflow(n: int) -> int:
        for i in range(n):
            bench_effect(i)
        return n

    return registry, tx_workflow, effect_workflow


def app_insert(schema: str) -> sqlalchemy.TextClause:
    return sqlalchemy.text(f'INSERT INTO "{schema}".{APP_TABLE} (i, payload) VALUES (:i, :payload)')


def floor_payload() -> str:
    """The text the floor inserts: what durable stores for a step output."""
    return durable.JSONSerializer().dumps(step_output(0))


# -- statistics ---------------------------------------------------------------------------------


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    if len(ordered) >= 2:
        p25, p50, p75 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        p25 = p50 = p75 = ordered[0]
    return {
        "median": p50,
        "p25": p25,
        "p75": p75,
        "min": ordered[0],
        "max": ordered[-1],
        "samples": list(samples),
    }


# -- connections --------------------------------------------------------------------------------


def with_params(url: str, **params: str) -> str:
    """`url` with some connection parameters replaced (libpq URL or key=value string)."""
    return psycopg.conninfo.make_conninfo(url, **params)


def dbname_of(url: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    return str(info.get("dbname") or info.get("user") or "")


def redact(url: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **{k: str(v) for k, v in info.items()})


def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def elapsed_us(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / 1000.0


class Target:
    """Where the benchmark writes: a scratch database, or its own schema in a given one."""

    def __init__(self, url: str, scratch: bool) -> None:
        token = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.name = f"durable_bench_{token}"
        self.scratch = scratch
        self.admin_url = url
        self.app_name = self.name
        if scratch:
            self.dbname = self.name
            self.schema = "durable"
        else:
            self.dbname = dbname_of(url)
            self.schema = self.name
        base = with_params(url, dbname=self.dbname) if scratch else url
        # Every connection of the measured code carries this application_name, so the
        # commit counter can wait for exactly those backends to exit.
        self.url = with_params(base, application_name=self.app_name)
        self.floor_table = sql.Identifier(self.schema, "floor_steps")

    def create(self) -> None:
        if self.scratch:
            with connect(self.admin_url) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.dbname)))
        with connect(self.url) as conn:
            conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
            )
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (workflow_id text NOT NULL, seq integer NOT NULL,"
                    " name text NOT NULL, output text, PRIMARY KEY (workflow_id, seq))"
                ).format(self.floor_table)
            )
            conn.execute(
                sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, i int, payload text)").format(
                    sql.Identifier(self.schema, APP_TABLE)
                )
            )

    def drop(self) -> None:
        if self.scratch:
            with connect(self.admin_url) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(self.dbname)
                    )
                )
        else:
            with connect(self.url) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema))
                )

    def engine(self, registry: durable.Registry) -> durable.Engine:
        return durable.Engine(self.url, registry=registry, schema=self.schema)

    def floor_insert(self, conn: psycopg.Connection[Any]) -> bytes:
        return (
            sql.SQL("INSERT INTO {} (workflow_id, seq, name, output) VALUES (%s, %s, %s, %s)")
            .format(self.floor_table)
            .as_bytes(conn)
        )

    def observer_url(self) -> str | None:
        """A URL of another database on the server, whose sessions do not count here."""
        candidates = [self.admin_url] if self.scratch else []
        candidates += [with_params(self.admin_url, dbname=d) for d in ("postgres", "template1")]
        for url in candidates:
            if dbname_of(url) == self.dbname:
                continue
            try:
                with connect(url) as conn:
                    conn.execute("SELECT 1")
            except psycopg.Error:
                continue
            return url
        return None


def server_info(url: str) -> dict[str, Any]:
    with connect(url) as conn:
        row = conn.execute(
            "SELECT version(), current_setting('fsync'), current_setting('synchronous_commit'),"
            " current_setting('wal_sync_method'), current_setting('autovacuum')"
        ).fetchone()
        assert row is not None
        return {
            "version": row[0],
            "fsync": row[1],
            "synchronous_commit": row[2],
            "wal_sync_method": row[3],
            "autovacuum": row[4],
            "host": conn.info.host,
            "port": conn.info.port,
        }


# -- timed batches ------------------------------------------------------------------------------


def time_floor(conn: psycopg.Connection[Any], insert: bytes, n: int, payload: str) -> float:
    """µs per INSERT + commit, over n single-statement autocommit INSERTs."""
    workflow_id = str(uuid.uuid4())
    gc.collect()
    start = time.perf_counter_ns()
    for i in range(n):
        conn.execute(insert, (workflow_id, i, STEP_NAME, payload))
    return elapsed_us(start) / n


def time_round_trip(conn: psycopg.Connection[Any], n: int) -> float:
    """µs per bare `SELECT 1` (a round trip and a read-only commit)."""
    gc.collect()
    start = time.perf_counter_ns()
    for _ in range(n):
        conn.execute("SELECT 1")
    return elapsed_us(start) / n


def time_workflow(wf: Callable[[int], int], n: int) -> tuple[float, float]:
    """(µs of wall time, µs of this process's CPU time) of one run of the workflow."""
    cpu = time.process_time_ns()
    start = time.perf_counter_ns()
    result = wf(n)
    took = elapsed_us(start)
    cpu_us = (time.process_time_ns() - cpu) / 1000.0
    if result != n:
        raise RuntimeError(f"the benchmark workflow returned {result!r}, expected {n}")
    return took, cpu_us


def time_start_result(
    engine: durable.Engine,
    wf: Workflow,
    awf: AsyncWorkflow,
    loop: asyncio.AbstractEventLoop,
    n: int,
) -> tuple[float, float]:
    """µs per `engine.start(empty).result()`, and per `await (await
    engine.start_async(empty)).result()` on the benchmark's loop: a workflow of no steps
    started and waited for, as an application does."""
    t = time.perf_counter_ns()
    for _ in range(n):
        engine.start(wf, 0).result()
    sync_us = elapsed_us(t) / n

    async def started() -> None:
        for _ in range(n):
            await (await engine.start_async(awf, 0)).result()

    t = time.perf_counter_ns()
    loop.run_until_complete(started())
    return sync_us, elapsed_us(t) / n


def on_loop(loop: asyncio.AbstractEventLoop, awf: AsyncWorkflow) -> Workflow:
    """The async workflow as a blocking call: awaited on the benchmark's own loop (which
    keeps its connection pool between calls, as an application's loop does)."""
    return lambda n: loop.run_until_complete(awf(n))


def time_durable(
    engine: durable.Engine, wf: Workflow, n: int, empty_runs: int
) -> tuple[float, float, int, int, float]:
    """One round: (µs of the N-step workflow, µs of an empty workflow, statements of the
    N-step workflow, statements of an empty one, the process's CPU µs per step). The empty
    workflow is timed before and after the full one; its median is what the round
    subtracts."""
    counters = engine.client.db.counters
    gc.collect()
    empties: list[float] = []
    empty_cpus: list[float] = []
    empty_statements = 0
    full = full_cpu = 0.0
    full_statements = 0
    for k in range(empty_runs + 1):
        before = counters.statements
        if k == (empty_runs + 1) // 2:
            full, full_cpu = time_workflow(wf, n)
            full_statements = counters.statements - before
        else:
            wall, cpu = time_workflow(wf, 0)
            empties.append(wall)
            empty_cpus.append(cpu)
            empty_statements = counters.statements - before
    empty = statistics.median(empties)
    cpu_per_step = (full_cpu - statistics.median(empty_cpus)) / n
    return full, empty, full_statements, empty_statements, cpu_per_step


# -- server-side commit counts ------------------------------------------------------------------


class CommitCounter:
    """Reads pg_stat_database.xact_commit of the target database from another database."""

    def __init__(self, target: Target, observer_url: str, timeout: float = 15.0) -> None:
        self.target = target
        self.observer_url = observer_url
        self.timeout = timeout

    def read(self) -> int:
        with connect(self.observer_url) as conn:
            deadline = time.monotonic() + self.timeout
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE application_name = %s AND pid <> pg_backend_pid()",
                    [self.target.app_name],
                ).fetchone()
                if row is not None and row[0] == 0:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the benchmark's backends did not exit")
                time.sleep(0.01)
            # A new transaction, so a new statistics snapshot.
            row = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                [self.target.dbname],
            ).fetchone()
            if row is None:
                raise RuntimeError(f"no pg_stat_database row for {self.target.dbname!r}")
            return int(row[0])

    def delta(self, session: Callable[[], None]) -> int:
        """Commits in the target database by `session`, which must close its connections."""
        before = self.read()
        session()
        return self.read() - before


def count_commits(
    target: Target, registry: durable.Registry, wf: Workflow, n: int, payload: str
) -> dict[str, Any]:
    observer = target.observer_url()
    if observer is None:
        return {
            "reliable": False,
            "floor_per_insert": None,
            "durable_per_step": None,
            "note": "no other database to observe from: the observer's own commits would count",
        }
    counter = CommitCounter(target, observer)
    # Both sessions of a pair run at least `base` operations, so each prepares its
    # statements (psycopg does it on the 5th execution, one extra read-only transaction)
    # and the difference is the n operations alone.
    base = 10

    def floor_session(k: int) -> Callable[[], None]:
        def run() -> None:
            with connect(target.url) as conn:
                insert = target.floor_insert(conn)
                workflow_id = str(uuid.uuid4())
                for i in range(k):
                    conn.execute(insert, (workflow_id, i, STEP_NAME, payload))

        return run

    def durable_session(k: int) -> Callable[[], None]:
        def run() -> None:
            with target.engine(registry):
                wf(k)

        return run

    try:
        floor_n = counter.delta(floor_session(base + n))
        floor_0 = counter.delta(floor_session(base))
        durable_n = counter.delta(durable_session(base + n))
        durable_0 = counter.delta(durable_session(base))
    except (TimeoutError, RuntimeError, psycopg.Error) as exc:
        return {
            "reliable": False,
            "floor_per_insert": None,
            "durable_per_step": None,
            "note": f"could not read the commit counter: {exc}",
        }
    floor_per = (floor_n - floor_0) / n
    durable_per = (durable_n - durable_0) / n
    raw = {
        "base": base,
        "floor_base_plus_n": floor_n,
        "floor_base": floor_0,
        "durable_base_plus_n": durable_n,
        "durable_base": durable_0,
    }
    # The floor is exactly one commit per INSERT; if the counter says otherwise, something
    # else committed in the database (autovacuum, other clients) or the stats lagged.
    if abs((floor_n - floor_0) - n) > 0.02 * n:
        return {
            "reliable": False,
            "floor_per_insert": None,
            "durable_per_step": None,
            "raw": raw,
            "note": (
                f"unreliable: the floor came out at {floor_per:.3f} commits per INSERT "
                "(expected 1); other activity in the database or lagging statistics"
            ),
        }
    return {
        "reliable": True,
        "floor_per_insert": floor_per,
        "durable_per_step": durable_per,
        "raw": raw,
        "note": "pg_stat_database.xact_commit deltas, calibrated by the floor",
    }


# -- the run ------------------------------------------------------------------------------------


@contextmanager
def prepared_target(url: str, scratch: bool) -> Iterator[Target]:
    target = Target(url, scratch)
    try:
        target.create()
        yield target
    finally:
        try:
            target.drop()
        except psycopg.Error as exc:
            what = "database" if scratch else "schema"
            print(f"could not drop the benchmark's {what} {target.name}: {exc}", file=sys.stderr)


def measure(
    target: Target, steps: int, rounds: int, warmup: int, empty_runs: int
) -> dict[str, Any]:
    registry, wf, awf = make_app()
    payload = floor_payload()
    floor: list[float] = []
    step: list[float] = []
    async_step: list[float] = []
    async_ratios: list[float] = []
    step_cpu: list[float] = []
    async_cpu: list[float] = []
    empty: list[float] = []
    full: list[float] = []
    round_trip: list[float] = []
    ratios: list[float] = []
    statements: list[float] = []
    empty_statements: list[float] = []
    started: list[float] = []
    started_async: list[float] = []
    started_ratios: list[float] = []
    started_async_ratios: list[float] = []
    loop = asyncio.new_event_loop()
    with target.engine(registry) as engine, connect(target.url) as conn:
        insert = target.floor_insert(conn)
        run_async = on_loop(loop, awf)
        for r in range(warmup + rounds):
            # ABBA: alternate which side goes first, so slow drift affects both alike.
            if r % 2 == 0:
                f = time_floor(conn, insert, steps, payload)
                w, e, s, es, c = time_durable(engine, wf, steps, empty_runs)
                aw, ae, _, _, ac = time_durable(engine, run_async, steps, empty_runs)
            else:
                aw, ae, _, _, ac = time_durable(engine, run_async, steps, empty_runs)
                w, e, s, es, c = time_durable(engine, wf, steps, empty_runs)
                f = time_floor(conn, insert, steps, payload)
            rt = time_round_trip(conn, steps)
            sr, sra = time_start_result(engine, wf, awf, loop, max(10, empty_runs * 4))
            d = (w - e) / steps
            ad = (aw - ae) / steps
            if r < warmup:
                continue
            floor.append(f)
            step.append(d)
            async_step.append(ad)
            async_ratios.append(ad / d)
            step_cpu.append(c)
            async_cpu.append(ac)
            empty.append(e)
            full.append(w)
            round_trip.append(rt)
            ratios.append(d / f)
            statements.append(s)
            empty_statements.append(es)
            started.append(sr)
            started_async.append(sra)
            started_ratios.append(sr / f)
            started_async_ratios.append(sra / f)
        cpu_of_round = measure_cpu(target, engine, wf, conn, insert, steps, rounds, payload)
        # As asyncio.run ends a loop: what is left is cancelled (the engine's host of this
        # loop then gives back its connections).
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    loop.close()
    # The fewest seen: the engine's own background statements (heartbeat, cancel polls)
    # share the counter and can only add to a round.
    stmt_per_empty = min(empty_statements)
    stmt_per_step = (min(statements) - stmt_per_empty) / steps
    floor_s = summarize(floor)
    step_s = summarize(step)
    return {
        "floor_us": floor_s,
        "durable_step_us": step_s,
        "async_step_us": summarize(async_step),
        "async_ratio": {
            "of_medians": statistics.median(async_step) / step_s["median"],
            "paired": summarize(async_ratios),
        },
        # The client's CPU time per step (this process, all threads): unlike wall time, it
        # hardly moves when other processes compete for the CPU.
        "durable_step_cpu_us": summarize(step_cpu),
        "async_step_cpu_us": summarize(async_cpu),
        "empty_workflow_us": summarize(empty),
        "start_result_us": summarize(started),
        "start_result_async_us": summarize(started_async),
        "start_result_ratio": summarize(started_ratios),
        "start_result_async_ratio": summarize(started_async_ratios),
        "full_workflow_us": summarize(full),
        "round_trip_us": summarize(round_trip),
        "ratio": {
            "of_medians": step_s["median"] / floor_s["median"],
            "paired": summarize(ratios),
        },
        "statements_per_step": stmt_per_step,
        "statements_per_empty_workflow": stmt_per_empty,
        "payload_bytes": len(payload.encode()),
        "commits": count_commits(target, registry, wf, steps, payload),
        "cpu_per_op": cpu_of_round,
    }


def measure_cpu(
    target: Target,
    engine: durable.Engine,
    wf: Workflow,
    conn: psycopg.Connection[Any],
    insert: bytes,
    steps: int,
    rounds: int,
    payload: str,
) -> dict[str, Any]:
    """CPU per operation, beside the wall ratios (a wall ratio moves with the disk's flush
    time, these do not): for the floor's INSERT + commit and for a sync-mode step (an
    N-step workflow less an empty one, per step), the measuring thread's CPU, the whole
    process's and the server's (the utime + stime of the backends of the measured code's
    sessions, by their application_name; None when the server is not on this machine).
    Medians over `rounds`, alternating the two."""
    observer_url = target.observer_url()
    floor: list[dict[str, float | None]] = []
    step: list[dict[str, float | None]] = []
    with contextlib.ExitStack() as stack:
        server = None
        if observer_url is not None:
            observer = stack.enter_context(connect(observer_url))
            server = ServerCPU(observer, application_name=target.app_name)

        def costs(run: Callable[[], object], n: int) -> dict[str, float | None]:
            s0 = server.read() if server is not None else {}
            c0 = cpu_snapshot()
            run()
            c1 = cpu_snapshot()
            s1 = server.read() if server is not None else {}
            per = cpu_per(c0, c1, n)
            spent = ServerCPU.spent(s0, s1)
            per["server_cpu_us"] = None if spent is None else spent / n * 1e6
            return per

        def floor_inserts() -> None:  # time_floor's loop, without its gc.collect()
            workflow_id = str(uuid.uuid4())
            for i in range(steps):
                conn.execute(insert, (workflow_id, i, STEP_NAME, payload))

        gc.collect()
        for r in range(rounds):
            if r % 2:
                floor.append(costs(floor_inserts, steps))
            full = costs(lambda: wf(steps), steps)
            empty = costs(lambda: wf(0), steps)  # per step of the full run: subtracted
            step.append(
                {
                    k: None if v is None or empty[k] is None else v - cast(float, empty[k])
                    for k, v in full.items()
                }
            )
            if not r % 2:
                floor.append(costs(floor_inserts, steps))

    def medians(rows: list[dict[str, float | None]]) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for key in rows[0]:
            values = [v for v in (row[key] for row in rows) if v is not None]
            out[key] = statistics.median(values) if len(values) == len(rows) else None
        return out

    return {"floor": medians(floor), "durable_step": medians(step), "rounds": rounds}


def time_app_transactions(engine: durable.Engine, schema: str, n: int) -> float:
    """µs per plain SQLAlchemy transaction inserting the row a transaction step inserts."""
    insert = app_insert(schema)
    gc.collect()
    start = time.perf_counter_ns()
    for i in range(n):
        with engine.app_connection() as conn, conn.begin():
            conn.execute(insert, {"i": i, "payload": _PAD})
    return elapsed_us(start) / n


BLOCK = 20  # operations per block in the interleaved measurement


def measure_interleaved(target: Target, blocks: int) -> dict[str, Any]:
    """Steps and floor INSERTs interleaved in blocks of BLOCK inside one workflow run, per
    durability mode: each block of steps is timed from the workflow's own code, then a block
    of floor INSERTs on a connection of its own, and the ratio is taken block by block. A
    disk whose flush time changes from second to second (a virtual machine's) moves both
    sides of a block alike, so the median of the block ratios holds still where ratios of
    whole rounds do not. Start and finish are outside the blocks: this is the step alone."""
    modes = {mode: _interleaved(target, mode, blocks) for mode in ("sync", "async", "exit")}
    return {"interleaved": {"block": BLOCK, "blocks": blocks, **modes}}


def _interleaved(target: Target, mode: str, blocks: int) -> dict[str, Any]:
    payload = floor_payload()
    registry = durable.Registry()
    ratios: list[float] = []
    step_us: list[float] = []
    floor_us: list[float] = []

    @durable.step(name=STEP_NAME + ".blocks", registry=registry)
    def block_step(i: int) -> dict[str, Any]:
        return step_output(i)

    with connect(target.url) as conn:
        insert = target.floor_insert(conn)
        floor_id = str(uuid.uuid4())

        @durable.workflow(name=f"{WORKFLOW_NAME}.blocks.{mode}", registry=registry)
        def blocks_workflow(n: int) -> int:
            for b in range(n):
                start = time.perf_counter_ns()
                for i in range(BLOCK):
                    block_step(b * BLOCK + i)
                d = elapsed_us(start) / BLOCK
                start = time.perf_counter_ns()
                for i in range(BLOCK):
                    conn.execute(insert, (floor_id, b * BLOCK + i, STEP_NAME, payload))
                f = elapsed_us(start) / BLOCK
                if b:  # the first block warms both up
                    step_us.append(d)
                    floor_us.append(f)
                    ratios.append(d / f)
            return n

        with durable.Engine(target.url, registry=registry, schema=target.schema, durability=mode):
            blocks_workflow(blocks + 1)
    return {
        "ratio": summarize(ratios),
        "step_us": summarize(step_us),
        "floor_us": summarize(floor_us),
    }


def measure_units(target: Target, steps: int, rounds: int, warmup: int) -> dict[str, Any]:
    """Transaction steps against their plain transactions, and effects, per op: in ABBA
    rounds like the steps, each workflow less an empty run of the same engine."""
    registry, tx_wf, effect_wf = make_units(target.schema)
    plain: list[float] = []
    tx: list[float] = []
    effect: list[float] = []
    tx_ratios: list[float] = []
    with target.engine(registry) as engine:
        counters = engine.client.db.counters

        def per_op(wf: Workflow) -> float:
            empty = statistics.median(time_workflow(wf, 0)[0] for _ in range(3))
            return (time_workflow(wf, steps)[0] - empty) / steps

        for r in range(warmup + rounds):
            if r % 2 == 0:
                p = time_app_transactions(engine, target.schema, steps)
                t = per_op(tx_wf)
                e = per_op(effect_wf)
            else:
                e = per_op(effect_wf)
                t = per_op(tx_wf)
                p = time_app_transactions(engine, target.schema, steps)
            if r < warmup:
                continue
            plain.append(p)
            tx.append(t)
            effect.append(e)
            tx_ratios.append(t / p)

        def statements_of(n: int) -> int:
            before = counters.statements
            time_workflow(effect_wf, n)
            return counters.statements - before

        # The counter is the engine's: its background loops may add a statement to any
        # window, never take one away, so the fewest seen is the workflow's own.
        full = min(statements_of(steps) for _ in range(3))
        empty = min(statements_of(0) for _ in range(3))
    per_effect = (full - empty) / steps
    observer = target.observer_url()
    commits: float | None = None
    if observer is not None:
        counter = CommitCounter(target, observer)

        def session(k: int) -> Callable[[], None]:
            def run() -> None:
                with target.engine(registry):
                    effect_wf(k)

            return run

        try:
            # The engine's background loops may commit in any window, never take a commit
            # away: the fewest of two windows of each size is the workflows' own.
            full_commits = min(counter.delta(session(10 + steps)) for _ in range(2))
            base_commits = min(counter.delta(session(10)) for _ in range(2))
            commits = (full_commits - base_commits) / steps
        except (TimeoutError, RuntimeError, psycopg.Error):
            commits = None
    return {
        "app_transaction_us": summarize(plain),
        "transaction_step_us": summarize(tx),
        "transaction_ratio": {
            "of_medians": statistics.median(tx) / statistics.median(plain),
            "paired": summarize(tx_ratios),
        },
        "effect_us": summarize(effect),
        "statements_per_effect": per_effect,
        "commits_per_effect": commits,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.step_overhead",
        description="Per-step cost of a durable sync step versus one INSERT + commit.",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DURABLE_DATABASE_URL") or DEFAULT_URL,
        help="admin URL; a scratch database is created from it and dropped at the end "
        "(default: DURABLE_DATABASE_URL or %(default)s)",
    )
    parser.add_argument(
        "--no-scratch",
        action="store_true",
        help="use --database-url itself instead of a scratch database, in a schema of the "
        "benchmark's own that is dropped at the end",
    )
    parser.add_argument("--steps", type=int, default=200, help="steps per workflow (200)")
    parser.add_argument("--rounds", type=int, default=7, help="measured rounds (7)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded rounds first (1)")
    parser.add_argument(
        "--empty-runs", type=int, default=5, help="empty workflows timed per round (5)"
    )
    add_output_args(parser, "step_overhead")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the rounds (matplotlib)")
    parser.add_argument(
        "--citus",
        action="store_true",
        help="instead: step cost and throughput on a Citus cluster beside one server "
        "(benchmarks/citus.py, given --steps, --rounds, --warmup, --plot)",
    )
    args = parser.parse_args(argv)
    for name in ("steps", "rounds", "empty_runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    return args


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_cpu(results: dict[str, Any], console: Console) -> None:
    """What an operation costs whatever a commit costs on this disk: CPU and counts."""
    cpu = results.get("cpu_per_op")
    if not cpu:
        return
    commits = results["commits"]
    table = Table(title=f"CPU µs per op (medians of {cpu['rounds']} rounds)")
    for col in ("what", "client thread", "client process", "server", "statements", "commits"):
        table.add_column(col, justify="right" if col != "what" else "left")
    for label, key, statements, committed in (
        ("floor: INSERT + commit", "floor", 1.0, commits.get("floor_per_insert")),
        (
            "durable @step (sync)",
            "durable_step",
            results["statements_per_step"],
            commits.get("durable_per_step"),
        ),
    ):
        row = cpu[key]
        table.add_row(
            label,
            _us(row["thread_cpu_us"]),
            _us(row["process_cpu_us"]),
            _us(row["server_cpu_us"]),
            f"{statements:.2f}",
            "-" if committed is None else f"{committed:.2f}",
        )
    console.print(table)


def print_report(results: dict[str, Any], console: Console) -> None:
    floor_median = results["floor_us"]["median"]
    cpu_median = results["durable_step_cpu_us"]["median"]
    steps = results["config"]["steps"]
    table = Table(
        title=f"durable step overhead ({results['config']['rounds']} rounds of {steps} ops, "
        f"{results['payload_bytes']}-byte payload)"
    )
    table.add_column("what")
    table.add_column("median µs per op", justify="right")
    table.add_column("p25", justify="right")
    table.add_column("p75", justify="right")
    table.add_column("ratio to floor", justify="right")
    table.add_column("ratio to sync step", justify="right")
    rows = [
        ("floor: INSERT + commit", "floor_us"),
        ("durable @step (sync)", "durable_step_us"),
        ("durable @step (async def, awaited)", "async_step_us"),
        ("  client CPU of a sync step", "durable_step_cpu_us"),
        ("  client CPU of an async def step", "async_step_cpu_us"),
        ("empty workflow: start + finish", "empty_workflow_us"),
        ("empty workflow: start(wf).result()", "start_result_us"),
        ("empty workflow: await start_async(wf) .result()", "start_result_async_us"),
        ("round trip: SELECT 1", "round_trip_us"),
        ("app transaction, unjournaled (SQLAlchemy)", "app_transaction_us"),
        ("durable @transaction step", "transaction_step_us"),
        ("durable @effect", "effect_us"),
    ]
    ratio_to_sync = {
        "async_step_us": f"{results['async_ratio']['of_medians']:.2f}",
    }
    if cpu_median > 0:
        ratio_to_sync["async_step_cpu_us"] = (
            f"{results['async_step_cpu_us']['median'] / cpu_median:.2f}"
        )
    for label, key in rows:
        s = results[key]
        table.add_row(
            label,
            f"{s['median']:.1f}",
            f"{s['p25']:.1f}",
            f"{s['p75']:.1f}",
            "" if key.endswith("_cpu_us") else f"{s['median'] / floor_median:.2f}",
            ratio_to_sync.get(key, ""),
        )
    console.print(table)
    print_cpu(results, console)
    ratio = results["ratio"]
    paired = ratio["paired"]
    verdict = "meets" if ratio["of_medians"] <= TARGET_RATIO else "misses"
    console.print(
        f"ratio durable step / floor: {ratio['of_medians']:.3f} (per-round ratios: median "
        f"{paired['median']:.3f}, IQR {paired['p25']:.3f}-{paired['p75']:.3f}, range "
        f"{paired['min']:.3f}-{paired['max']:.3f}); {verdict} the target {TARGET_RATIO}"
    )
    async_ratio = results["async_ratio"]
    verdict = "meets" if async_ratio["of_medians"] <= ASYNC_TARGET else "misses"
    console.print(
        f"ratio async step / sync step: {async_ratio['of_medians']:.3f} (per-round median "
        f"{async_ratio['paired']['median']:.3f}); {verdict} the target {ASYNC_TARGET}"
    )
    per_step = results["statements_per_step"]
    per_empty = results["statements_per_empty_workflow"]
    console.print(
        f"statements per step: {per_step:.2f} (engine.client.db.counters.statements); "
        f"per empty workflow: {per_empty}"
    )
    commits = results["commits"]
    if commits["reliable"]:
        console.print(
            f"server-side commits per step: {commits['durable_per_step']:.3f} (floor: "
            f"{commits['floor_per_insert']:.3f} per INSERT; {commits['note']})"
        )
    else:
        console.print(f"server-side commits per step: not reported ({commits['note']})")
    inter = results["interleaved"]
    console.print(
        f"interleaved in blocks of {inter['block']} inside one workflow ({inter['blocks']} "
        "blocks), step / floor per block, median (IQR): "
        + "; ".join(
            f"{mode} {inter[mode]['ratio']['median']:.3f} "
            f"({inter[mode]['ratio']['p25']:.2f}-{inter[mode]['ratio']['p75']:.2f})"
            for mode in ("sync", "async", "exit")
        )
    )
    tx_ratio = results["transaction_ratio"]
    commits_per_effect = results["commits_per_effect"]
    console.print(
        f"@transaction step / the same app transaction unjournaled: "
        f"{tx_ratio['of_medians']:.3f} (per-round median {tx_ratio['paired']['median']:.3f}); "
        f"@effect: {results['statements_per_effect']:.2f} statements and "
        + (
            f"{commits_per_effect:.2f} server-side commits"
            if commits_per_effect is not None
            else "(commits not counted)"
        )
        + " per effect"
    )
    server = results["server"]
    console.print(
        f"server: {server['version'].split(' on ')[0]}, fsync={server['fsync']}, "
        f"synchronous_commit={server['synchronous_commit']}, via {server['host']}:{server['port']}"
    )


def write_plot(results: dict[str, Any], path: Path, console: Console) -> None:
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        console.print(
            "matplotlib is not installed (pip install 'durable-pg[bench]'): no plot written",
            markup=False,
        )
        return
    labels = ["floor", "durable step", "async step"]
    data = [
        results["floor_us"]["samples"],
        results["durable_step_us"]["samples"],
        results["async_step_us"]["samples"],
    ]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.boxplot(data)
    ax.set_xticks([1, 2, 3], labels)
    ax.set_ylabel("µs per op")
    ax.set_title(
        f"durable step vs INSERT + commit (ratio {results['ratio']['of_medians']:.2f});"
        f" async/sync {results['async_ratio']['of_medians']:.2f}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    console.print(f"plot written to {path}")


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table, write the JSON; returns the results."""
    args = parse_args(argv)
    console = console or Console()
    if args.citus:
        from benchmarks import citus

        return citus.main(
            [
                "--steps",
                str(args.steps),
                "--rounds",
                str(args.rounds),
                "--warmup",
                str(args.warmup),
                *(["--plot", str(args.plot)] if args.plot else []),
            ],
            console,
        )
    with prepared_target(args.database_url, scratch=not args.no_scratch) as target:
        server = server_info(target.url)
        results = measure(target, args.steps, args.rounds, args.warmup, args.empty_runs)
        results.update(measure_units(target, args.steps, args.rounds, args.warmup))
        results.update(measure_interleaved(target, max(3, args.rounds * args.steps // BLOCK)))
    results = {
        "benchmark": "step_overhead",
        "config": {
            "steps": args.steps,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "empty_runs": args.empty_runs,
            "database": redact(args.database_url),
            "scratch": not args.no_scratch,
            "scratch_name": target.name,
        },
        "server": server,
        "client": {
            "python": platform.python_version(),
            "psycopg": psycopg.__version__,
            "psycopg_impl": psycopg.pq.__impl__,
            "durable": durable.__version__,
        },
        **results,
        "target_ratio": TARGET_RATIO,
        "meets_target": results["ratio"]["of_medians"] <= TARGET_RATIO,
    }
    print_report(results, console)
    write_results(args.out, results)
    if args.out is not None:
        console.print(f"results written to {args.out}")
    if args.plot is not None:
        write_plot(results, args.plot, console)
    return results


if __name__ == "__main__":
    main()
