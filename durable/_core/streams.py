"""What a run publishes, each write journaled with its call: events, streams, the working
state and the conversation turns.

An event or a stream value is written in the same statement as its journal row, so a
replay writes nothing and the n-th write of a stream key has offset n on every run. The
working state (durable.state) and the turns are rebuilt by replay, since every update is a
journaled call.
"""

from __future__ import annotations

from typing import Any

from durable._base import labels
from durable._base.models import StepKind
from durable._core.journal import barrier, record
from durable._core.ops import Execute, Gen
from durable._core.run import Run, _fenced, check_interrupt
from durable.errors import StreamClosedError


def set_event(run: Run, key: str, value: Any) -> Gen[None]:
    """Publish `value` under `key`, journaled with its call in one statement."""
    label = labels.event(key)
    seq, found = run.journal.next_call(label)
    if found is not None:
        return
    check_interrupt(run)
    text = run.dumps(value, f"the value of event {key!r}")
    yield from barrier(run)
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "step_seq": seq,
        "step_name": label,
        "key": key,
        "value": text,
    }
    _fenced((yield Execute("set_event", params)), run)


def set_event_in_step(run: Run, seq: int, key: str, value: Any) -> Gen[None]:
    """Publish `value` under `key` from the code of the step at position `seq`: at once (a
    long step reports its progress while it runs), with no journal row of its own, since
    a step's inner calls are not journaled: the step's record is its output. The event's
    row carries the step's position, by which a fork copies it. A step run again (after a
    crash, or a retry) sets it again: an event holds its latest value, so writing the same
    value again changes nothing a reader sees, and another value is the newer one. Fenced:
    a run that lost its workflow writes nothing (StaleOwnerError)."""
    text = run.dumps(value, f"the value of event {key!r}")
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "step_seq": seq,
        "key": key,
        "value": text,
    }
    _fenced((yield Execute("set_step_event", params)), run)


def write_stream(run: Run, key: str, value: Any, closing: bool = False) -> Gen[int | None]:
    """Append `value` to stream `key` (or close it), journaled with its call in one
    statement: the n-th write of a key has offset n on every run, and a replay writes
    nothing. Returns the offset written (None for the close)."""
    if key in run.closed_streams:
        raise StreamClosedError(run.workflow_id, key)
    label = labels.stream(key, closing)
    seq, found = run.journal.next_call(label)
    offset = run.stream_offsets.get(key, 0)
    text = None
    if found is None:
        check_interrupt(run)
        if not closing:
            text = run.dumps(value, f"a value of stream {key!r}")  # refused: nothing counts
    if closing:
        run.closed_streams.add(key)
    else:
        run.stream_offsets[key] = offset + 1
    if found is not None:
        return None if closing else offset
    yield from barrier(run)
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "step_seq": seq,
        "step_name": label,
        "key": key,
        "offset": offset,
        "value": text,
        "closed": closing,
        "channel": run.settings.stream_channel,
    }
    _fenced((yield Execute("write_stream", params)), run)
    run.settings.crash_point("after_stream_write")
    return None if closing else offset


def set_attributes(run: Run, attributes: str, shown: Any) -> Gen[None]:
    """Merge `attributes` (a JSON object's text) into the workflow's attributes, journaled
    with its call in one statement (the record holds `shown`, the pairs as the run's
    serializer writes them): a replay or a recovery finds the call and writes nothing."""
    seq, found = run.journal.next_call(labels.ATTRIBUTES)
    if found is not None:
        return
    check_interrupt(run)
    output = run.dumps(shown, "the attributes")
    yield from barrier(run)
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "step_seq": seq,
        "step_name": labels.ATTRIBUTES,
        "attributes": attributes,
        "output": output,
    }
    _fenced((yield Execute("set_attributes", params)), run)


def set_state(run: Run, value: Any) -> Gen[None]:
    seq, found = run.journal.next_call(labels.STATE)
    if found is not None:
        run.state = found.output
        return
    text = run.dumps(value, "the workflow's durable.state")
    yield from record(run, seq, labels.STATE, StepKind.STATE, text, lazy=True)
    run.state = text


def append_turn(run: Run, role: str, content: Any) -> Gen[None]:
    seq, found = run.journal.next_call(labels.TURN)
    if found is not None:
        run.turns.append(run.loads(found.output or "null"))
        return
    text = run.dumps({"role": role, "content": content}, f"a {role!r} turn of the conversation")
    yield from record(run, seq, labels.TURN, StepKind.TURN, text, lazy=True)
    run.turns.append(run.loads(text))
