# Generated from durable/_run/waits_async.py by tools/async_to_sync.py: do not edit.
# Edit the source, then run `python tools/async_to_sync.py`
# (tests/unit/test_generated_sync.py fails while this file is out of date).
"""Waiting without a process: approval gates, durable sleep, messages and events; and
sending messages and reading events from inside a workflow.

A wait is journaled like a step. The first time a workflow reaches it, the run records
the request and suspends the workflow in one fenced write: the row becomes SUSPENDED with
no owner, and the run unwinds (WorkflowSuspended), freeing its worker slot and thread.
Whatever ends the wait (a decision, a message, the time, a timeout) sets the workflow back
to PENDING; any worker claims it and replays it to the wait, which now finds its answer,
journals it and returns. Crash recovery and deliberate pauses are the same machinery. The
decisions are in `_core` (`gate`, `sleep`, `recv`, `set_event`); these are the public
functions that drive them.

This module is the source of the awaited forms (`durable.sleep_async`, ...), for async
workflows; `_run/waits.py`, the plain ones, is generated from it by tools/async_to_sync.py.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Mapping
from typing import Any, TypeVar, overload

from durable import _core as protocol
from durable._base.models import Decision
from durable._base.names import check_name
from durable._core import Run
from durable._run.acompat import called, workflow_run
from durable._run.attributes import AttributeValue, check_attributes
from durable._run.attributes import encode as encode_attributes
from durable._run.context import (
    current_engine,
    current_run,
    current_step,
    refuse_on_loop,
    workflow_code_run,
)
from durable._run.driver import drive
from durable._run.in_step import drive_in_step
from durable.errors import ConfigurationError, InvalidWaitError, NoEngineError

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
    (`await durable.approval_async(...)` in an async workflow.)
    """
    check_name("name", name)
    seconds = None if timeout is None else _seconds(timeout, "timeout")
    run = workflow_run("durable.approval()")
    gen = protocol.approval(run, name, payload, timeout=seconds, default=default)
    return drive(run, gen)


def sleep(seconds: float | dt.timedelta) -> None:
    """Sleep durably: the wake-up time is journaled first; a long sleep suspends the workflow
    (no worker slot, no thread; in an async workflow, `await durable.sleep_async(...)`, no
    task either) and any worker resumes it when it is due, even after every worker
    restarted. A resumed workflow only sleeps what is left."""
    duration = _seconds(seconds, "seconds")
    run = workflow_run("durable.sleep()")
    drive(run, protocol.sleep(run, duration))


T = TypeVar("T")


@overload
def recv(topic: str | None = None, timeout: float | dt.timedelta | None = None) -> Any: ...
@overload
def recv(topic: str | None = None, timeout: None = None, *, type: type[T]) -> T: ...
@overload
def recv(
    topic: str | None = None, timeout: float | dt.timedelta | None = None, *, type: type[T]
) -> T | None: ...
def recv(
    topic: str | None = None,
    timeout: float | dt.timedelta | None = None,
    *,
    type: type[Any] | None = None,  # (the name callers write: type=Order)
) -> Any:
    """Receive the oldest message sent to this workflow on `topic`, or None on timeout.

    The message is consumed in the same statement that journals this step, so it is
    consumed exactly once, across crashes. While nothing is there the workflow suspends.
    (`await durable.recv_async(...)` in an async workflow.)

    `type=`: what the sender sends (`recv("orders", type=dict)`), for the type checker:
    the call is typed as returning it (or None, with a `timeout`). It is not checked or
    converted at run time: the message is what the serializer decoded (JSON values by
    default), so build a dataclass or a model from it yourself."""
    check_name("topic", topic, optional=True)
    run = workflow_run("durable.recv()")
    seconds = None if timeout is None else _seconds(timeout, "timeout")
    return drive(run, protocol.recv(run, topic, seconds))


# How long a callback URL answers when the call names no lifetime.
CALLBACK_LIFETIME = dt.timedelta(days=7)


def callback_url(
    topic: str | None = None,
    *,
    approval: str | None = None,
    base_url: str | None = None,
    expires_in: float | dt.timedelta = CALLBACK_LIFETIME,
) -> str:
    """A single-use URL that completes a wait when a third party POSTs JSON to it, with no
    token of the console's: the URL's own token (unguessable, stored only as its sha256)
    is the credential.

    By default the posted body is delivered as a message on `topic` (what `recv(topic)` or
    a `wait_first` branch `on_message(topic)` returns); with `approval=name` it decides that
    gate (`{"approved": true, "comment": "...", "by": "..."}`). Mint it before the wait and
    hand it to the third party in a step: a message posted before the workflow waits is kept
    for it. The call is journaled: a replay returns the same URL, and no second token is
    minted. After `expires_in` (default 7 days) a POST answers 410; a second POST answers
    409 with the first one's outcome. `base_url`: where the console (`durable ui`) or `durable
    callbacks serve` is reached (else DURABLE_CALLBACK_BASE_URL); the workers need
    DURABLE_CALLBACK_SECRET. (`await durable.callback_url_async(...)` in an async workflow.)"""
    check_name("topic", topic, optional=True)
    check_name("approval", approval, optional=True)
    if topic is not None and approval is not None:
        raise ConfigurationError(
            f"callback_url(topic={topic!r}, approval={approval!r}): a URL completes one wait, "
            "a message on a topic or a gate's decision: give one of them"
        )
    kind, target = ("message", topic or "") if approval is None else ("approval", approval)
    seconds = _seconds(expires_in, "expires_in")
    if seconds <= 0:
        raise InvalidWaitError(f"expires_in={expires_in!r}: give a lifetime above zero")
    nonce = secrets.token_urlsafe(32)
    run = workflow_run("durable.callback_url()")
    gen = protocol.callback_url(run, kind, target, base_url, seconds, nonce)
    return drive(run, gen)


def set_event(key: str, value: Any) -> None:
    """Publish `value` under `key` for readers outside the workflow (engine.get_event).

    From workflow code the call is journaled: a replay publishes nothing again. From a
    step's code it is published at once, as part of that step (a long step reports its
    progress): a step run again after a crash or a failed attempt publishes again, and a
    reader sees the latest value written. (`await durable.set_event_async(...)` in an async
    workflow or an async step's code.)"""
    check_name("key", key)
    in_step = _event_step(called("durable.set_event()"))
    if in_step is not None:
        run, seq = in_step
        drive_in_step(run, protocol.set_event_in_step(run, seq, key, value))
        return
    run = workflow_run("durable.set_event()")
    drive(run, protocol.set_event(run, key, value))


def set_attributes(attributes: Mapping[str, AttributeValue]) -> None:
    """Add `attributes` to this workflow run's (keys given replace the same keys; the
    others stay), for filters to find it (durable.RunFilter, `durable workflows list
    --attr`, the console). Journaled at its position: a replay or a recovery sets nothing
    again. Call it from the workflow function itself, not from a step's code. (`await
    durable.set_attributes_async(...)` in an async workflow.)"""
    checked = check_attributes(attributes)
    run = workflow_run("durable.set_attributes()")
    drive(run, protocol.set_attributes(run, encode_attributes(checked), checked))


def _step_run(what: str) -> tuple[Run, int] | None:
    """The run and position of the step whose code is calling, None outside a step's code.
    A sync call from an async step, on its workflow's event loop, would block that loop:
    BlockingCallError, naming the awaited twin."""
    run = current_run.get()
    scope = current_step.get()
    if run is None or scope is None:
        return None
    refuse_on_loop(run, what)
    return run, scope.seq


def _event_step(what: str) -> tuple[Run, int] | None:
    """_step_run for an event set from a step's code: the step must have a position of its
    own in the journal, which the event's row is written under."""
    in_step = _step_run(what)
    if in_step is not None and in_step[1] < 0:
        raise NoEngineError(f"{what} must be called from a workflow or a step's code")
    return in_step


def send(
    workflow_id: str,
    message: Any,
    topic: str | None = None,
    *,
    idempotency_key: str | None = None,
) -> None:
    """Send `message` to workflow `workflow_id` (it wakes if it waits in recv()).

    From workflow code the send is journaled: it is made exactly once, across crashes and
    replays (the message's id is derived from this call's position, or is
    `idempotency_key`). Elsewhere (a step's code, or code inside `with durable.Engine()`)
    it is the engine's `send`, made each time it is called. (`await durable.send_async(...)`
    in an async workflow, or in async code under an engine.)"""
    check_name("workflow_id", workflow_id)
    check_name("topic", topic, optional=True)
    check_name("idempotency_key", idempotency_key, optional=True)
    run = workflow_code_run()
    if run is None:
        what = called("durable.send()")
        _step_run(what)
        _engine(what).send(workflow_id, message, topic, idempotency_key)
        return
    run = workflow_run("durable.send()")
    drive(run, protocol.send(run, workflow_id, message, topic, idempotency_key))


@overload
def get_event(workflow_id: str, key: str, timeout: float | dt.timedelta = 0.0) -> Any: ...
@overload
def get_event(
    workflow_id: str, key: str, timeout: float | dt.timedelta = 0.0, *, type: type[T]
) -> T | None: ...
def get_event(
    workflow_id: str,
    key: str,
    timeout: float | dt.timedelta = 0.0,
    *,
    type: type[Any] | None = None,  # (the name callers write: type=Order)
) -> Any:
    """The latest value workflow `workflow_id` published under `key`, waiting up to
    `timeout` for it to appear; None if it did not. `type=`: the value's type, for the
    type checker only (as recv's: not checked or converted at run time).

    From workflow code the answer is journaled: a replay returns what the first run read
    (it does not read, or wait, again). Elsewhere it is the engine's `get_event`.
    (`await durable.get_event_async(...)` in an async workflow, or in async code under an
    engine.)"""
    check_name("workflow_id", workflow_id)
    check_name("key", key)
    seconds = _seconds(timeout, "timeout")
    run = workflow_code_run()
    if run is None:
        what = called("durable.get_event()")
        _step_run(what)
        return _engine(what).get_event(workflow_id, key, seconds)
    run = workflow_run("durable.get_event()")
    return drive(run, protocol.get_event(run, workflow_id, key, seconds))


def _engine(what: str) -> Any:
    """The engine that code outside a workflow's own body runs under (a step's run's, or
    the one of `with durable.Engine()`)."""
    outer = current_run.get()
    engine = outer.host.active if outer is not None else current_engine.get()
    if engine is None:
        raise NoEngineError(
            f"{what} was called outside a workflow with no active engine: call it inside "
            "`with durable.Engine(...)`, or use client.send / client.get_event"
        )
    return engine
