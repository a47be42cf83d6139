"""The console's workflow list at 1,000,000 workflows: time of one page, and its plan.

Builds N workflow rows (ids like 'wf-<md5>', 20 names of which one is rare, statuses mostly
SUCCESS, creation times spread over 30 days) in a scratch database, then times
`Client.list_workflows` (the very call the console makes) for the first page, a deep page
(keyset), and each filter, prints EXPLAIN (ANALYZE, BUFFERS) of each, then times the
console's list page over HTTP (rendering, the count and the folded children included;
searches too). Results: benchmarks/results/ui_list.txt.

    python -m benchmarks.ui_list [--n 1000000] [--admin-url URL]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

import durable
from benchmarks.recovery import ADMIN_DEFAULT, _with_db

PAGE = 50


def build(url: str, n: int) -> None:
    """N finished (and a few live) workflows, as a long-running deployment has them."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO durable.workflows (workflow_id, name, status, inputs, output, epoch,
                created_at, updated_at, finished_at)
            SELECT 'wf-' || md5(g::text),
                CASE WHEN g %% 10000 = 0 THEN 'rare.audit' ELSE 'app.flow_' || (g %% 19) END,
                CASE WHEN g %% 100 = 0 THEN 'ERROR' WHEN g %% 1000 = 1 THEN 'SUSPENDED'
                     ELSE 'SUCCESS' END,
                '{"args":[1],"kwargs":{}}', '1', 1, t, t, t
            FROM generate_series(1, %(n)s) AS g,
                LATERAL (SELECT now() - make_interval(secs => (%(n)s - g) * 2592000.0 / %(n)s))
                    AS c (t)
            """,
            {"n": n},
        )
        conn.execute("VACUUM ANALYZE durable.workflows")


def cases(client: durable.Client) -> dict[str, dict[str, Any]]:
    first = client.list_workflows(limit=PAGE)
    middle = client.list_workflows(
        created_to=dt.datetime.now(dt.UTC) - dt.timedelta(days=15), limit=1
    )[0]
    return {
        "first page": {},
        "deep page (keyset, half-way)": {"after": (middle.created_at, middle.workflow_id)},
        "next page": {"after": (first[-1].created_at, first[-1].workflow_id)},
        "status=ERROR": {"status": "ERROR"},
        "status=SUSPENDED, deep": {
            "status": "SUSPENDED",
            "after": (middle.created_at, middle.workflow_id),
        },
        "name (common)": {"name": "app.flow_3"},
        "name (rare, 1 in 10,000)": {"name": "rare.audit"},
        "id prefix 'wf-ab'": {"id_prefix": "wf-ab"},
        "id prefix 'wf-abc12'": {"id_prefix": "wf-abc12"},
        "created in one day, 20 days ago": {
            "created_from": dt.datetime.now(dt.UTC) - dt.timedelta(days=21),
            "created_to": dt.datetime.now(dt.UTC) - dt.timedelta(days=20),
        },
    }


def params(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The statement's parameters for one case (as Client.list_workflows binds them)."""
    from durable._client.reading import _prefix_end
    from durable._run.filter import RunFilter

    after_at, after_id = kwargs.get("after", (None, None))
    prefix = kwargs.get("id_prefix")
    return {
        "status": kwargs.get("status"),
        "name": kwargs.get("name"),
        "id_from": prefix,
        "id_to": None if prefix is None else _prefix_end(prefix),
        "created_from": kwargs.get("created_from"),
        "created_to": kwargs.get("created_to"),
        "top_level": kwargs.get("top_level", False),
        "search": kwargs.get("search"),
        "after_at": after_at,
        "after_id": after_id,
        "limit": PAGE,
        "stale_seconds": 120.0,
    } | RunFilter().params()


def pages(client: durable.Client, repeats: int) -> list[dict[str, Any]]:
    """The console's list page over HTTP (in process), rendering included."""
    from starlette.testclient import TestClient

    from durable.ui import create_app

    # Served on loopback, as `durable ui` is by default (elsewhere pages need the token).
    web = TestClient(create_app(client, read_only=True), base_url="http://127.0.0.1:8321")
    out = []
    paths = (
        "/workflows",  # top-level ones, children folded, counted up to 10,000
        "/workflows?children=1",
        "/workflows?status=ERROR&name=app.flow_1",
        "/workflows?id=wf-ab",
        "/workflows?q=kwargs",  # a search every row matches: the first page fills at once
        "/workflows?q=nowhere",  # one no row matches: the list and the count scan every row
    )
    for path in paths:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            assert web.get(path).status_code == 200
            times.append((time.perf_counter() - t0) * 1000)
        out.append({"case": f"GET {path}", "median_ms": statistics.median(times)})
        print(f"== GET {path}: median {statistics.median(times):.2f} ms, max {max(times):.2f} ms")
    return out


def run(admin_url: str, n: int, repeats: int) -> list[dict[str, Any]]:
    name = f"durable_bench_ui_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = _with_db(admin_url, name)
    results: list[dict[str, Any]] = []
    try:
        with durable.Client(url, migrate=True) as client:
            started = time.perf_counter()
            build(url, n)
            print(f"built {n:,} workflows in {time.perf_counter() - started:.1f} s\n")
            statement = client.db.statement("list_workflows")
            for label, kwargs in cases(client).items():
                times = []
                for _ in range(repeats):  # more than 5: also what a prepared plan does
                    t0 = time.perf_counter()
                    rows = client.list_workflows(limit=PAGE, **kwargs)
                    times.append((time.perf_counter() - t0) * 1000)
                with psycopg.connect(url, autocommit=True) as conn:
                    plan = conn.execute(
                        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement, params(kwargs)
                    ).fetchall()
                results.append(
                    {
                        "case": label,
                        "rows": len(rows),
                        "median_ms": statistics.median(times),
                        "max_ms": max(times),
                    }
                )
                print(
                    f"== {label}: {len(rows)} rows, median {statistics.median(times):.2f} ms, "
                    f"max {max(times):.2f} ms over {repeats} calls"
                )
                print("\n".join("   " + r[0] for r in plan) + "\n")
            results += pages(client, repeats)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    return results


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="workflow rows to build")
    parser.add_argument("--repeats", type=int, default=20, help="calls timed per case")
    parser.add_argument(
        "--admin-url",
        default=ADMIN_DEFAULT,
        help="admin URL; a scratch database is created and dropped",
    )
    args = parser.parse_args(argv)
    results = run(args.admin_url, args.n, args.repeats)
    worst = max(results, key=lambda r: r["median_ms"])
    print(f"slowest median: {worst['case']}: {worst['median_ms']:.2f} ms")
    return results


if __name__ == "__main__":
    main()
