"""Waiting without a process: approval gates, durable sleep, messages and events.

A wait is journaled like a step. The first time a workflow reaches it, the run records
the request and suspends the workflow in one fenced write: the row becomes SUSPENDED with
no owner, and the run unwinds (WorkflowSuspended), freeing its worker slot and thread.
Whatever ends the wait (a decision, a message, the time, a timeout) sets the workflow back
to PENDING; any worker claims it and replays it to the wait, which now finds its answer,
journals it and returns. Crash recovery and deliberate pauses are the same machinery. The
decisions are in `_protocol` (`gate`, `sleep`, `recv`, `set_event`); these are the public
functions that drive them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from durable import _protocol as protocol
from durable._driver import drive, workflow_run
from durable._driver_async import drive_async, workflow_run_async
from durable._models import Decision
from durable._names import check_name
from durable.errors import InvalidWaitError

__all__ = [
    "Decision",
    "approval",
    "approval_async",
    "recv",
    "recv_async",
    "set_event",
    "set_event_async",
    "sleep",
    "sleep_async",
]


# The longest wait accepted (100 years): beyond it a wake-up time overflows.
_MAX_WAIT = 100 * 365.25 * 86400


def _seconds(value: float | dt.timedelta, what: str) -> float:
    try:
        seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not 0 <= seconds <= _MAX_WAIT:  # negative, NaN, inf, huge
        raise InvalidWaitError(
            f"{what}={value!r}: give a duration of zero or more seconds, at most 100 years "
            "(a number or a datetime.timedelta)"
        )
    return seconds


def approval(
    name: str,
    payload: Any = None,
    *,
    timeout: float | dt.timedelta | None = None,
    default: bool = False,
) -> Decision:
    """Wait, durably, for a person to approve or deny `name`; return the Decision.

    The workflow is suspended while it waits (no worker slot is held) and resumes on
    `engine.decide(...)` or `durable approvals approve|deny`. With `timeout`, nobody
    deciding in time decides `default`. On replay the recorded decision is returned.
    """
    check_name("name", name)
    seconds = None if timeout is None else _seconds(timeout, "timeout")
    run = workflow_run("durable.approval()")
    return drive(run, protocol.approval(run, name, payload, timeout=seconds, default=default))


def sleep(seconds: float | dt.timedelta) -> None:
    """Sleep durably: the wake-up time is journaled first; a long sleep suspends the workflow
    (no worker slot, no thread) and any worker resumes it when it is due, even after every
    worker restarted. A resumed workflow only sleeps what is left."""
    duration = _seconds(seconds, "seconds")
    run = workflow_run("durable.sleep()")
    drive(run, protocol.sleep(run, duration))


def recv(topic: str | None = None, timeout: float | dt.timedelta | None = None) -> Any:
    """Receive the oldest message sent to this workflow on `topic`, or None on timeout.

    The message is consumed in the same statement that journals this step, so it is
    consumed exactly once, across crashes. While nothing is there the workflow suspends."""
    check_name("topic", topic, optional=True)
    run = workflow_run("durable.recv()")
    seconds = None if timeout is None else _seconds(timeout, "timeout")
    return drive(run, protocol.recv(run, topic, seconds))


def set_event(key: str, value: Any) -> None:
    """Publish `value` under `key` for readers outside the workflow (engine.get_event)."""
    check_name("key", key)
    run = workflow_run("durable.set_event()")
    drive(run, protocol.set_event(run, key, value))


# -- the same waits in async workflows: awaited, holding no thread --------------------------------


async def approval_async(
    name: str,
    payload: Any = None,
    *,
    timeout: float | dt.timedelta | None = None,
    default: bool = False,
) -> Decision:
    """approval(), awaited in an async workflow."""
    check_name("name", name)
    seconds = None if timeout is None else _seconds(timeout, "timeout")
    run = workflow_run_async("durable.approval_async()")
    gen = protocol.approval(run, name, payload, timeout=seconds, default=default)
    return await drive_async(run, gen)


async def sleep_async(seconds: float | dt.timedelta) -> None:
    """sleep(), awaited in an async workflow: a long sleep ends the workflow's task (no
    thread, no connection) until a worker resumes it when it is due."""
    duration = _seconds(seconds, "seconds")
    run = workflow_run_async("durable.sleep_async()")
    await drive_async(run, protocol.sleep(run, duration))


async def recv_async(topic: str | None = None, timeout: float | dt.timedelta | None = None) -> Any:
    """recv(), awaited in an async workflow."""
    check_name("topic", topic, optional=True)
    run = workflow_run_async("durable.recv_async()")
    seconds = None if timeout is None else _seconds(timeout, "timeout")
    return await drive_async(run, protocol.recv(run, topic, seconds))


async def set_event_async(key: str, value: Any) -> None:
    """set_event(), awaited in an async workflow."""
    check_name("key", key)
    run = workflow_run_async("durable.set_event_async()")
    await drive_async(run, protocol.set_event(run, key, value))
