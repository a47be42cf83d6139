"""Queues for worker processes routed with `--queues`, and a queue limited per key: each
run of an entry is recorded in the world table `route_runs` (its queue, key, process and
the database's clock at its start and end), through a connection of its own, so it shows
every execution, including one a SIGKILL cut short (no end)."""

from __future__ import annotations

import os
import time

import psycopg

import durable

registry = durable.Registry()

# Two queues for two kinds of worker (`--queues routes.a`, `--queues routes.b`).
route_a = durable.Queue("routes.a", registry=registry)
route_b = durable.Queue("routes.b", registry=registry)
# At most two starts per key in any second (across every worker); no other limit.
mail = durable.Queue("routes.mail", partition_rate_limit=(2, 1.0), registry=registry)

DDL = """
CREATE TABLE IF NOT EXISTS route_runs (id bigserial PRIMARY KEY, entry text NOT NULL,
    queue text NOT NULL, key text, pid int NOT NULL, started_at timestamptz NOT NULL,
    finished_at timestamptz)
"""


@durable.step(registry=registry, name="routes.work")
def work(entry: str, queue: str, key: str | None, seconds: float) -> str:
    url = os.environ["DURABLE_DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO route_runs (entry, queue, key, pid, started_at)"
            " VALUES (%s, %s, %s, %s, clock_timestamp()) RETURNING id",
            [entry, queue, key, os.getpid()],
        ).fetchone()
        assert row is not None
        time.sleep(seconds)
        conn.execute("UPDATE route_runs SET finished_at = clock_timestamp() WHERE id = %s", row)
    return entry


@durable.workflow(registry=registry, name="routes.job")
def job(entry: str, queue: str, key: str | None, seconds: float) -> str:
    return work(entry, queue, key, seconds)


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)
