"""An application that starts a workflow inside its own transaction, for crash tests: it
inserts an order and starts `counter.three_steps` for it with `conn=` on the same psycopg
connection, then SIGKILLs itself right before or right after its COMMIT.

Usage: python -m tests.apps.txn_app (before_commit|after_commit) DATABASE_URL ORDER_ID
"""

from __future__ import annotations

import os
import signal
import sys

import psycopg

import durable
from tests.apps import counter_app

ORDERS_DDL = "CREATE TABLE IF NOT EXISTS orders (order_id text PRIMARY KEY)"


def main(argv: list[str]) -> int:
    mode, url, order_id = argv
    counter_app.setup(url)
    with psycopg.connect(url, autocommit=True) as setup:
        setup.execute(ORDERS_DDL)
    # Not a worker: were it alive after the commit, its keeper would run the workflow.
    with durable.Engine(url, registry=counter_app.registry, lease_seconds=1.0) as engine:
        conn = psycopg.connect(url)
        conn.execute("INSERT INTO orders (order_id) VALUES (%s)", [order_id])
        engine.start(counter_app.three_steps, order_id, workflow_id=order_id, conn=conn)
        if mode == "before_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        conn.commit()
        # Nothing after the application's commit: not a claim, not a launch.
        os.kill(os.getpid(), signal.SIGKILL)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
