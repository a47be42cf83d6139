"""Debounced workflows for tests across processes: every run is recorded in `debounce_runs`.

The table is written through its own autocommit connection, outside durable, so it shows
every run that really happened.

Usage: python -m tests.apps.debounce_app burst DATABASE_URL WHICH KEY TAG CALLS GO_AT
  debounces KEY CALLS times with the inputs "TAG-0", "TAG-1", ... (WHICH: "slow", a period
  of an hour, or "quick", a fifth of a second), starting at the epoch second GO_AT so that
  several processes collide; prints [[input, workflow_id], ...] as JSON.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import psycopg

import durable

registry = durable.Registry()

DDL = """
CREATE TABLE IF NOT EXISTS debounce_runs (id bigserial PRIMARY KEY, workflow_id text,
    text text, pid int)
"""


URL = {"url": ""}


def setup(url: str) -> None:
    URL["url"] = url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)


@durable.workflow(registry=registry, name="debounce.sync")
def sync_profile(key: str, text: str) -> str:
    run_id = durable.workflow_id()
    assert run_id is not None
    with psycopg.connect(URL["url"] or os.environ["DURABLE_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO debounce_runs (workflow_id, text, pid) VALUES (%s, %s, %s)",
            [run_id, text, os.getpid()],
        )
    return text


slow = durable.Debouncer(sync_profile, period=3600, registry=registry)
quick = durable.Debouncer(sync_profile, period=0.2, max_wait=1.0, registry=registry)


def burst(url: str, which: str, key: str, tag: str, calls: int, go_at: float) -> None:
    debouncer = slow if which == "slow" else quick
    out: list[list[str]] = []
    with durable.Client(url) as client:
        time.sleep(max(0.0, go_at - time.time()))
        for i in range(calls):
            text = f"{tag}-{i}"
            out.append([text, client.debounce(debouncer, key, key, text).workflow_id])
            if which == "quick":
                time.sleep(random.uniform(0.0, 0.1))
    print(json.dumps(out))


if __name__ == "__main__":
    _, command, url, which, key, tag, calls, go_at = sys.argv
    assert command == "burst"
    burst(url, which, key, tag, int(calls), float(go_at))
