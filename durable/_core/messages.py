"""Messages between workflows, from inside one: sending a message, reading another
workflow's event. Each is a journaled call, so a replay neither sends again nor reads a
newer value.

A send is made exactly once across crashes without a transaction over two workflows'
rows: the message's id is derived from the sender's position (or is the caller's
idempotency key), and the receiver stores a message id once. A send cut off between
delivering and journaling is run again on the replay and delivers nothing new.
"""

from __future__ import annotations

from typing import Any

from durable._base import labels
from durable._base.models import StepKind
from durable._core.journal import barrier, encode_error, record, replay, restore
from durable._core.ops import Execute, Gen, Pause
from durable._core.run import Run, check_interrupt
from durable.errors import WorkflowNotFoundError

# How often get_event looks again while it waits, at the most (it starts at FIRST_LOOK).
FIRST_LOOK = 0.05
MAX_LOOK = 1.0


def send(
    run: Run,
    workflow_id: str,
    message: Any,
    topic: str | None,
    idempotency_key: str | None,
) -> Gen[None]:
    """Deliver `message` to `workflow_id` once (WorkflowNotFoundError, journaled, when
    there is no such workflow), and wake it if it waits for one."""
    topic_key = topic or ""
    label = labels.send(topic_key)
    seq, found = run.journal.next_call(label)
    if found is not None:
        if found.error is not None:  # the one failure a send journals
            raise WorkflowNotFoundError(workflow_id)
        return
    check_interrupt(run)
    payload = run.dumps(message, "the message")
    yield from barrier(run)
    exists = yield Execute("get_workflow_status", {"workflow_id": workflow_id}, "one")
    if exists is None:
        error = WorkflowNotFoundError(workflow_id)
        yield from record(run, seq, label, StepKind.SEND, None, encode_error(error))
        raise error
    if idempotency_key is None and run.incarnation is None:
        row = yield Execute("get_incarnation", {"workflow_id": run.workflow_id}, "one")
        run.incarnation = "" if row is None else str(row["incarnation"])
    message_id = idempotency_key or labels.sent_message_id(
        run.workflow_id, seq, run.incarnation or ""
    )
    params = {
        "workflow_id": workflow_id,
        "message_id": message_id,
        "topic": topic_key,
        "payload": payload,
        "sender_id": run.workflow_id,  # what patched() finds at this position
        "sender_seq": seq,
    }
    yield Execute("send_message", params)
    run.settings.crash_point("after_send_message")
    notify = {"channel": run.settings.work_channel, "payload": workflow_id}
    yield Execute("notify_work", notify, "one")
    yield from record(run, seq, label, StepKind.SEND, run.settings.serializer.dumps(message_id))


def get_event(run: Run, workflow_id: str, key: str, timeout: float) -> Gen[Any]:
    """The latest value `workflow_id` published under `key`, looking again until `timeout`
    seconds have been waited; None if it did not appear. The answer is journaled, so a
    replay returns it without reading (or waiting) again."""
    label = labels.read_event(key)
    seq, found = run.journal.next_call(label)
    if found is not None:
        return replay(run, found)
    check_interrupt(run)
    waited, look = 0.0, FIRST_LOOK
    while True:
        row = yield Execute("get_event", {"workflow_id": workflow_id, "key": key}, "one")
        if row is not None:
            text = str(row["value"])
            break
        if waited >= timeout:
            text = run.settings.serializer.dumps(None)
            break
        pause = min(look, timeout - waited)
        yield Pause(pause)
        waited += pause
        look = min(MAX_LOOK, look * 2)
        check_interrupt(run)
    yield from record(run, seq, label, StepKind.RECV, text)
    return restore(run, text, None)
