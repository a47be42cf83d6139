"""A workflow id used again after its workflow was pruned: the new workflow is a new life
of the id (its incarnation), and what it derives from its id must not be taken for what
the old one did. Its sends are new messages: a long-lived receiver that consumed the old
workflow's messages still receives the new ones."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import durable


def app() -> tuple[durable.Registry, Any, Any]:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="reuse.receiver")
    def receiver(count: int) -> list[Any]:
        return [durable.recv("orders", timeout=600) for _ in range(count)]

    @durable.workflow(registry=reg, name="reuse.sender")
    def sender(to: str, what: str) -> str:
        durable.send(to, what, topic="orders")
        return what

    return reg, receiver, sender


def test_a_workflow_under_the_id_of_a_pruned_one_sends_new_messages(database_url: str) -> None:
    reg, receiver, sender = app()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        inbox = engine.start(receiver, 2, workflow_id="inbox")
        assert engine.start(sender, "inbox", "first", workflow_id="s").result(timeout=30) == "first"
        deadline = time.monotonic() + 30
        while len(engine.client.steps("inbox")) < 1:  # the first message consumed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pruned = engine.client.prune(durable.RetentionPolicy(finished_after=dt.timedelta(0)))
        assert pruned.workflows == 1  # the sender; the receiver still waits
        # The id again: a new workflow, whose send is another message.
        again = engine.start(sender, "inbox", "second", workflow_id="s")
        assert again.result(timeout=30) == "second"
        assert inbox.result(timeout=30) == ["first", "second"]
