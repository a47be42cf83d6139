"""A child workflow in its parent's journal, exactly: the record of a child that failed or
returned (position, name, start, child id), a start journaled with its child's id, and a
journaled start replayed (a refusal, a failure, or a record that is neither)."""

from __future__ import annotations

from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import StepKind, StepRecord
from durable._core import Outcome, RunChild
from durable._core.children import Placed, place_start, record_start
from durable.errors import NondeterminismError, QueueDedupError, StepError
from tests.unit.scripted import (
    DEFAULT,
    EPOCH,
    SERIALIZER,
    T0,
    WORKFLOW_ID,
    Script,
    after_one_step,
    make_run,
    workflow_def,
)


def sub() -> Any:
    return None


class OutOfStock(Exception):
    pass


def child_answer(outcome: Outcome) -> Any:
    return lambda op: outcome if isinstance(op, RunChild) else DEFAULT


def child_record(output: str | None, error: str | None) -> dict[str, Any]:
    return {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "step_seq": 1,
        "step_name": "sub",
        "kind": StepKind.CHILD.value,
        "output": output,
        "error": error,
        "attempts": 1,
        "child_workflow_id": f"{WORKFLOW_ID}:child:1",
        "started_at": T0,
    }


def test_a_failed_child_is_journaled_at_its_position_with_its_id() -> None:
    script = Script(child_answer(Outcome(error=OutOfStock("none left"))))
    with pytest.raises(OutOfStock):
        script.run(protocol.child(after_one_step(), workflow_def(sub), (), {}))
    record = script.only("record_step")
    assert record == child_record(None, record["error"])
    assert "OutOfStock" in record["error"]


def test_a_child_that_returned_is_journaled_with_its_start() -> None:
    script = Script(child_answer(Outcome({"n": 1})))
    assert script.run(protocol.child(after_one_step(), workflow_def(sub), (), {})) == {"n": 1}
    assert script.only("record_step") == child_record(SERIALIZER.dumps({"n": 1}), None)


def test_a_replayed_child_failure_is_raised_as_the_childs_error() -> None:
    error = protocol.encode_error(OutOfStock("none left"))
    record = StepRecord(0, "sub", StepKind.CHILD, None, error, 1, child_workflow_id="kid")
    with pytest.raises(StepError) as caught:
        Script().run(protocol.child(make_run(records=[record]), workflow_def(sub), (), {}))
    assert caught.value.step_name == "sub"


def test_a_start_is_journaled_with_the_id_of_the_child_it_stored() -> None:
    points: list[str] = []
    run = make_run(crash_point=points.append)
    script = Script()
    script.run(record_start(run, Placed(2, "kid", False), "sub"))
    record = script.only("record_step")
    assert (record["step_seq"], record["step_name"], record["kind"]) == (2, "sub", "child")
    assert SERIALIZER.loads(record["output"]) == "kid"
    assert (record["child_workflow_id"], record["attempts"]) == ("kid", 1)
    assert points == ["after_child_start"]


def test_a_replayed_refusal_is_the_same_dedup_error() -> None:
    script = Script()
    refused = QueueDedupError("mail", "k1", None)
    script.run(record_start(make_run(), Placed(0, "kid", False), "sub", refused))
    output = script.only("record_step")["output"]
    found = StepRecord(0, "sub", StepKind.CHILD, output, None, 1)
    with pytest.raises(QueueDedupError) as caught:
        place_start(make_run(records=[found]), "sub", None)
    assert (caught.value.queue, caught.value.dedup_key) == ("mail", "k1")
    assert caught.value.workflow_id is None


def test_a_start_replayed_over_a_failed_call_raises_that_failure() -> None:
    error = protocol.encode_error(OutOfStock("x"))
    found = StepRecord(0, "sub", StepKind.STEP, None, error, 1)
    with pytest.raises(StepError) as caught:
        place_start(make_run(records=[found]), "sub", None)
    assert caught.value.step_name == "sub"


@pytest.mark.parametrize("output", ['"text"', '{"other": 1}'])
def test_a_start_replayed_over_a_record_without_child_or_refusal_is_nondeterminism(
    output: str,
) -> None:
    found = StepRecord(0, "sub", StepKind.CHILD, output, None, 1)
    with pytest.raises(NondeterminismError) as caught:
        place_start(make_run(records=[found]), "sub", None)
    assert (caught.value.workflow_id, caught.value.step_seq) == (WORKFLOW_ID, 0)
    assert caught.value.recorded == "sub (no child, no refusal)"
    assert caught.value.current == "a start of sub"
