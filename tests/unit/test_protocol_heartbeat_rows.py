"""What a heartbeat writes and whom a refusal names: the attempt, its heartbeat timeout and
its details in the heartbeat row, no last details when none was written, and the errors
of an attempt given up or refused."""

from __future__ import annotations

import pytest

from durable import _core as protocol
from durable._core import StepScope
from durable._core.heartbeats import begin_attempt, give_up
from durable.errors import (
    HeartbeatTimeoutError,
    StaleOwnerError,
    StepTimeoutError,
    WorkflowInterrupted,
)
from tests.unit.scripted import EPOCH, WORKFLOW_ID, Script, make_run


def watched() -> StepScope:
    return StepScope("crawl", charging=True, seq=2, heartbeat_timeout=5.0)


def test_a_heartbeat_row_names_the_attempt_its_timeout_and_its_details() -> None:
    scope = watched()
    scope.details_read = True
    script = Script(statements={"heartbeat_step": {"written": 1}})
    script.run(protocol.write_beat(make_run(), scope, 3, "page 7"))
    assert script.only("heartbeat_step") == {
        "workflow_id": WORKFLOW_ID,
        "step_seq": 2,
        "epoch": EPOCH,
        "attempt": 3,
        "heartbeat_timeout": 5.0,
        "details": "page 7",
    }


def test_no_earlier_heartbeat_means_no_last_details() -> None:
    scope = watched()
    script = Script(statements={"last_step_heartbeat": None})
    assert script.run(protocol.read_last(make_run(), scope)) is None
    assert scope.details_read and scope.last_details is None


def test_refusals_name_the_run_that_lost() -> None:
    scope = watched()
    scope.details_read = True
    refusals = [
        (protocol.write_beat(make_run(), scope, 1, None), {"heartbeat_step": None}),
        (begin_attempt(make_run(), watched(), 1), {"begin_step_attempt": None}),
    ]
    for gen, statements in refusals:
        with pytest.raises(StaleOwnerError) as caught:
            Script(statements=statements).run(gen)
        assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)
    with pytest.raises(StaleOwnerError) as caught:
        protocol.beat(make_run(), watched(), 2, 0.0)
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)


def test_a_cancel_at_a_heartbeat_names_the_workflow_and_its_reason() -> None:
    with pytest.raises(WorkflowInterrupted) as caught:
        protocol.beat(make_run(cancel="operator"), watched(), 1, 0.0)
    assert caught.value.workflow_id == WORKFLOW_ID
    assert (caught.value.reason, caught.value.timed_out) == ("operator", False)


def test_an_attempt_given_up_names_its_step() -> None:
    error = give_up(watched(), 0.0, None, 5.0)
    assert isinstance(error, HeartbeatTimeoutError)
    assert (error.step_name, error.timeout) == ("crawl", 5.0)
    error = give_up(StepScope("crawl"), 0.0, 3.0, 3.0)
    assert type(error) is StepTimeoutError and error.step_name == "crawl"
