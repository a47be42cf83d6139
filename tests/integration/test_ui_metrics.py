"""The console's /metrics: the system database's counts in Prometheus' text format, behind
the console's guard like every page."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

import durable
from durable.ui import TOKEN_HEADER, create_app

pytest.importorskip("prometheus_client", reason="pip install 'durable-pg[metrics]'")
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "s3cret-token-of-the-metrics-scrape-Hz4"
reg = durable.Registry()
queue = durable.Queue("mq", partition_concurrency=1, registry=reg)


@durable.workflow(registry=reg, name="um.echo")
def echo(n: int) -> int:
    return n


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_console_metrics(database_url: str) -> None:
    with durable.Engine(database_url, registry=reg) as engine:
        for n in range(2):
            assert engine.start(echo, n).result(timeout=30) == n
        for n in range(3):
            queue.enqueue(echo, n, partition_key="p1" if n else "p0")
        app = create_app(engine.client, token=TOKEN)
        web = TestClient(app, base_url="http://127.0.0.1:8321")
        answer = web.get("/metrics")
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain")
        samples = _samples(answer.text)
        # Finished workflows are counted by the workers that finish them, not read here.
        success = frozenset({("status", "SUCCESS"), ("workflow", "um.echo")})
        assert ("durable_workflows", success) not in samples
        queued = frozenset({("status", "ENQUEUED"), ("workflow", "um.echo")})
        assert samples[("durable_workflows", queued)] == 3
        mq = frozenset({("queue", "mq")})
        assert samples[("durable_queue_depth", mq)] == 3
        assert samples[("durable_queue_oldest_wait_seconds", mq)] >= 0
        assert samples[("durable_database_scrape_ok", frozenset())] == 1
        # Beyond loopback the guard asks for the token, as for every page.
        lan = TestClient(app, base_url="http://192.0.2.10:8321")
        assert lan.get("/metrics").status_code == 401
        assert lan.get("/metrics", headers={TOKEN_HEADER: TOKEN}).status_code == 200


def test_queue_metrics_series_do_not_grow_with_partition_keys(database_url: str) -> None:
    keys = 200
    with durable.Engine(database_url, registry=reg) as engine:
        for n in range(keys):
            queue.enqueue(echo, n, partition_key=f"tenant-{n}")
        app = create_app(engine.client, token=TOKEN)
        web = TestClient(app, base_url="http://127.0.0.1:8321")
        samples = _samples(web.get("/metrics").text)
        depth = [labels for name, labels in samples if name == "durable_queue_depth"]
        assert sum(v for (n, _), v in samples.items() if n == "durable_queue_depth") == keys
        # A bounded number of series per queue, whatever keys callers choose.
        assert len(depth) < keys // 10


def _rows_read(plan: dict[str, Any], relation: str) -> float:
    """Rows the scans of `relation` in an EXPLAIN ANALYZE plan returned, over all loops."""
    own = plan["Actual Rows"] * plan["Actual Loops"] if plan.get("Relation Name") == relation else 0
    return own + sum(_rows_read(child, relation) for child in plan.get("Plans", []))


def test_a_scrape_does_not_read_every_finished_workflow(database_url: str) -> None:
    finished = 20_000
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs)"
            " SELECT 'done-' || g, 'um.echo', 'SUCCESS', '[]' FROM generate_series(1, %s) g",
            (finished,),
        )
        conn.execute("ANALYZE durable.workflows")
    with durable.Client(database_url) as client:
        sql = client.db.statement("metrics_workflows")
    with psycopg.connect(database_url) as conn:
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql).fetchone()
    assert row is not None
    assert _rows_read(row[0][0]["Plan"], "workflows") < finished
