"""How a run reads back and writes its journal: replay, stored errors, durability barriers.

A journaled call replays what it returned (or raised) the first time: `replay` rebuilds
the stored value as the function's return type, and `rebuild_error` turns a stored
failure back into an exception (built-in types as themselves, anything else as a
StepError). Errors are always stored as JSON, whatever the value serializer. Writing is
`record`, which lets lazy records (plain steps, state, turns) wait for the durability
mode, and `barrier`, which writes everything a run still holds before anything that
cannot be redone (an effect, a transaction, a child, a wait, the finish).
"""

from __future__ import annotations

import builtins
import datetime as dt
import json
import traceback as tb
from collections.abc import Callable
from typing import Any

from durable._models import StepKind, StepRecord
from durable._protocol.ops import AwaitWriter, Enqueue, Execute, Gen, WriteSteps
from durable._protocol.run import Run, _fenced
from durable.errors import (
    StaleOwnerError,
    StepError,
    WorkflowCancelledError,
    WorkflowTimeoutError,
)
from durable.serialization import rebuild, return_type


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a __str__ that raises must not lose the failure itself
        return f"<{type(exc).__qualname__} whose str() raised>"


def _trace(exc: BaseException) -> str:
    try:
        return "".join(tb.format_exception(exc))
    except Exception:
        return (
            "".join(tb.format_tb(exc.__traceback__)) + f"{type(exc).__qualname__}: {_text(exc)}\n"
        )


def encode_error(exc: BaseException) -> str:
    """Errors are always stored as JSON, whatever the value serializer is. An exception
    whose str() raises is still recorded (with a stand-in message)."""
    cls = type(exc)
    return json.dumps(
        {
            "type": f"{cls.__module__}.{cls.__qualname__}",
            "message": _text(exc),
            "traceback": _trace(exc),
        }
    )


def decode_error(text: str) -> tuple[str, str, str]:
    data = json.loads(text)
    return str(data.get("type", "")), str(data.get("message", "")), str(data.get("traceback", ""))


# How a child workflow called directly can end in its parent, besides its own error: the
# parent's `except` on the first run must catch the same type on every replay.
_CHILD_ENDINGS: dict[str, type[WorkflowCancelledError]] = {
    "durable.errors.WorkflowTimeoutError": WorkflowTimeoutError,
    "durable.errors.WorkflowCancelledError": WorkflowCancelledError,
}


def rebuild_error(step_name: str, text: str, child_id: str | None = None) -> BaseException:
    """The exception to raise when replaying a failed step.

    Built-in exception types are rebuilt (they take a message and run no user code), and
    so is a child's timeout or cancellation (`child_id`: the record is a child's);
    anything else becomes a StepError carrying the recorded type, message and traceback.
    """
    error_type, message, trace = decode_error(text)
    if child_id is not None and (ending := _CHILD_ENDINGS.get(error_type)) is not None:
        rebuilt_ending = ending(child_id)
        rebuilt_ending.args = (message,)  # the first run's words (its timeout, its reason)
        return rebuilt_ending
    module, _, qualname = error_type.rpartition(".")
    if module == "builtins":
        cls = getattr(builtins, qualname, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                rebuilt = cls(message)
            except Exception:
                pass
            else:
                rebuilt.__cause__ = StepError(step_name, error_type, message, trace)
                return rebuilt
    return StepError(step_name, error_type, message, trace)


def replay(run: Run, record: StepRecord, fn: Callable[..., Any] | None = None) -> Any:
    """Return (or raise) what a journaled call returned (or raised) the first time: the
    stored value, rebuilt as `fn`'s return type when it declares one (see Run.keep)."""
    if record.error is not None:
        child = record.child_workflow_id if record.kind is StepKind.CHILD else None
        raise rebuild_error(record.step_name, record.error, child)
    return restore(run, record.output, fn)


def restore(run: Run, text: str | None, fn: Callable[..., Any] | None) -> Any:
    """A stored value as a replay sees it (the same value Run.keep handed out)."""
    if text is None:
        return None
    value = run.settings.serializer.loads(text)
    if fn is None:
        return value
    annotation = return_type(fn)
    if annotation is None:
        return value
    try:
        return rebuild(value, annotation)
    except Exception:
        # Journaled by code with another annotation: the stored value, as it is.
        return value


def barrier(run: Run) -> Gen[None]:
    """Write every record the run still holds: the barrier before an effect, transaction,
    child, wait or final status, in every durability mode."""
    if run.mode == "exit":
        if not run.pending:
            return
        rows, run.pending = run.pending, []
        written = yield WriteSteps(rows)
        if len(written) < len(rows):
            raise StaleOwnerError(run.workflow_id, run.epoch)
    elif run.mode == "async":
        yield AwaitWriter()


def record(
    run: Run,
    seq: int,
    name: str,
    kind: StepKind,
    output: str | None,
    error: str | None = None,
    attempts: int = 1,
    started: dt.datetime | None = None,
    child_id: str | None = None,
    *,
    lazy: bool = False,
) -> Gen[None]:
    """Journal one call. `lazy` (plain steps, state and turns) lets the run's durability
    mode defer the write; every other record is a barrier and first writes what the run
    still holds."""
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "step_seq": seq,
        "step_name": name,
        "kind": kind.value,
        "output": output,
        "error": error,
        "attempts": attempts,
        "child_workflow_id": child_id,
        "started_at": started,
    }
    if run.mode != "sync":
        if lazy:
            if run.mode == "exit":
                run.pending.append(params)
            else:
                yield Enqueue(params)
            return
        yield from barrier(run)
    _fenced((yield Execute("record_step", params)), run)
