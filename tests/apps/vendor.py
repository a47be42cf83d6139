"""A fake payments vendor that lives outside the worker process: its ledger is a table.

`refund` honours idempotency keys the way Stripe does when `dedup` is on; `moved` records
every payment that really happened, so tests can count money, not log lines.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

DDL = """
CREATE TABLE IF NOT EXISTS vendor_receipts (
    idempotency_key text PRIMARY KEY, receipt text NOT NULL, cents int NOT NULL);
CREATE TABLE IF NOT EXISTS vendor_moved (
    id bigserial PRIMARY KEY, idempotency_key text NOT NULL, cents int NOT NULL);
"""


def _url() -> str:
    # DURABLE_VENDOR_URL puts the vendor on a server of its own (the failover test's
    # vendor must outlive the database durable runs on).
    return os.environ.get("DURABLE_VENDOR_URL") or os.environ["DURABLE_DATABASE_URL"]


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)


def refund(order_id: str, cents: int, idempotency_key: str, *, dedup: bool) -> dict[str, Any]:
    with psycopg.connect(_url(), autocommit=True) as conn, conn.transaction():
        if dedup:
            row = conn.execute(
                "SELECT receipt, cents FROM vendor_receipts WHERE idempotency_key = %s FOR UPDATE",
                [idempotency_key],
            ).fetchone()
            if row is not None:
                return {"id": row[0], "cents": row[1]}
        moved = conn.execute(
            "INSERT INTO vendor_moved (idempotency_key, cents) VALUES (%s, %s) RETURNING id",
            [idempotency_key, cents],
        ).fetchone()
        assert moved is not None
        receipt = f"re_{moved[0]}"
        conn.execute(
            "INSERT INTO vendor_receipts VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            [idempotency_key, receipt, cents],
        )
        return {"id": receipt, "cents": cents}


def lookup(idempotency_key: str) -> dict[str, Any] | None:
    with psycopg.connect(_url()) as conn:
        row = conn.execute(
            "SELECT receipt, cents FROM vendor_receipts WHERE idempotency_key = %s",
            [idempotency_key],
        ).fetchone()
    return None if row is None else {"id": row[0], "cents": row[1]}


def moved(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT cents FROM vendor_moved ORDER BY id")]
