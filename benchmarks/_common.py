"""What several benchmarks share."""

from __future__ import annotations

import time
from typing import Any

import psycopg


def wait_for_success(
    conn: psycopg.Connection[Any], n: int, timeout: float, what: str, poll: float = 0.01
) -> None:
    """Poll until `n` workflows are SUCCESS; TimeoutError naming how many were after
    `timeout` seconds (a broken run fails the benchmark instead of hanging it)."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(
            "SELECT count(*) FROM durable.workflows WHERE status = 'SUCCESS'"
        ).fetchone()
        done = row[0] if row is not None else 0
        if done >= n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: only {done} of {n} workflows finished in {timeout:.0f} s")
        time.sleep(poll)
