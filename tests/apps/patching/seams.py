"""Calls that leave their mark before their journal row, behind a patch point.

Deploy v1 (`seams_v1`) makes a refund one way at a position; deploy v2 (`seams_v2`) puts
that position behind `durable.patched("refund-as-step")` and refunds another way on the new
branch. A v1 worker dies after the old call left its mark (a child started under an id of
its own, a transaction committed in a separate application database, a message delivered)
and before the parent's journal row; a v2 worker recovers the run. Every refund made, on
either branch, is a row in the `world` table (the child's and the step's) or in the
application database's `refunds` table (the transactions'), so a test counts refunds, and
every message sent is a row of the receiver's inbox.
"""

from __future__ import annotations

import os

from sqlalchemy import Connection, text

from tests.apps.counter_app import World

# The workflows' names, the same in both deploys.
CHILD = "seams.child_refund"
REFUND_CHILD = "seams.refund_child"
APP = "seams.app_refund"
SEND = "seams.send_refund"
INBOX = "seams.inbox"
PATCH = "refund-as-step"

APP_DDL = "CREATE TABLE IF NOT EXISTS refunds (order_id text NOT NULL, how text NOT NULL)"


def app_database_url() -> str:
    """The application database of the workers (not the system database)."""
    return os.environ["SEAMS_APP_DATABASE_URL"]


def refund_in_world(order_id: str, how: str) -> str:
    World.record(order_id, f"refund:{how}")
    return how


def refund_in_app(conn: Connection, order_id: str, how: str) -> str:
    conn.execute(
        text("INSERT INTO refunds (order_id, how) VALUES (:o, :h)"), {"o": order_id, "h": how}
    )
    return how
