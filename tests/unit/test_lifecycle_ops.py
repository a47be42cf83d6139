"""The run lifecycle's operations exactly as asked (durable/_core/lifecycle.py): which workflow,
definition, inputs and parent each names, what a timeout says, how a wait for an event
backs off without passing its deadline."""

from __future__ import annotations

from typing import Any

import pytest

from durable._base.models import WorkflowStatus
from durable._core import lifecycle
from durable._run.host_sync import drive
from durable.errors import ResultTimeoutError, WorkflowSuspended
from tests.unit.test_lifecycle import DEFN, Script, _Info

PARENT = ("mom", 3)


def test_run_here_names_the_workflow_its_inputs_and_its_parent_in_every_operation() -> None:
    script = Script(
        (lifecycle.Create, "claim"),
        (lifecycle.RunClaimed, WorkflowSuspended()),
        (lifecycle.Attach, _Info(WorkflowStatus.SUSPENDED)),
        (lifecycle.Finished, (False, None)),
        (lifecycle.Reclaim, None),
        (lifecycle.Sleep, None),
        (lifecycle.Finished, (True, 5)),
    )
    assert drive(lifecycle.run_here(DEFN, "w", "[1]", PARENT), script) == 5
    assert script.asked[:5] == [
        lifecycle.Create(DEFN, "w", "[1]", PARENT),
        lifecycle.RunClaimed("claim", created=True),
        lifecycle.Attach(DEFN, "w", "[1]"),
        lifecycle.Finished("w"),
        lifecycle.Reclaim("w"),
    ]


def test_start_names_the_workflow_in_every_operation() -> None:
    script = Script((lifecycle.Remember, None), (lifecycle.Create, "claim"), (lifecycle.Launch, 1))
    assert drive(lifecycle.start(DEFN, "w", "[1]", PARENT), script) == 1
    assert script.asked == [
        lifecycle.Remember(DEFN, "w"),
        lifecycle.Create(DEFN, "w", "[1]", PARENT),
        lifecycle.Launch("claim"),
    ]


def test_start_of_an_existing_workflow_attaches_with_its_inputs() -> None:
    script = Script(
        (lifecycle.Remember, None),
        (lifecycle.Create, None),
        (lifecycle.Attach, _Info(WorkflowStatus.PENDING)),
        (lifecycle.LaunchClaim, "f"),
    )
    drive(lifecycle.start(DEFN, "w", "[1]", None), script)
    assert script.asked[2:] == [lifecycle.Attach(DEFN, "w", "[1]"), lifecycle.LaunchClaim("w")]
    ended = Script(
        (lifecycle.Remember, None),
        (lifecycle.Create, None),
        (lifecycle.Attach, _Info(WorkflowStatus.SUCCESS)),
        (lifecycle.Forget, None),
    )
    drive(lifecycle.start(DEFN, "w", "[1]", None), ended)
    assert ended.asked[-1] == lifecycle.Forget("w")


def test_a_start_that_cannot_create_forgets_that_workflow() -> None:
    script = Script(
        (lifecycle.Remember, None), (lifecycle.Create, OSError("down")), (lifecycle.Forget, None)
    )
    with pytest.raises(OSError):
        drive(lifecycle.start(DEFN, "w", "[]", None), script)
    assert script.asked[-1] == lifecycle.Forget("w")


def test_a_local_run_that_returned_none_hands_it_over_without_a_read() -> None:
    script = Script((lifecycle.WaitLocal, (True, None)))
    assert drive(lifecycle.result("w", 2.0, True), script) is None
    assert script.asked == [lifecycle.WaitLocal("w", 2.0)]
    script.done()


def test_a_local_run_still_running_at_the_timeout_says_which_and_how_long() -> None:
    script = Script((lifecycle.WaitLocal, None))
    with pytest.raises(ResultTimeoutError) as caught:
        drive(lifecycle.result("w", 2.0, True), script)
    assert (caught.value.workflow_id, caught.value.timeout) == ("w", 2.0)


def test_a_read_past_the_timeout_says_which_and_how_long() -> None:
    script = Script((lifecycle.Finished, (False, None)))
    with pytest.raises(ResultTimeoutError) as caught:
        drive(lifecycle.result("w", 0.0, False), script)
    assert (caught.value.workflow_id, caught.value.timeout) == ("w", 0.0)
    assert script.asked == [lifecycle.Finished("w")]


def test_a_result_without_a_timeout_backs_off_doubling() -> None:
    steps: list[tuple[type, Any]] = []
    for _ in range(3):
        steps += [(lifecycle.Finished, (False, None)), (lifecycle.Sleep, None)]
    steps.append((lifecycle.Finished, (True, "v")))
    script = Script(*steps)
    assert drive(lifecycle.result("w", None, False), script) == "v"
    sleeps = [op.seconds for op in script.asked if isinstance(op, lifecycle.Sleep)]
    assert sleeps == [lifecycle.POLL_MIN, 2 * lifecycle.POLL_MIN, 4 * lifecycle.POLL_MIN]


def test_an_event_wait_backs_off_doubling_and_never_sleeps_past_its_deadline() -> None:
    def slept(op: Any) -> None:
        script.clock += op.seconds

    steps: list[tuple[type, Any]] = []
    for _ in range(7):
        steps += [(lifecycle.ReadEvent, (False, None)), (lifecycle.Sleep, slept)]
    steps.append((lifecycle.ReadEvent, (False, None)))
    script = Script(*steps)
    assert drive(lifecycle.event("w", "k", 0.5), script) is None
    assert script.asked[0] == lifecycle.ReadEvent("w", "k")
    sleeps = [op.seconds for op in script.asked if isinstance(op, lifecycle.Sleep)]
    # 5, 10, 20, 40, 80, 160 ms, then what is left of the 500 ms (185 ms).
    assert sleeps[:6] == [lifecycle.POLL_MIN * 2**i for i in range(6)]
    assert sleeps[6] == pytest.approx(0.185)
    assert script.clock == pytest.approx(100.5)  # the last sleep ends at the deadline
    script.done()
