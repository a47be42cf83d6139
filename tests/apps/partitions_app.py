"""A partitioned queue for worker processes: each run of an entry is recorded in the world
table `partition_runs` (its partition, process and the database's clock at its start and
end), through a connection of its own, so it shows every execution, including those a
SIGKILL cut short (no end)."""

from __future__ import annotations

import os
import time

import psycopg

import durable

registry = durable.Registry()

# At most two entries of one tenant at once, five in all.
tenants = durable.Queue("parts.tenants", concurrency=5, partition_concurrency=2, registry=registry)

DDL = """
CREATE TABLE IF NOT EXISTS partition_runs (id bigserial PRIMARY KEY, entry text NOT NULL,
    partition text NOT NULL, pid int NOT NULL, started_at timestamptz NOT NULL,
    finished_at timestamptz)
"""


@durable.step(registry=registry, name="parts.work")
def work(entry: str, partition: str, seconds: float) -> str:
    url = os.environ["DURABLE_DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO partition_runs (entry, partition, pid, started_at)"
            " VALUES (%s, %s, %s, clock_timestamp()) RETURNING id",
            [entry, partition, os.getpid()],
        ).fetchone()
        assert row is not None
        time.sleep(seconds)
        conn.execute("UPDATE partition_runs SET finished_at = clock_timestamp() WHERE id = %s", row)
    return entry


@durable.workflow(registry=registry, name="parts.job")
def job(entry: str, partition: str, seconds: float) -> str:
    return work(entry, partition, seconds)


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)
