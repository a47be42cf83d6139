"""An agent that waits for the first of an approval, a message and a day, for the crash
tests of durable.wait_first (sync and async twins).

`waits.agent` notes a step, waits for the first of approval "refund", a message on "chat"
and 24 hours, notes the winner, waits again for the first of the same approval and a
message, notes that, and reads what is left on "chat". Every note is a row of the world
table. The crash point `after_wait_first` lies right after a win is journaled.
"""

from __future__ import annotations

from typing import Any

import durable
from tests.apps.counter_app import World

registry = durable.Registry()

DAY = 24 * 3600


@durable.step(registry=registry, name="waits.note")
def note(workflow_id: str, what: str) -> None:
    World.record(workflow_id, what)


def _plain(value: Any) -> Any:
    return value.approved if isinstance(value, durable.Decision) else value


@durable.workflow(registry=registry, name="waits.agent")
def agent(tag: str) -> dict[str, Any]:
    note(tag, "before")
    first = durable.wait_first(
        [durable.on_approval("refund"), durable.on_message("chat"), durable.on_timer(DAY)]
    )
    note(tag, f"won {first.index} {_plain(first.value)}")
    second = durable.wait_first([durable.on_approval("refund"), durable.on_message("chat")])
    note(tag, f"won {second.index} {_plain(second.value)}")
    later = durable.recv("chat", timeout=0)
    note(tag, f"later {later}")
    return {
        "first": [first.index, _plain(first.value)],
        "second": [second.index, _plain(second.value)],
        "later": later,
    }


@durable.workflow(registry=registry, name="waits.agent_async")
async def agent_async(tag: str) -> dict[str, Any]:
    await durable.to_thread(note, tag, "before")
    first = await durable.wait_first_async(
        [durable.on_approval("refund"), durable.on_message("chat"), durable.on_timer(DAY)]
    )
    await durable.to_thread(note, tag, f"won {first.index} {_plain(first.value)}")
    second = await durable.wait_first_async(
        [durable.on_approval("refund"), durable.on_message("chat")]
    )
    await durable.to_thread(note, tag, f"won {second.index} {_plain(second.value)}")
    later = await durable.recv_async("chat", timeout=0)
    await durable.to_thread(note, tag, f"later {later}")
    return {
        "first": [first.index, _plain(first.value)],
        "second": [second.index, _plain(second.value)],
        "later": later,
    }
