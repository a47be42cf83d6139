"""Long steps: an attempt's deadlines, its heartbeats, and the fence on a given-up attempt.

A step attempt may be given up before it returns: past its `timeout`, or when it went its
`heartbeat_timeout` without calling durable.heartbeat(). A given-up attempt is a failed
attempt (StepTimeoutError, HeartbeatTimeoutError), retried under the step's policy. A
`def` step's thread cannot be stopped, so it is left to finish, and nothing it does after
that counts: its result goes to nobody (the driver stopped waiting for it, and only the
step's generator records), and its heartbeats are refused, in memory (`scope.live` names
the one attempt that may heartbeat) and in the database (a heartbeat row is never written
over by an earlier attempt's, nor by a run that lost the workflow).

A watched attempt (one with a heartbeat_timeout) has a row in `step_attempts` while it
runs: the live workers' sweep reads it, and a workflow whose attempt stopped heartbeating
for SWEEP_SLACK times its heartbeat_timeout (its process frozen or cut off, its lease
perhaps long) has its lease expired, so another worker claims it, bumping its epoch. The
frozen process's heartbeats and its late record are then refused by that epoch, as any
lost owner's writes are; the new run replays up to the step and runs it again, and the
attempt reads the details of the last heartbeat written (durable.last_heartbeat()).

A heartbeat is also where a cancel reaches a running step: it raises the run's
interruption there, for def and async def steps alike.
"""

from __future__ import annotations

from typing import Any

from durable._core.ops import Execute, Gen, StepScope
from durable._core.run import TIMEOUT_REASON, Run, stop_reason
from durable.errors import (
    HeartbeatTimeoutError,
    StaleOwnerError,
    StepTimeoutError,
    WorkflowInterrupted,
)

# The sweep waits this many heartbeat_timeouts: a live owner gives its stuck attempt up at
# one (and begins the next, a heartbeat of its own), so the sweep finds only the stuck
# attempts of processes that can no longer act on them.
SWEEP_SLACK = 1.5


def attempt_deadline(
    scope: StepScope, began: float, timeout: float | None
) -> tuple[float, bool] | None:
    """When the attempt that began at `began` is given up unless it returns first (on the
    driver's monotonic clock), and whether that is for want of a heartbeat; None: never."""
    ends: list[tuple[float, bool]] = []
    if timeout is not None:
        ends.append((began + timeout, False))
    if scope.heartbeat_timeout is not None:
        ends.append((max(began, scope.beat_at) + scope.heartbeat_timeout, True))
    return min(ends) if ends else None


def give_up(
    scope: StepScope, began: float, timeout: float | None, now: float
) -> StepTimeoutError | None:
    """The error the attempt fails with if it is to be given up at `now`, else None. A
    given-up attempt may no longer heartbeat: its code runs on for nobody."""
    deadline = attempt_deadline(scope, began, timeout)
    if deadline is None or now < deadline[0]:
        return None
    scope.live = None
    if deadline[1]:
        assert scope.heartbeat_timeout is not None
        return HeartbeatTimeoutError(scope.name, scope.heartbeat_timeout)
    assert timeout is not None
    return StepTimeoutError(scope.name, timeout)


def _where(run: Run, scope: StepScope) -> dict[str, Any]:
    return {"workflow_id": run.workflow_id, "step_seq": scope.seq, "epoch": run.epoch}


def begin(scope: StepScope, attempt: int) -> None:
    """Attempt `attempt` of a step begins: it alone may heartbeat, and it reads the last
    details afresh. A watched attempt also writes its row (begin_attempt)."""
    scope.live = attempt
    scope.details_read = False
    scope.beat_error = None


def begin_attempt(run: Run, scope: StepScope, attempt: int) -> Gen[None]:
    """A watched attempt begins (see begin): it writes its row (the sweep watches it from
    now) and reads the last details in the same statement; no row means this run lost
    the workflow."""
    begin(scope, attempt)
    if scope.heartbeat_timeout is None:
        return
    params = _where(run, scope)
    params.update(attempt=attempt, heartbeat_timeout=scope.heartbeat_timeout)
    row = yield Execute("begin_step_attempt", params, "one")
    if row is None:
        raise StaleOwnerError(run.workflow_id, run.epoch)
    scope.last_details, scope.details_read = row["details"], True


def end_attempt(run: Run, scope: StepScope, attempt: int) -> Gen[None]:
    """Attempt `attempt` returned, raised or was given up: no heartbeat of it counts from
    now, and the sweep stops watching it."""
    scope.live = None
    if scope.heartbeat_timeout is None:
        return
    params = _where(run, scope)
    params["attempt"] = attempt
    yield Execute("end_step_attempt", params)


def beat(run: Run, scope: StepScope, attempt: int | None, now: float) -> None:
    """The in-memory half of a heartbeat, decided before anything is written: a cancelled
    (or timed-out) workflow stops here; an attempt given up (or superseded) is refused,
    and so is one whose last heartbeat written in the background was refused; otherwise
    the attempt's heartbeat deadline moves to `now`."""
    reason = stop_reason(run)
    if reason is not None:
        raise WorkflowInterrupted(run.workflow_id, reason, reason == TIMEOUT_REASON)
    if attempt is None or attempt != scope.live:
        raise StaleOwnerError(run.workflow_id, run.epoch)
    if scope.beat_error is not None:
        raise scope.beat_error
    scope.beat_at = now
    if scope.on_beat is not None:
        scope.on_beat()


def write_beat(run: Run, scope: StepScope, attempt: int, details: str | None) -> Gen[None]:
    """Write a heartbeat with its details (first reading the last details before this
    attempt's, if the attempt has not read them yet); refused (StaleOwnerError) when the
    attempt was given up or this run lost the workflow."""
    if not scope.details_read:
        yield from read_last(run, scope)
    params = _where(run, scope)
    params.update(attempt=attempt, heartbeat_timeout=scope.heartbeat_timeout, details=details)
    row = yield Execute("heartbeat_step", params, "one")
    if row is None:
        raise StaleOwnerError(run.workflow_id, run.epoch)


def read_last(run: Run, scope: StepScope) -> Gen[str | None]:
    """The details of the step's last heartbeat before this attempt (None if none)."""
    if not scope.details_read:
        row = yield Execute("last_step_heartbeat", _where(run, scope), "one")
        scope.last_details = None if row is None else row["details"]
        scope.details_read = True
    return scope.last_details
