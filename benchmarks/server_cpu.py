"""What a journal record statement costs the server's CPU, against the floor INSERT.

The client's time hides the server's work (a round trip, a commit), and the machines these
run on are shared: this benchmark reads the CPU time of the PostgreSQL backend serving
each connection, from /proc/<pid>/schedstat (nanoseconds on the CPU; /proc/<pid>/stat's
utime + stime in clock ticks where schedstat is missing), before and after a block of
statements. The backend's pid is `pg_backend_pid()`, so the server must run on this
machine. pg_stat_statements is not needed (it must be preloaded).

Cases, each on a connection of its own, sent as durable sends them (psycopg, autocommit,
prepared after its default threshold; --no-prepare sends every statement unprepared):

  floor              a bare INSERT of a step's output into a table of a similar shape
                     (workflow_id text, seq int, name text, output text, primary key
                     (workflow_id, seq)): one row, no constraint, no default, no fence;
  record_step        durable's record_step (queries.sql) into a schema migrated to this
                     release, under the fence of a RUNNING workflow row;
  unfenced           the same INSERT with its values and no fence (INSERT ... VALUES),
                     for reference: what the fence (the workflow row read and locked
                     FOR SHARE) costs;
  record_step@REF    with --before REF (a git revision): the same statement as of REF, into
                     a schema built by REF's migrations (before/after in one sitting).

Blocks of --block statements alternate between the cases, in an order reversed every
round (drift cancels); a first round warms up and is not recorded. The table shows per
statement the median over the rounds with the quartiles, the ratio of medians to the
floor's, and the median of each round's ratio to the floor's block of that round (paired:
steadier when the machine's load drifts). The measuring sessions run with
synchronous_commit off unless --synchronous-commit on: the commit's wait for the disk is
the same for every case and is not CPU the statement costs.

The benchmark creates a scratch database (`durable_cpu_<pid>_<hex>`) from the admin URL and
drops it at the end. Results are written only with --out PATH (JSON).

Run: python -m benchmarks.server_cpu [--before HEAD~1] [--block 2000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
from psycopg import sql
from rich.console import Console
from rich.table import Table

from durable._io import migrate as _migrate
from durable._io.systemdb import load_queries, parse_queries

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TARGET_RATIO = 1.3  # a record statement costs the server at most this many floor INSERTs
WORKFLOW_ID = "bench-workflow"
PAYLOAD = json.dumps({"i": 1, "payload": "x" * 32})
ROOT = Path(__file__).resolve().parent.parent
_TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu_s(pid: int) -> float:
    """CPU seconds the backend `pid` has used so far."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (FileNotFoundError, PermissionError):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK


def with_params(url: str, **params: str) -> str:
    return psycopg.conninfo.make_conninfo(url, **params)


# record_step without its fence, for reference (durable never sends it: the fence is what
# keeps a run that lost its workflow from writing).
UNFENCED = """INSERT INTO {schema}.steps (workflow_id, step_seq, step_name, kind, output, error,
    attempts, child_workflow_id, started_at)
VALUES (%(workflow_id)s, %(step_seq)s, %(step_name)s, %(kind)s, %(output)s, %(error)s,
    %(attempts)s, %(child_workflow_id)s, %(started_at)s)
RETURNING workflow_id"""


def migrations_at(ref: str) -> list[tuple[int, str, str]]:
    """(version, name, text) of the migrations of git revision `ref`."""
    where = "durable/_io/sql/migrations/"
    names = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", ref, where],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out = []
    for path in names:
        m = re.match(r"^(\d{4})_([a-z0-9_]+)\.sql$", Path(path).name)
        if m:
            text = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{ref}:{path}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            out.append((int(m.group(1)), m.group(2), text))
    return sorted(out)


def queries_at(ref: str) -> dict[str, str]:
    """queries.sql's named blocks as of git revision `ref`."""
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:durable/_io/sql/queries.sql"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_queries(text)


def build_schema(
    conn: psycopg.Connection[Any], schema: str, migrations: list[tuple[int, str, str]]
) -> None:
    """`schema` made by `migrations`, with one RUNNING workflow whose journal is written."""
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for _, _, text in migrations:
            conn.execute(_migrate.render(text, schema))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (workflow_id, name, inputs, status, owner, epoch)"
                " VALUES (%s, 'bench.workflow', '[]', 'RUNNING', 'bench', 1)"
            ).format(sql.Identifier(schema, "workflows")),
            [WORKFLOW_ID],
        )


class Case:
    """One kind of statement on a connection of its own; `block(n)` sends n of them."""

    def __init__(
        self, name: str, url: str, statement: bytes, params: Callable[[int], Any], prepare: bool
    ) -> None:
        self.name = name
        self.conn = psycopg.connect(url, autocommit=True)
        self.statement = statement
        self.params = params
        self.prepare: bool | None = None if prepare else False
        self.seq = 0
        row = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        self.pid = int(row[0])
        self.samples: list[float] = []

    def block(self, n: int, record: bool) -> None:
        before = backend_cpu_s(self.pid)
        for _ in range(n):
            self.conn.execute(self.statement, self.params(self.seq), prepare=self.prepare)
            self.seq += 1
        used = backend_cpu_s(self.pid) - before
        if record:
            self.samples.append(used / n * 1e6)

    def close(self) -> None:
        self.conn.close()


def record_params(now: dt.datetime, workflow_id: str) -> Callable[[int], dict[str, Any]]:
    def params(seq: int) -> dict[str, Any]:
        return {
            "workflow_id": workflow_id,
            "epoch": 1,
            "step_seq": seq,
            "step_name": "bench.step",
            "kind": "step",
            "output": PAYLOAD,
            "error": None,
            "attempts": 1,
            "child_workflow_id": None,
            "started_at": now,
            "finished_at": now,
        }

    return params


def summarize(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return {"median": statistics.median(samples), "q1": q[0], "q3": q[2], "n": len(samples)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    token = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
    dbname = f"durable_cpu_{token}"
    url = with_params(args.url, dbname=dbname)
    with psycopg.connect(args.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    cases: list[Case] = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE floor_steps (workflow_id text NOT NULL, seq integer NOT NULL,"
                " name text NOT NULL, output text, PRIMARY KEY (workflow_id, seq))"
            )
            build_schema(conn, "durable", _migrate.available())
            if args.before:
                build_schema(conn, "durable_before", migrations_at(args.before))
        session = with_params(url, options=f"-c synchronous_commit={args.synchronous_commit}")
        now = dt.datetime.now(dt.UTC)
        floor_id = str(uuid.uuid4())
        cases.append(
            Case(
                "floor",
                session,
                b"INSERT INTO floor_steps (workflow_id, seq, name, output) VALUES (%s, %s, %s, %s)",
                lambda i: (floor_id, i, "bench.step", PAYLOAD),
                not args.no_prepare,
            )
        )

        def record_case(name: str, schema: str, text: str, workflow_id: str = WORKFLOW_ID) -> Case:
            with psycopg.connect(url) as conn:
                statement = sql.SQL(text).format(schema=sql.Identifier(schema)).as_bytes(conn)
            params = record_params(now, workflow_id)
            return Case(name, session, statement, params, not args.no_prepare)

        cases.append(record_case("record_step", "durable", load_queries()["record_step"]))
        cases.append(record_case("unfenced", "durable", UNFENCED, "unfenced"))
        if args.before:
            cases.append(
                record_case(
                    f"record_step@{args.before}",
                    "durable_before",
                    queries_at(args.before)["record_step"],
                )
            )
        for r in range(args.rounds + 1):
            order = cases if r % 2 == 0 else list(reversed(cases))
            for case in order:
                case.block(args.block, record=r > 0)
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT version()").fetchone()
            assert row is not None
            version = str(row[0])
    finally:
        for case in cases:
            case.close()
        with psycopg.connect(args.url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
    floor = statistics.median(cases[0].samples)
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "server": version,
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "block": args.block,
        "rounds": args.rounds,
        "prepared": not args.no_prepare,
        "synchronous_commit": args.synchronous_commit,
        "target_ratio": TARGET_RATIO,
        "cases": {
            c.name: {
                **summarize(c.samples),
                "ratio": statistics.median(c.samples) / floor,
                # each round's block over the floor's of the same round, the median of those:
                # what drift of the machine's load between rounds does not move
                "paired_ratio": statistics.median(
                    a / b for a, b in zip(c.samples, cases[0].samples, strict=True)
                ),
            }
            for c in cases
        },
    }


def show(result: dict[str, Any]) -> None:
    table = Table(
        title=(
            f"server CPU per statement (µs, backend /proc; {result['rounds']} rounds of "
            f"{result['block']}; prepared={result['prepared']}, "
            f"synchronous_commit={result['synchronous_commit']})"
        )
    )
    for col in ("case", "median", "q1", "q3", "x floor", "x floor, paired"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for name, c in result["cases"].items():
        table.add_row(
            name,
            f"{c['median']:.1f}",
            f"{c['q1']:.1f}",
            f"{c['q3']:.1f}",
            f"{c['ratio']:.2f}",
            f"{c['paired_ratio']:.2f}",
        )
    Console().print(table)
    ratio = result["cases"]["record_step"]["ratio"]
    verdict = "meets" if ratio <= result["target_ratio"] else "misses"
    print(f"record_step: {ratio:.2f}x the floor, {verdict} the target of {TARGET_RATIO}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("DURABLE_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--block", type=int, default=2000, help="statements per block")
    parser.add_argument("--rounds", type=int, default=10, help="recorded rounds")
    parser.add_argument(
        "--before", metavar="REF", help="also measure record_step and the schema as of REF"
    )
    parser.add_argument("--no-prepare", action="store_true", help="never prepare statements")
    parser.add_argument("--synchronous-commit", default="off", choices=("on", "off"))
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    args = parser.parse_args(argv)
    result = run(args)
    show(result)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
