"""Step cost and throughput on a Citus cluster beside one server, measured in one run.

The benchmark starts its own cluster (tests/citus.py's: a coordinator and two workers on
loopback, each an `initdb` data directory with `shared_preload_libraries = 'citus'`; build
Citus first with `bash ../shared/citus/build.sh`) and compares two databases:

  single   a database on the coordinator's server without the citus extension: one
           PostgreSQL, the same binaries, settings and disk as the cluster's nodes;
  citus    a database on every node, joined, migrated and distributed
           (`durable migrate --citus`, `--shards` shards per table, Citus's default 32).

For each, in rounds that alternate which goes first (ABBA, so drift moves both alike):

- the floor: one autocommit INSERT of a step's row into a table of the journal's shape (on
  the cluster distributed by workflow id: one single-shard INSERT through the coordinator);
- a sync `@step`: a workflow of N steps less an empty workflow, per step; the empty
  workflow (start + finish) itself;
- a bare `SELECT 1` round trip.

Counted per step, by sessions of 10 + N steps less sessions of 10 (as
benchmarks/step_overhead.py does): the statements the client sent (round trips,
`engine.client.db.counters.statements`), the commits on the coordinator and on the workers
(`pg_stat_database.xact_commit` of the database on each node, read once the session's
backends, and the connections Citus opened for them, have exited), and the two-phase
commits Citus made (`pg_dist_transaction`: one row per prepared transaction on a worker;
the cluster runs with `citus.recover_2pc_interval = -1` so that its rows are not cleared
during the run, and with distributed deadlock detection off so that its polls do not count).

A `@transaction` step into the application's table, in the three layouts a user of the
cluster picks from: the table distributed by workflow id and colocated with durable's
(`colocate_with => 'durable.workflows'`), a reference table (a copy on every node), and a
plain table on the coordinator; on one server, a plain table. Timed as the `@step` is (a
workflow of N such steps less an empty one, per step), and counted: commits on the
coordinator and the workers, two-phase commits.

Throughput: N worker processes (`durable worker`, as benchmarks/throughput.py starts them)
drain M enqueued 10-step workflows on each database; workflows/s over the window from the
first dequeue to the last finish (the server's timestamps), commits per step on the
coordinator and on the workers, two-phase commits per workflow, and CPU per step: of the
coordinator's server (its postgres processes, from /proc/<pid>/stat: the live ones, and the
exited backends the postmaster reaped, by its cutime/cstime), of the worker nodes', and of
the `durable worker` processes. On one server the coordinator's server is the one server.

With `--spread`, each distributed database is drained a second time, next to the first,
by the same number of processes connected to the worker nodes instead of the coordinator
(process i to worker node i mod N: every node routes queries, docs/scaling.md's "Workers
on any node"; they poll, LISTEN being one node's), and a table sets the two placements
side by side: workflows/s, the coordinator's and the worker nodes' CPU per step.

A grid: `--shards 8,32,64` makes a distributed database of each shard count on the one
cluster, and `--processes 1,2,4` drains each with each number of processes (one server
beside them, each combination once, their order alternating). Per shard count, the claim
side alone: from one process, claim rounds on an idle database (what each worker pays
every poll with nothing to do: the runnable workflows, then each queue) and claims with a
backlog (a queue of enqueued workflows dequeued a batch at a time, not run), per second,
with the coordinator's CPU per round.

The step cost and the `@transaction` layouts are measured on the first shard count's
database (`--no-steps` and `--no-transactions` skip them). Nothing is written unless
`--out` is given.

    python -m benchmarks.citus [--steps 100] [--rounds 5] [--workflows 300] [--no-transactions]
                               [--no-steps] [--processes 1,2] [--shards 32] [--out PATH]
                               [--plot PATH] [--spread]
    python -m benchmarks.citus --shards 8,32,64 --processes 1,2,4 --no-steps --no-transactions
    python -m benchmarks.citus --shards 32 --processes 2,4 --spread --no-steps --no-transactions
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy
from psycopg import sql
from rich.console import Console
from rich.table import Table

import durable
from benchmarks import step_overhead, throughput, throughput_app
from tests import citus

ROOT = Path(__file__).resolve().parent.parent
APP = "durable_bench_citus"
WARM = 10  # runs of each kind before a round is timed, on its fresh connections
BASE = 10  # operations of the baseline session that counts subtract


@dataclass
class Side:
    """One of the two databases measured: its URL on the coordinator and every node that
    holds a part of it (the coordinator first)."""

    name: str
    url: str
    dbname: str
    nodes: list[str]  # admin URLs (database `postgres`) of the nodes holding it
    distributed: bool
    pgdata: list[Path]  # data directories of those nodes, the coordinator's first
    shards: int | None = None  # per distributed table; None on one server

    @property
    def app_url(self) -> str:
        return step_overhead.with_params(self.url, application_name=APP)

    def node_url(self, index: int) -> str:
        """The URL of this database on node `index` (0: the coordinator)."""
        return citus.with_dbname(self.nodes[index], self.dbname)

    @property
    def worker_node_app_urls(self) -> list[str]:
        """The benchmark's URLs of this database on each worker node (not the coordinator):
        where the worker processes connect with `--spread`."""
        return [
            step_overhead.with_params(self.node_url(i), application_name=APP)
            for i in range(1, len(self.nodes))
        ]

    def floor_insert(self, conn: psycopg.Connection[Any]) -> bytes:
        return sql.SQL(
            "INSERT INTO floor_steps (workflow_id, seq, name, output) VALUES (%s, %s, %s, %s)"
        ).as_bytes(conn)


# -- the cluster and its two databases ----------------------------------------------------


@contextlib.contextmanager
def sides(shard_counts: list[int]) -> Iterator[tuple[citus.CitusCluster, Side, list[Side]]]:
    """A fresh cluster, a plain database on its coordinator and a distributed one per shard
    count."""
    citus.ensure_installed()
    with citus.citus_cluster(shard_count=shard_counts[0]) as cluster:
        assert cluster.coordinator is not None
        # Keep pg_dist_transaction's rows (the two-phase commits) for the count, and keep
        # the maintenance daemon's deadlock polls out of the workers' commit counts. On
        # every node: a process connected to a worker node (`--spread`) makes its two-phase
        # commits from there, and that node records them.
        for node in cluster.nodes:
            with psycopg.connect(node.url(), autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET citus.recover_2pc_interval = -1")
                conn.execute("ALTER SYSTEM SET citus.distributed_deadlock_detection_factor = -1")
                conn.execute("SELECT pg_reload_conf()")
        name = f"durable_bench_single_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(cluster.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        single_url = cluster.coordinator.url(name)
        targets: list[tuple[str, int | None]] = [(single_url, None)]
        for k in shard_counts:
            cluster.shard_count = k
            targets.append((cluster.create_database(f"durable_bench_citus{k}"), k))
        for url, shards in targets:
            distribute = shards is not None
            with durable.Client(url, migrate=True) as client:
                if distribute:
                    client.distribute_citus()
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "CREATE TABLE floor_steps (workflow_id text NOT NULL, seq integer NOT NULL,"
                    " name text NOT NULL, output text, PRIMARY KEY (workflow_id, seq))"
                )
                if distribute:
                    conn.execute("SELECT create_distributed_table('floor_steps', 'workflow_id')")
        single = Side(
            "single", single_url, name, [cluster.admin_url], False, [cluster.coordinator.pgdata]
        )
        clusters = [
            Side(
                "citus",
                url,
                step_overhead.dbname_of(url),
                [n.url() for n in cluster.nodes],
                True,
                [n.pgdata for n in cluster.nodes],
                shards,
            )
            for url, shards in targets[1:]
        ]
        yield cluster, single, clusters


# -- counting -----------------------------------------------------------------------------


def _quiet(side: Side, timeout: float = 15.0) -> None:
    """Wait until the benchmark's sessions have left every node (a backend flushes its
    statistics as it exits; they are on the coordinator, or on the worker nodes with
    `--spread`); the connections Citus opened for them on the others close as they do, a
    moment later."""
    deadline = time.monotonic() + timeout
    for admin in side.nodes:
        with psycopg.connect(admin, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                    " AND application_name = %s AND pid <> pg_backend_pid()",
                    [side.dbname, APP],
                ).fetchone()
                if row is not None and row[0] == 0:
                    break
                time.sleep(0.02)
    time.sleep(0.3 if side.distributed else 0.1)


def counters(side: Side) -> dict[str, int]:
    """Commits of the database on the coordinator and on the workers, and the two-phase
    commits recorded so far, once the benchmark's backends are gone."""
    _quiet(side)
    commits = []
    for admin in side.nodes:
        with psycopg.connect(admin, autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [side.dbname]
            ).fetchone()
        commits.append(int(row[0]) if row is not None else 0)
    prepared = 0
    if side.distributed:
        # Each node records the two-phase commits it coordinated: the coordinator those of
        # the sessions on it, a worker node those of the sessions on it.
        for i in range(len(side.nodes)):
            with psycopg.connect(side.node_url(i), autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM pg_dist_transaction").fetchone()
            prepared += int(row[0]) if row is not None else 0
    return {"coordinator": commits[0], "workers": sum(commits[1:]), "prepared": prepared}


def _stat_cpu(pid: int) -> tuple[int, float, float]:
    """(parent pid, own CPU seconds, reaped children's CPU seconds) of a process."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    tick = os.sysconf("SC_CLK_TCK")
    # fields[0] is field 3 (state): ppid 4, utime 14, stime 15, cutime 16, cstime 17.
    return (
        int(fields[1]),
        (int(fields[11]) + int(fields[12])) / tick,
        (int(fields[13]) + int(fields[14])) / tick,
    )


def server_cpu(pgdata: Path) -> float:
    """CPU seconds used so far by the PostgreSQL server of `pgdata`: its postmaster and live
    children, and the children that have exited (the postmaster reaps them, so their CPU is
    in its cutime/cstime). A difference of two readings is the server's CPU in between."""
    postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    _, own, reaped = _stat_cpu(postmaster)
    total = own + reaped
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid, cpu, _ = _stat_cpu(int(entry.name))
            if ppid == postmaster:
                total += cpu
    return total


def nodes_cpu(side: Side) -> list[float]:
    """server_cpu of each node that holds `side`, the coordinator first."""
    return [server_cpu(p) for p in side.pgdata]


def delta(side: Side, session: Callable[[], None]) -> dict[str, int]:
    before = counters(side)
    session()
    after = counters(side)
    return {k: after[k] - before[k] for k in before}


def count_per_op(
    side: Side, session: Callable[[int], None], n: int, tries: int = 2
) -> dict[str, float]:
    """What a session of BASE + n operations adds to one of BASE, per operation.

    Each session is counted `tries` times, alternating, and the fewest of each counter is
    kept: the engine's background loops and Citus' maintenance daemon commit now and then
    on any node, which can only add to a window, so a single pair of windows can come out
    a commit short (0.9 per step) or over."""
    fulls: list[dict[str, int]] = []
    bases: list[dict[str, int]] = []
    for _ in range(tries):
        fulls.append(delta(side, lambda: session(BASE + n)))
        bases.append(delta(side, lambda: session(BASE)))
    return {k: (min(f[k] for f in fulls) - min(b[k] for b in bases)) / n for k in fulls[0]}


# -- step cost ----------------------------------------------------------------------------


def measure_steps(
    single: Side, cluster: Side, steps: int, rounds: int, warmup: int
) -> dict[str, Any]:
    payload = step_overhead.floor_payload()
    samples: dict[str, dict[str, list[float]]] = {
        s.name: {"floor": [], "step": [], "empty": [], "round_trip": [], "statements": []}
        for s in (single, cluster)
    }
    apps = {s.name: step_overhead.make_app() for s in (single, cluster)}
    for r in range(warmup + rounds):
        order = (single, cluster) if r % 2 == 0 else (cluster, single)
        for side in order:
            registry, wf, _ = apps[side.name]
            with (
                durable.Engine(side.app_url, registry=registry) as engine,
                psycopg.connect(side.app_url, autocommit=True) as conn,
            ):
                insert = side.floor_insert(conn)
                # A new engine has new connections: psycopg prepares a statement on its
                # fifth run, and on a cluster each new coordinator backend opens its own
                # connections to the workers on first use. Neither is a step's cost.
                for _ in range(WARM):
                    wf(0)
                wf(WARM)
                step_overhead.time_floor(conn, insert, WARM, payload)
                f = step_overhead.time_floor(conn, insert, steps, payload)
                w, e, s, es, _ = step_overhead.time_durable(engine, wf, steps, 3)
                rt = step_overhead.time_round_trip(conn, steps)
            if r < warmup:
                continue
            got = samples[side.name]
            got["floor"].append(f)
            got["step"].append((w - e) / steps)
            got["empty"].append(e)
            got["round_trip"].append(rt)
            got["statements"].append((s - es) / steps)
    out: dict[str, Any] = {}
    for side in (single, cluster):
        got = samples[side.name]
        registry, wf, _ = apps[side.name]

        def floor_session(k: int, side: Side = side) -> None:
            with psycopg.connect(side.app_url, autocommit=True) as conn:
                insert = side.floor_insert(conn)
                key = str(uuid.uuid4())
                for i in range(k):
                    conn.execute(insert, (key, i, "bench.step", payload))

        def step_session(k: int, side: Side = side, registry: Any = registry, wf: Any = wf) -> None:
            with durable.Engine(side.app_url, registry=registry):
                wf(k)

        def empty_session(
            k: int, side: Side = side, registry: Any = registry, wf: Any = wf
        ) -> None:
            with durable.Engine(side.app_url, registry=registry):
                for _ in range(k):
                    wf(0)

        out[side.name] = {
            "floor_us": step_overhead.summarize(got["floor"]),
            "step_us": step_overhead.summarize(got["step"]),
            "empty_workflow_us": step_overhead.summarize(got["empty"]),
            "round_trip_us": step_overhead.summarize(got["round_trip"]),
            "statements_per_step": min(got["statements"]),
            "per_floor_insert": count_per_op(side, floor_session, steps),
            "per_step": count_per_op(side, step_session, steps),
            "per_empty_workflow": count_per_op(side, empty_session, max(5, steps // 10)),
        }
    s, c = out["single"], out["citus"]
    out["ratios"] = {
        key: c[key]["median"] / s[key]["median"]
        for key in ("floor_us", "step_us", "empty_workflow_us", "round_trip_us")
    }
    return out


# -- @transaction layouts -----------------------------------------------------------------

# layout -> how the app's table is placed on the cluster (None: a plain table, on the
# coordinator only). One server has the plain table.
LAYOUTS: dict[str, str | None] = {
    "colocated": "SELECT create_distributed_table('tx_{name}', 'workflow_id',"
    " colocate_with => 'durable.workflows')",
    "reference": "SELECT create_reference_table('tx_{name}')",
    # A table on the coordinator that Citus knows of (a "Citus local table").
    "citus_local": "SELECT citus_add_local_table_to_metadata('tx_{name}')",
    "local": None,
}


def make_tx_app(table: str) -> tuple[durable.Registry, Callable[[str, int], int]]:
    """A workflow of N `@transaction` steps, each inserting a row keyed by the workflow's
    id into `table` (so that on the colocated layout the row is on the journal's shard)."""
    registry = durable.Registry()
    insert = sqlalchemy.text(
        f"INSERT INTO {table} (workflow_id, i, payload) VALUES (:w, :i, :payload)"
    )
    payload = step_overhead.floor_payload()

    @durable.transaction(name="bench.citus_tx", registry=registry)
    def tx(conn: sqlalchemy.Connection, key: str, i: int) -> int:
        conn.execute(insert, {"w": key, "i": i, "payload": payload})
        return i

    @durable.workflow(name="bench.citus_tx_workflow", registry=registry)
    def tx_workflow(key: str, n: int) -> int:
        for i in range(n):
            tx(key, i)
        return n

    return registry, tx_workflow


def measure_transactions(single: Side, cluster: Side, steps: int, rounds: int) -> dict[str, Any]:
    """µs per `@transaction` step and what each commits, per layout of the app's table."""
    targets: list[tuple[Side, str]] = [(single, "local")] + [(cluster, k) for k in LAYOUTS]
    for side, layout in targets:
        with psycopg.connect(side.url, autocommit=True) as conn:
            conn.execute(
                f"CREATE TABLE tx_{layout} (workflow_id text NOT NULL, i integer NOT NULL,"
                " payload text, PRIMARY KEY (workflow_id, i))"
            )
            placement = LAYOUTS[layout] if side.distributed else None
            if placement is not None:
                conn.execute(placement.format(name=layout))
    apps = {f"{side.name}/{layout}": make_tx_app(f"tx_{layout}") for side, layout in targets}

    def run(engine: durable.Engine, wf: Callable[[str, int], int], n: int) -> float:
        key = str(uuid.uuid4())
        start = time.perf_counter_ns()
        engine.start(wf, key, n, workflow_id=key).result(timeout=600)
        return step_overhead.elapsed_us(start)

    samples: dict[str, list[float]] = {k: [] for k in apps}
    for r in range(rounds):
        order = targets if r % 2 == 0 else list(reversed(targets))
        for side, layout in order:
            registry, wf = apps[f"{side.name}/{layout}"]
            with durable.Engine(side.app_url, registry=registry) as engine:
                for _ in range(WARM):
                    run(engine, wf, 1)
                empty = statistics.median(run(engine, wf, 0) for _ in range(3))
                full = run(engine, wf, steps)
            samples[f"{side.name}/{layout}"].append((full - empty) / steps)
    out: dict[str, Any] = {}
    for side, layout in targets:
        key = f"{side.name}/{layout}"
        registry, wf = apps[key]

        def session(k: int, side: Side = side, registry: Any = registry, wf: Any = wf) -> None:
            with durable.Engine(side.app_url, registry=registry) as engine:
                run(engine, wf, k)

        out[key] = {
            "tx_step_us": step_overhead.summarize(samples[key]),
            "per_tx_step": count_per_op(side, session, steps),
        }
    base = out["single/local"]["tx_step_us"]["median"]
    for entry in out.values():
        entry["ratio_to_single"] = entry["tx_step_us"]["median"] / base
    return out


# -- throughput ---------------------------------------------------------------------------


def _wait_for(side: Side, prefix: str, n: int, timeout: float) -> None:
    """Until the `n` workflows whose ids start with `prefix` are SUCCESS."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(side.url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM durable.workflows"
                " WHERE status = 'SUCCESS' AND workflow_id LIKE %s",
                [prefix + "%"],
            ).fetchone()
            if row is not None and row[0] >= n:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{side.name}: {row} of {n} workflows finished")
            time.sleep(0.1)


# Where a distributed database's worker processes connect: all to the coordinator, or
# process i to worker node i mod N (`--spread`).
COORDINATOR, SPREAD = "coordinator", "spread"


def measure_throughput(
    single: Side,
    clusters: list[Side],
    n: int,
    workers: list[int],
    concurrency: int,
    spread: bool = False,
) -> list[dict[str, Any]]:
    """Each process count on one server and on each distributed database, in an order that
    alternates from one process count to the next; with `spread`, on each distributed
    database the processes connected to the coordinator, and next to that run the same
    number connected to the worker nodes (process i to worker node i mod N)."""
    rows: list[dict[str, Any]] = []
    for k, w in enumerate(workers):
        targets = [(single, COORDINATOR)]
        for cluster in clusters:
            targets.append((cluster, COORDINATOR))
            if spread:
                targets.append((cluster, SPREAD))
        for side, placement in targets if k % 2 == 0 else list(reversed(targets)):
            prefix = f"tp{w}-{placement}-"
            with durable.Client(side.url) as client:
                for i in range(n):
                    client.enqueue(
                        throughput_app.jobs,
                        throughput_app.WORKFLOWS["sync"],
                        throughput_app.STEPS,
                        **{"workflow_id": f"{prefix}{i}"},
                    )
            before = counters(side)
            cpu_before = nodes_cpu(side)
            if placement == SPREAD:
                # Migrations are the coordinator's (done above, through it); a process on a
                # worker node only checks the schema's version. LISTEN/NOTIFY is one node's:
                # these poll (the backlog is enqueued before they start, so nothing would
                # be heard anyway).
                procs = throughput.start_workers(
                    side.worker_node_app_urls, w, concurrency, env={"DURABLE_LISTEN": "0"}
                )
            else:
                procs = throughput.start_workers(side.app_url, w, concurrency)
            try:
                _wait_for(side, prefix, n, max(180.0, n / 2))
                cpu_after = nodes_cpu(side)
            finally:
                process_cpu = throughput.stop_workers(procs)
            after = counters(side)
            with psycopg.connect(side.url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT extract(epoch FROM max(finished_at) - min(dequeued_at))::float8"
                    " FROM durable.workflows WHERE workflow_id LIKE %s",
                    [prefix + "%"],
                ).fetchone()
            assert row is not None and row[0] is not None
            window = max(float(row[0]), 1e-6)
            steps = n * throughput_app.STEPS
            used = [a - b for a, b in zip(cpu_after, cpu_before, strict=True)]
            rows.append(
                {
                    "target": side.name,
                    "shards": side.shards,
                    "placement": placement,
                    "workers": w,
                    "concurrency": concurrency,
                    "workflows": n,
                    "seconds": window,
                    "workflows_per_s": n / window,
                    "steps_per_s": steps / window,
                    "coordinator_commits_per_step": (after["coordinator"] - before["coordinator"])
                    / steps,
                    "worker_commits_per_step": (after["workers"] - before["workers"]) / steps,
                    "prepared_per_workflow": (after["prepared"] - before["prepared"]) / n,
                    # From the workers' start to the last finish (a little before and after
                    # the window above: the processes' start, the benchmark's polls).
                    "coordinator_cpu_ms_per_step": used[0] * 1000 / steps,
                    "worker_nodes_cpu_ms_per_step": sum(used[1:]) * 1000 / steps,
                    "nodes_cpu_ms_per_step": [u * 1000 / steps for u in used],
                    "process_cpu_ms_per_step": process_cpu * 1000 / steps,
                }
            )
    by = {(r["target"], r["workers"]): r for r in rows if r["target"] == "single"}
    on_coordinator = {
        (r["shards"], r["workers"]): r
        for r in rows
        if r["target"] == "citus" and r["placement"] == COORDINATOR
    }
    for r in rows:
        if r["target"] == "citus":
            r["ratio_to_single"] = (
                r["workflows_per_s"] / by[("single", r["workers"])]["workflows_per_s"]
            )
        if r["placement"] == SPREAD:
            r["ratio_to_coordinator"] = (
                r["workflows_per_s"]
                / on_coordinator[(r["shards"], r["workers"])]["workflows_per_s"]
            )
    return rows


def measure_claims(side: Side, batch: int, backlog: int, seconds: float) -> dict[str, Any]:
    """The claim side alone, from one engine that claims and runs nothing: idle rounds (the
    runnable workflows, then each queue, with nothing to claim) for `seconds`, then a queue
    of `backlog` enqueued workflows dequeued `batch` at a time for at most `seconds`; per
    second, with the coordinator's CPU per round. The backlog is deleted after."""
    prefix = "claims-"
    out: dict[str, Any] = {"target": side.name, "shards": side.shards, "batch": batch}
    engine = durable.Engine(
        side.app_url, registry=throughput_app.registry, max_workers=batch, listen=False
    )
    with engine:
        claims = engine._services.claims  # the worker loop's own claim calls

        def idle_round() -> None:  # as the worker loop's, on a database with nothing to run
            claims.round(None, batch, 0)
            claims.dequeue(batch, asynchronous=False)

        for _ in range(3):
            idle_round()
        rounds, cpu0, start = 0, nodes_cpu(side)[0], time.perf_counter()
        while time.perf_counter() - start < seconds:
            idle_round()
            rounds += 1
        elapsed, cpu = time.perf_counter() - start, nodes_cpu(side)[0] - cpu0
        out["idle_rounds_per_s"] = rounds / elapsed
        out["idle_round_ms"] = elapsed * 1000 / rounds
        out["idle_coordinator_cpu_ms_per_round"] = cpu * 1000 / rounds
        with durable.Client(side.url) as client:
            for i in range(backlog):
                client.enqueue(
                    throughput_app.jobs,
                    throughput_app.WORKFLOWS["sync"],
                    throughput_app.STEPS,
                    **{"workflow_id": f"{prefix}{i}"},
                )
        claimed, rounds, cpu0, start = 0, 0, nodes_cpu(side)[0], time.perf_counter()
        while claimed < backlog and time.perf_counter() - start < seconds:
            claimed += len(claims.dequeue(batch, asynchronous=False))
            rounds += 1
        elapsed, cpu = time.perf_counter() - start, nodes_cpu(side)[0] - cpu0
        out["claims_per_s"] = claimed / elapsed
        out["claim_rounds_per_s"] = rounds / elapsed
        out["claim_round_ms"] = elapsed * 1000 / max(rounds, 1)
        out["claim_coordinator_cpu_ms_per_round"] = cpu * 1000 / max(rounds, 1)
        # Gone before the engine lets go of them: nothing left for the next measurement.
        with psycopg.connect(side.url, autocommit=True) as conn:
            conn.execute("DELETE FROM durable.workflows WHERE workflow_id LIKE %s", [prefix + "%"])
    return out


# -- output -------------------------------------------------------------------------------


def print_report(results: dict[str, Any], console: Console) -> None:
    if results.get("steps"):
        print_steps(results, console)
    print_throughput(results, console)


def print_steps(results: dict[str, Any], console: Console) -> None:
    st = results["steps"]
    table = Table(title=f"one server vs Citus ({results['config']['shards']} shards/table)")
    for col in ("what", "single µs", "citus µs", "citus / single"):
        table.add_column(col, justify="right")
    for label, key in (
        ("floor: INSERT + commit", "floor_us"),
        ("@step (sync)", "step_us"),
        ("empty workflow: start + finish", "empty_workflow_us"),
        ("round trip: SELECT 1", "round_trip_us"),
    ):
        table.add_row(
            label,
            f"{st['single'][key]['median']:.0f}",
            f"{st['citus'][key]['median']:.0f}",
            f"{st['ratios'][key]:.2f}",
        )
    console.print(table)
    counts = Table(title="per operation: round trips, commits, two-phase commits")
    for col in ("what", "target", "statements", "coord. commits", "worker commits", "2PC"):
        counts.add_column(col, justify="right")
    for side in ("single", "citus"):
        for label, key in (
            ("floor INSERT", "per_floor_insert"),
            ("@step", "per_step"),
            ("empty workflow", "per_empty_workflow"),
        ):
            c = st[side][key]
            counts.add_row(
                label,
                side,
                f"{st[side]['statements_per_step']:.2f}" if key == "per_step" else "",
                f"{c['coordinator']:.2f}",
                f"{c['workers']:.2f}",
                f"{c['prepared']:.2f}",
            )
    console.print(counts)
    if results.get("transactions"):
        tx = Table(title="a @transaction step, by where the app's table lives")
        for col in ("target", "µs", "x single", "coord. commits", "worker commits", "2PC"):
            tx.add_column(col, justify="right")
        for key, entry in results["transactions"].items():
            c = entry["per_tx_step"]
            tx.add_row(
                key,
                f"{entry['tx_step_us']['median']:.0f}",
                f"{entry['ratio_to_single']:.2f}",
                f"{c['coordinator']:.2f}",
                f"{c['workers']:.2f}",
                f"{c['prepared']:.2f}",
            )
        console.print(tx)


def print_throughput(results: dict[str, Any], console: Console) -> None:
    tp = Table(title=f"throughput: {results['config']['workflows']} workflows of 10 steps")
    for col in (
        "target",
        "shards",
        "processes",
        "workflows/s",
        "citus / single",
        "coord. commits/step",
        "worker commits/step",
        "2PC/workflow",
        "coord. CPU ms/step",
        "nodes CPU ms/step",
        "processes CPU ms/step",
    ):
        tp.add_column(col, justify="right")
    for r in sorted(
        results["throughput"],
        key=lambda r: (r["workers"], r["shards"] or 0, r.get("placement") == SPREAD),
    ):
        tp.add_row(
            r["target"] + (" (spread)" if r.get("placement") == SPREAD else ""),
            str(r.get("shards") or ""),
            str(r["workers"]),
            f"{r['workflows_per_s']:.1f}",
            f"{r['ratio_to_single']:.2f}" if "ratio_to_single" in r else "",
            f"{r['coordinator_commits_per_step']:.2f}",
            f"{r['worker_commits_per_step']:.2f}",
            f"{r['prepared_per_workflow']:.2f}",
            f"{r['coordinator_cpu_ms_per_step']:.2f}",
            f"{r['worker_nodes_cpu_ms_per_step']:.2f}",
            f"{r['process_cpu_ms_per_step']:.2f}",
        )
    console.print(tp)
    spread = [r for r in results["throughput"] if r.get("placement") == SPREAD]
    if spread:
        print_placements(results, spread, console)
    if results.get("claims"):
        cl = Table(title="the claim side from one process (batch of the worker's concurrency)")
        for col in (
            "target",
            "shards",
            "idle rounds/s",
            "idle round ms",
            "coord. CPU ms/idle round",
            "claims/s (backlog)",
            "claim round ms",
            "coord. CPU ms/claim round",
        ):
            cl.add_column(col, justify="right")
        for c in results["claims"]:
            cl.add_row(
                c["target"],
                str(c.get("shards") or ""),
                f"{c['idle_rounds_per_s']:.1f}",
                f"{c['idle_round_ms']:.1f}",
                f"{c['idle_coordinator_cpu_ms_per_round']:.2f}",
                f"{c['claims_per_s']:.1f}",
                f"{c['claim_round_ms']:.1f}",
                f"{c['claim_coordinator_cpu_ms_per_round']:.2f}",
            )
        console.print(cl)


def print_placements(
    results: dict[str, Any], spread: list[dict[str, Any]], console: Console
) -> None:
    """The processes on the coordinator beside the same processes on the worker nodes."""
    same = {
        (r["shards"], r["workers"]): r
        for r in results["throughput"]
        if r["target"] == "citus" and r.get("placement") == COORDINATOR
    }
    table = Table(
        title="worker processes on the coordinator (coord.) vs on the worker nodes (spread)"
    )
    for col in (
        "shards",
        "processes",
        "workflows/s coord. | spread",
        "spread / coord.",
        "coord. CPU ms/step coord. | spread",
        "nodes CPU ms/step coord. | spread",
    ):
        table.add_column(col, justify="right")
    for r in sorted(spread, key=lambda r: (r["workers"], r["shards"])):
        c = same[(r["shards"], r["workers"])]
        table.add_row(
            str(r["shards"]),
            str(r["workers"]),
            f"{c['workflows_per_s']:.1f} | {r['workflows_per_s']:.1f}",
            f"{r['ratio_to_coordinator']:.2f}",
            f"{c['coordinator_cpu_ms_per_step']:.2f} | {r['coordinator_cpu_ms_per_step']:.2f}",
            f"{c['worker_nodes_cpu_ms_per_step']:.2f} | {r['worker_nodes_cpu_ms_per_step']:.2f}",
        )
    console.print(table)


def write_plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib  # type: ignore[import-not-found,unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    st = results["steps"]
    keys = [("floor", "floor_us"), ("@step", "step_us"), ("start+finish", "empty_workflow_us")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.38
    for k, (side, color) in enumerate((("single", "#4c72b0"), ("citus", "#dd8452"))):
        xs = [i + (k - 0.5) * width for i in range(len(keys))]
        left.bar(xs, [st[side][key]["median"] for _, key in keys], width, label=side, color=color)
        rows = [
            r
            for r in results["throughput"]
            if r["target"] == side
            and r.get("shards") in (None, results["config"]["shards"])
            and r.get("placement", COORDINATOR) == COORDINATOR
        ]
        xs = [i + (k - 0.5) * width for i in range(len(rows))]
        right.bar(xs, [r["workflows_per_s"] for r in rows], width, label=side, color=color)
    left.set_xticks(range(len(keys)), [label for label, _ in keys])
    left.set_ylabel("median µs")
    left.set_title("per operation")
    left.legend()
    workers = [r["workers"] for r in results["throughput"] if r["target"] == "single"]
    right.set_xticks(range(len(workers)), [f"{w} worker{'s' if w > 1 else ''}" for w in workers])
    right.set_ylabel("workflows / s (10 steps each)")
    right.set_title("throughput")
    right.legend()
    fig.suptitle(
        f"one server vs Citus (coordinator + 2 workers, {results['config']['shards']} shards)"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()]


def main(argv: list[str] | None = None, console: Console | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.citus",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=100, help="steps per workflow (100)")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (5)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded rounds first (1)")
    parser.add_argument("--workflows", type=int, default=300, help="per throughput run (300)")
    parser.add_argument(
        "--processes",
        "--workers",
        dest="processes",
        type=_ints,
        default=[1, 2],
        help="worker process counts, e.g. 1,2,4 (1,2)",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="workflows per worker")
    parser.add_argument(
        "--shards", type=_ints, default=[32], help="shards per table, e.g. 8,32,64 (32)"
    )
    parser.add_argument(
        "--claim-backlog", type=int, default=400, help="queued workflows the claims take (400)"
    )
    parser.add_argument(
        "--claim-seconds", type=float, default=3.0, help="each claim measurement's time (3)"
    )
    parser.add_argument(
        "--spread",
        action="store_true",
        help="also run each distributed case with the processes on the worker nodes "
        "(process i on worker node i mod N) instead of the coordinator, beside it",
    )
    parser.add_argument(
        "--no-steps", dest="steps_cost", action="store_false", help="skip the step cost"
    )
    parser.add_argument(
        "--no-transactions",
        dest="transactions",
        action="store_false",
        help="skip the @transaction layouts",
    )
    parser.add_argument(
        "--out", "--json", dest="out", type=Path, default=None, help="write the results here"
    )
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)
    console = console or Console()
    with sides(args.shards) as (_, single, clusters):
        first = clusters[0]
        with psycopg.connect(first.url) as conn:
            row = conn.execute(
                "SELECT version(), extversion, current_setting('fsync')"
                " FROM pg_extension WHERE extname = 'citus'"
            ).fetchone()
        assert row is not None
        steps = (
            measure_steps(single, first, args.steps, args.rounds, args.warmup)
            if args.steps_cost
            else {}
        )
        transactions = (
            measure_transactions(single, first, max(10, args.steps // 2), args.rounds)
            if args.transactions
            else {}
        )
        tp = measure_throughput(
            single, clusters, args.workflows, args.processes, args.concurrency, args.spread
        )
        claims = [
            measure_claims(side, args.concurrency, args.claim_backlog, args.claim_seconds)
            for side in (single, *clusters)
        ]
    results = {
        "benchmark": "citus",
        "config": {
            "steps": args.steps,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "workflows": args.workflows,
            "workers": args.processes,
            "concurrency": args.concurrency,
            "shards": args.shards[0],
            "shard_counts": args.shards,
            "spread": args.spread,
            "nodes": "a coordinator and 2 workers on one machine",
        },
        "server": {"version": row[0].split(" on ")[0], "citus": row[1], "fsync": row[2]},
        "steps": steps,
        "transactions": transactions,
        "throughput": tp,
        "claims": claims,
        "median_throughput_ratio": statistics.median(
            r["ratio_to_single"]
            for r in tp
            if r["placement"] == COORDINATOR and "ratio_to_single" in r
        ),
    }
    print_report(results, console)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n", "utf-8")
    if args.plot is not None and steps:
        write_plot(results, args.plot)
    return results


if __name__ == "__main__":
    main()
