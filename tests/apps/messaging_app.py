"""Workflows that message each other, for the crash tests of durable.send.

`messaging.sender` sends `n` messages to another workflow, each from workflow code (a
journaled send); `messaging.receiver` receives `n` and returns them in order. The crash
point `after_send_message` lies between a message's delivery and its journal row.
"""

from __future__ import annotations

import durable
from tests.apps.counter_app import World

registry = durable.Registry()


@durable.step(registry=registry, name="messaging.note")
def note(workflow_id: str, what: str) -> None:
    World.record(workflow_id, what)


@durable.workflow(registry=registry, name="messaging.sender")
def sender(to: str, n: int) -> int:
    for i in range(n):
        durable.send(to, f"m{i}", topic="orders")
        note("sender", f"sent m{i}")
    return n


@durable.workflow(registry=registry, name="messaging.receiver")
def receiver(n: int) -> list[str]:
    return [durable.recv("orders", timeout=120) for _ in range(n)]
