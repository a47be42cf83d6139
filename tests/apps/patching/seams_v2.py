"""Deploy v2 of the seams workflows: each old call stands behind
`durable.patched("refund-as-step")`, and the new branch refunds another way (see
tests/apps/patching/seams.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

import durable
from tests.apps.patching import seams

registry = durable.Registry()


@durable.step(registry=registry, name="seams.child_step")
def child_step(order_id: str) -> str:
    return seams.refund_in_world(order_id, "child")


@durable.step(registry=registry, name="seams.refund_step")
def refund_step(order_id: str) -> str:
    return seams.refund_in_world(order_id, "step")


@durable.workflow(registry=registry, name=seams.REFUND_CHILD)
def refund_child(order_id: str) -> str:
    return child_step(order_id)


@durable.workflow(registry=registry, name=seams.CHILD)
def child_refund(order_id: str) -> str:
    if durable.patched(seams.PATCH):
        return refund_step(order_id)
    handle = durable.start_child(refund_child, order_id, workflow_id=f"refund-{order_id}")
    return str(handle.result())


@durable.transaction(registry=registry, name="seams.app_transaction")
def app_transaction(conn: Connection, order_id: str) -> str:
    return seams.refund_in_app(conn, order_id, "old-transaction")


@durable.transaction(registry=registry, name="seams.app_transaction_v2")
def app_transaction_v2(conn: Connection, order_id: str) -> str:
    return seams.refund_in_app(conn, order_id, "new-transaction")


@durable.workflow(registry=registry, name=seams.APP)
def app_refund(order_id: str) -> str:
    if durable.patched(seams.PATCH):
        return app_transaction_v2(order_id)
    return app_transaction(order_id)


@durable.workflow(registry=registry, name=seams.SEND)
def send_refund(order_id: str, inbox: str) -> str:
    if durable.patched(seams.PATCH):
        durable.send(inbox, {"refund": order_id, "how": "new-send"}, topic="refunds-v2")
        return "sent-v2"
    durable.send(inbox, {"refund": order_id, "how": "old-send"}, topic="refunds")
    return "sent"


@durable.workflow(registry=registry, name=seams.INBOX)
def inbox() -> Any:
    return durable.recv("refunds", timeout=3600)
