"""How a run reads back and writes its journal: replay, stored errors, durability barriers.

A journaled call replays what it returned (or raised) the first time: `replay` rebuilds
the stored value as the function's return type, and `rebuild_error` turns a stored
failure back into an exception (built-in types as themselves, anything else as a
StepError). Errors are always stored as JSON, whatever the value serializer. Writing is
`record`, which lets lazy records (plain steps, state, turns) wait for the durability
mode, and `barrier`, which writes everything a run still holds before anything that
cannot be redone (an effect, a transaction, a child, a wait, the finish). A record whose
write an outage cuts off is sent again while the run's lease may hold (`outlast`): the
call it records has run, and giving up would have recovery run it again.
"""

from __future__ import annotations

import builtins
import datetime as dt
import json
import traceback as tb
from collections.abc import Callable
from typing import Any

from durable._base.models import StepKind, StepRecord
from durable._core.faults import Fault
from durable._core.ops import (
    AwaitWriter,
    Enqueue,
    Execute,
    Gen,
    LeaseClock,
    Pause,
    RecordStep,
    WriteSteps,
    outage_backoff,
)
from durable._core.run import Run, _fenced, lease_may_hold
from durable.errors import (
    DatabaseUnavailableError,
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
        # The held records are of calls that ran: sent again while the lease may hold, as
        # one record is (a resend that meets the first send's rows finds them).
        written = yield from sent(run, WriteSteps(rows), [run.workflow_id] * len(rows))
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
        "kind": kind._value_,
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
    written = yield from sent(run, RecordStep(params), 1)
    _fenced(written, run)


# The journal's key. A record sent again that meets its own position taken was written by
# an earlier send: the fence lets only this run's epoch write there. On Citus the shard's
# name of the constraint is reported, with the shard's number after it.
_JOURNAL_KEY = "steps_pkey"


def _already_written(run: Run, exc: BaseException) -> bool:
    fault = run.settings.classify_app_error(exc)
    if fault is None or fault.kind is not Fault.UNIQUE or fault.constraint is None:
        return False
    name = fault.constraint
    return name == _JOURNAL_KEY or (
        name.startswith(_JOURNAL_KEY + "_") and name[len(_JOURNAL_KEY) + 1 :].isdigit()
    )


# What `sent` answers for a write that a resend finds already there, when the caller must
# tell that apart from every answer the statement itself can give.
ALREADY_WRITTEN: Any = object()


def sent(run: Run, op: Execute | WriteSteps, written: Any) -> Gen[Any]:
    """Send a fenced journal write and return its answer; when an outage cuts it off, send
    it again while the lease may hold (`outlast`), and answer `written` when the record
    turns out to be there already (the first send committed and only its answer was lost)."""
    try:
        return (yield op)
    except DatabaseUnavailableError as exc:
        return (yield from outlast(run, op, exc, written))


def outlast(
    run: Run, op: Execute | WriteSteps, cut: DatabaseUnavailableError, written: Any
) -> Gen[Any]:
    """Send a fenced journal write again, the same statement at the same epoch, after an
    outage cut it off (`cut`), for as long as the run's lease may still hold; return its
    answer, or `written` when the record turns out to be there already.

    The write records a call that has run (a step's code, whose output is in memory):
    giving it up interrupts the run, and recovery runs that code a second time. An outage
    (a connection lost, a server restarting or refusing connections, a Citus worker node
    down) may cut the write off at three points, and sending it again is right at each:

    - before it reached the server, or when the server rolled it back (its backend was
      terminated, the server went down before the commit): the record is not there, and
      the new send writes it;
    - after it committed, with only its answer lost: the new send meets the record at its
      position (a unique violation of the journal's key, where only this run's epoch can
      have written), so the record is there, as the first send wrote it;
    - meanwhile another worker claimed the workflow (the lease ran out): the fence refuses
      the new send (no row, StaleOwnerError at the caller) and the new owner runs the call.

    It gives up, raising the outage (the run is interrupted and recovered as before), once
    the lease has surely lapsed (run.lease_may_hold): another worker may own the workflow
    by then, and a long outage must not hold the run's thread."""
    attempt = 0
    while True:
        attempt += 1
        now, renewed_at = yield LeaseClock()
        if not lease_may_hold(run, now, renewed_at):
            raise cut
        yield Pause(outage_backoff(attempt))
        try:
            return (yield op)
        except DatabaseUnavailableError as exc:
            cut = exc
        except Exception as exc:
            if _already_written(run, exc):
                return written
            raise
