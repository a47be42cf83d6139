"""durable.heartbeat() and durable.last_heartbeat(): a long step reports its progress.

A step's code calls heartbeat(details) as it goes (a page done, a row reached): the
details are written with the time, so that the next attempt (after a failure, a timeout,
or a crash or freeze of this process) resumes from them with last_heartbeat(). A step
with `heartbeat_timeout=` that stops heartbeating is given up (see
_core.heartbeats), and a cancel of the workflow is raised at the step's next
heartbeat. Outside a running step both raise NotInStepError (as Temporal does outside an
activity): a heartbeat that went nowhere would let the step be given up for not
heartbeating. A thread the step's code starts runs in no step unless its function runs in
a copy of the step's context (contextvars.copy_context().run); there it heartbeats for
the step, as the step's own code does (the writes are a pool connection's each, and the
in-memory half moves the attempt's deadline from any thread).

A sync step's heartbeat is written before it returns. An async step's is decided at
once (a cancel, a refused attempt raise there) and written in the background on the
loop, in order; a refusal of that write is raised at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from durable import _core as protocol
from durable._core import Run, StepScope
from durable._run.context import current_attempt, current_run, current_step
from durable._run.in_step import drive_in_step
from durable._run.in_step_async import drive_in_step_async
from durable.errors import BlockingCallError, DatabaseUnavailableError, NotInStepError

logger = logging.getLogger("durable.heartbeat")

# The background writes under way, kept referenced until they end (asyncio holds tasks
# weakly); each scope's writes are chained, so they land in the order they were made.
_writing: dict[int, asyncio.Task[None]] = {}


def _step(what: str) -> tuple[Run, StepScope]:
    run, scope = current_run.get(), current_step.get()
    if run is None or scope is None or scope.seq < 0 or not scope.charging:
        raise NotInStepError(
            f"{what} belongs to a running @durable.step, and none runs in this thread: call "
            "it from the step's own code, or run a thread's function in a copy of the "
            "step's context, made in the step (threading.Thread(target=contextvars."
            "copy_context().run, args=(fn,)), or pool.submit(contextvars.copy_context()"
            ".run, fn, ...): a copy per task)"
        )
    return run, scope


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def heartbeat(details: Any = None) -> None:
    """Record that the running step is alive, with `details` of its progress (any value
    the serializer takes), for the next attempt to resume from (durable.last_heartbeat()).

    Resets the step's `heartbeat_timeout`. Raises the workflow's interruption when it was
    cancelled (or timed out), and StaleOwnerError when this attempt no longer counts (it
    was given up, or another worker took the workflow over): let both propagate. Each call
    is one write: heartbeat per page or batch, not per item. Outside a running step (a
    thread the step started, without its context), NotInStepError."""
    run, scope = _step("durable.heartbeat()")
    attempt = current_attempt.get()
    if attempt is None:
        attempt = scope.live  # an attempt never given up: it runs while the step waits
    text = None if details is None else run.dumps(details, f"heartbeat details of {scope.name!r}")
    protocol.beat(run, scope, attempt, time.monotonic())
    assert attempt is not None  # (beat refuses None)
    if _on_loop():
        _write_in_background(run, scope, attempt, text)
        return
    try:
        drive_in_step(run, protocol.write_beat(run, scope, attempt, text))
    except DatabaseUnavailableError as exc:
        # Not the step's failure: the next heartbeat writes again (and a watched attempt
        # whose heartbeats cannot be written is given up by its heartbeat_timeout).
        logger.warning(
            "heartbeat of step %s of %s not written: %s", scope.name, run.workflow_id, exc
        )


def _write_in_background(run: Run, scope: StepScope, attempt: int, text: str | None) -> None:
    key = id(scope)
    before = _writing.get(key)

    async def write() -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        try:
            await drive_in_step_async(run, protocol.write_beat(run, scope, attempt, text))
        except DatabaseUnavailableError as exc:
            logger.warning(
                "heartbeat of step %s of %s not written: %s", scope.name, run.workflow_id, exc
            )
        except Exception as exc:  # refused: raised at the attempt's next heartbeat
            # Only while this attempt is the live one: a write of an earlier attempt
            # refused after the next began is no refusal of the next.
            if scope.live == attempt:
                scope.beat_error = exc
        finally:
            if _writing.get(key) is task:
                del _writing[key]

    task = asyncio.get_running_loop().create_task(write())
    _writing[key] = task


def last_heartbeat() -> Any:
    """The details of the running step's last heartbeat before this attempt began (by an
    earlier attempt, or before a crash, a freeze or a hand-over), or None: where a long
    step resumes. In an async step, give the step a `heartbeat_timeout` (its details are
    then read as each attempt begins). Outside a running step, NotInStepError."""
    run, scope = _step("durable.last_heartbeat()")
    if not scope.details_read:
        if _on_loop():
            raise BlockingCallError(
                f"durable.last_heartbeat() in async step {scope.name!r} would block its "
                "event loop to read: give the step a heartbeat_timeout=, and the details "
                "are read as each attempt begins"
            )
        drive_in_step(run, protocol.read_last(run, scope))
    text = scope.last_details
    return None if text is None else run.settings.serializer.loads(text)
