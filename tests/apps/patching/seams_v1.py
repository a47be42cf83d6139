"""Deploy v1 of the seams workflows: each refunds through a call that leaves its mark
before its journal row (see tests/apps/patching/seams.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

import durable
from tests.apps.patching import seams

registry = durable.Registry()


@durable.step(registry=registry, name="seams.child_step")
def child_step(order_id: str) -> str:
    return seams.refund_in_world(order_id, "child")


@durable.workflow(registry=registry, name=seams.REFUND_CHILD)
def refund_child(order_id: str) -> str:
    return child_step(order_id)


@durable.workflow(registry=registry, name=seams.CHILD)
def child_refund(order_id: str) -> str:
    # A child under an id the code chose (not the one derived from this position).
    handle = durable.start_child(refund_child, order_id, workflow_id=f"refund-{order_id}")
    return str(handle.result())


@durable.transaction(registry=registry, name="seams.app_transaction")
def app_transaction(conn: Connection, order_id: str) -> str:
    return seams.refund_in_app(conn, order_id, "old-transaction")


@durable.workflow(registry=registry, name=seams.APP)
def app_refund(order_id: str) -> str:
    return app_transaction(order_id)


@durable.workflow(registry=registry, name=seams.SEND)
def send_refund(order_id: str, inbox: str) -> str:
    durable.send(inbox, {"refund": order_id, "how": "old-send"}, topic="refunds")
    return "sent"


@durable.workflow(registry=registry, name=seams.INBOX)
def inbox() -> Any:
    return durable.recv("refunds", timeout=3600)
