"""The run lifecycle's decisions (durable/_core/lifecycle.py), driven with scripted answers: no
database, no threads, no event loop. Both hosts perform these same generators."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from durable._base.models import WorkflowStatus
from durable._core import lifecycle
from durable._run.host_async import drive_async
from durable._run.host_sync import drive
from durable.errors import ResultTimeoutError, WorkflowConflictError, WorkflowSuspended

# The lifecycle passes a workflow's definition on to the host and never reads it.
DEFN: Any = object()


class _Info:
    """What the lifecycle reads of a WorkflowInfo: its status."""

    def __init__(self, status: WorkflowStatus) -> None:
        self.status = status


class Script:
    """Performs each operation with the next scripted answer (a value, or an exception to
    raise), after checking the operation's kind; records what was asked."""

    def __init__(self, *steps: tuple[type, Any]) -> None:
        self.steps = list(steps)
        self.asked: list[Any] = []
        self.clock = 100.0  # what Now answers (not scripted: asked at will)

    def __call__(self, op: lifecycle.Op) -> Any:
        if isinstance(op, lifecycle.Now):
            return self.clock
        self.asked.append(op)
        assert self.steps, f"nothing scripted for {op!r}"
        kind, answer = self.steps.pop(0)
        assert isinstance(op, kind), (op, kind)
        if isinstance(answer, BaseException):
            raise answer
        return answer(op) if callable(answer) else answer

    perform = __call__  # a host, to a drive

    def done(self) -> None:
        assert self.steps == [], f"not asked: {self.steps}"


def test_a_new_workflow_runs_at_once_on_the_connection_that_created_it() -> None:
    script = Script((lifecycle.Create, "claim"), (lifecycle.RunClaimed, 42))
    assert drive(lifecycle.run_here(DEFN, "w", "[]", None), script) == 42
    assert script.asked[1] == lifecycle.RunClaimed("claim", created=True)
    script.done()


def test_a_suspended_run_is_looked_at_with_backoff_and_claimed_again_when_runnable() -> None:
    script = Script(
        (lifecycle.Create, "claim"),
        (lifecycle.RunClaimed, WorkflowSuspended()),
        (lifecycle.Attach, _Info(WorkflowStatus.SUSPENDED)),
        (lifecycle.Finished, (False, None)),
        (lifecycle.Reclaim, None),  # still asleep, or a worker holds it
        (lifecycle.Sleep, None),
        (lifecycle.Finished, (False, None)),
        (lifecycle.Reclaim, None),
        (lifecycle.Sleep, None),
        (lifecycle.Finished, (False, None)),
        (lifecycle.Reclaim, "again"),
        (lifecycle.RunClaimed, WorkflowSuspended()),  # it waits once more
        (lifecycle.Finished, (False, None)),
        (lifecycle.Reclaim, None),
        (lifecycle.Sleep, None),
        (lifecycle.Finished, (True, "done")),  # a worker finished it
    )
    assert drive(lifecycle.run_here(DEFN, "w", "[]", None), script) == "done"
    script.done()
    sleeps = [op.seconds for op in script.asked if isinstance(op, lifecycle.Sleep)]
    # Backing off, and starting over after a run that suspended again.
    assert sleeps == [lifecycle.POLL_MIN, 2 * lifecycle.POLL_MIN, lifecycle.POLL_MIN]
    rerun = [op for op in script.asked if isinstance(op, lifecycle.RunClaimed)][1]
    assert rerun == lifecycle.RunClaimed("again", created=False)


def test_an_existing_workflow_is_attached_to_and_its_outcome_read() -> None:
    script = Script(
        (lifecycle.Create, None),
        (lifecycle.Attach, _Info(WorkflowStatus.SUCCESS)),
        (lifecycle.Finished, (True, 7)),
    )
    assert drive(lifecycle.run_here(DEFN, "w", "[]", None), script) == 7
    script.done()


def test_an_id_held_by_another_workflow_or_a_failed_run_is_raised() -> None:
    conflict = WorkflowConflictError("w", "other", "job")
    script = Script((lifecycle.Create, None), (lifecycle.Attach, conflict))
    with pytest.raises(WorkflowConflictError):
        drive(lifecycle.run_here(DEFN, "w", "[]", None), script)
    script = Script((lifecycle.Create, "claim"), (lifecycle.RunClaimed, ValueError("boom")))
    with pytest.raises(ValueError, match="boom"):
        drive(lifecycle.run_here(DEFN, "w", "[]", None), script)


def test_a_waiting_caller_backs_off_to_the_ceiling() -> None:
    steps: list[tuple[type, Any]] = [(lifecycle.Create, None), (lifecycle.Attach, None)]
    for _ in range(12):
        steps += [(lifecycle.Finished, (False, None)), (lifecycle.Reclaim, None)]
        steps += [(lifecycle.Sleep, None)]
    steps.append((lifecycle.Finished, (True, 1)))
    script = Script(*steps)
    drive(lifecycle.run_here(DEFN, "w", "[]", None), script)
    sleeps = [op.seconds for op in script.asked if isinstance(op, lifecycle.Sleep)]
    assert sleeps[-1] == lifecycle.POLL_MAX and max(sleeps) == lifecycle.POLL_MAX
    assert all(b == min(lifecycle.POLL_MAX, 2 * a) for a, b in itertools.pairwise(sleeps))


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # New: launched.
        ([(lifecycle.Create, "claim"), (lifecycle.Launch, "future")], "future"),
        # Existing and ended: nothing to wait on here, and forgotten.
        (
            [
                (lifecycle.Create, None),
                (lifecycle.Attach, _Info(WorkflowStatus.ERROR)),
                (lifecycle.Forget, None),
            ],
            None,
        ),
        # Existing and not ended: claimed here if it can be.
        (
            [
                (lifecycle.Create, None),
                (lifecycle.Attach, _Info(WorkflowStatus.PENDING)),
                (lifecycle.LaunchClaim, "claimed-future"),
            ],
            "claimed-future",
        ),
    ],
)
def test_start(steps: list[tuple[type, Any]], expected: Any) -> None:
    script = Script((lifecycle.Remember, None), *steps)
    assert drive(lifecycle.start(DEFN, "w", "[]", None), script) == expected
    script.done()


def test_a_start_that_cannot_create_forgets_the_workflow() -> None:
    script = Script(
        (lifecycle.Remember, None), (lifecycle.Create, OSError("down")), (lifecycle.Forget, None)
    )
    with pytest.raises(OSError, match="down"):
        drive(lifecycle.start(DEFN, "w", "[]", None), script)
    script.done()


def test_result_waits_for_the_local_run_then_reads_the_database() -> None:
    script = Script((lifecycle.WaitLocal, (False, None)), (lifecycle.Finished, (True, "v")))
    assert drive(lifecycle.result("w", None, True), script) == "v"
    script = Script((lifecycle.WaitLocal, None))
    with pytest.raises(ResultTimeoutError):
        drive(lifecycle.result("w", 0.01, True), script)


def test_a_local_run_that_succeeded_hands_over_its_value_without_a_read() -> None:
    script = Script((lifecycle.WaitLocal, (True, {"v": 1})))
    assert drive(lifecycle.result("w", None, True), script) == {"v": 1}
    script.done()
    assert not any(isinstance(op, lifecycle.Finished) for op in script.asked)


def test_result_gives_up_at_its_timeout_and_never_sleeps_past_it() -> None:
    steps: list[tuple[type, Any]] = []
    for _ in range(50):
        steps += [(lifecycle.Finished, (False, None))]
        steps += [(lifecycle.Sleep, lambda op: setattr(script, "clock", script.clock + op.seconds))]
    script = Script(*steps)
    with pytest.raises(ResultTimeoutError):
        drive(lifecycle.result("w", 1.0, False), script)
    assert script.clock == pytest.approx(101.0)
    assert not any(isinstance(op, lifecycle.WaitLocal) for op in script.asked)


def test_an_event_is_looked_for_until_its_timeout() -> None:
    script = Script((lifecycle.ReadEvent, (False, None)), (lifecycle.Sleep, None))
    script.steps.append((lifecycle.ReadEvent, (True, {"x": 1})))
    assert drive(lifecycle.event("w", "k", 5.0), script) == {"x": 1}
    script = Script((lifecycle.ReadEvent, (False, None)))
    assert drive(lifecycle.event("w", "k", 0.0), script) is None


def test_the_async_drive_performs_the_same_decisions() -> None:
    class Awaited:
        def __init__(self, script: Callable[[lifecycle.Op], Any]) -> None:
            self.script = script

        async def perform(self, op: lifecycle.Op) -> Any:
            await asyncio.sleep(0)
            return self.script(op)

    script = Script(
        (lifecycle.Create, "claim"),
        (lifecycle.RunClaimed, WorkflowSuspended()),
        (lifecycle.Attach, None),
        (lifecycle.Finished, (False, None)),
        (lifecycle.Reclaim, "again"),
        (lifecycle.RunClaimed, 5),
    )
    life = lifecycle.run_here(DEFN, "w", "[]", None)
    assert asyncio.run(drive_async(life, Awaited(script))) == 5
    script.done()
