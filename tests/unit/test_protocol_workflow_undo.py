"""A run's body, its finish and its undos in the pure core: what the other tests leave
open (an undo with no ledger position is run without a claim, who a refusal names, how a
stopped run ends, the body's call and its crash point)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import WorkflowStatus
from durable._base.registry import StepDef
from durable._core import Call, Outcome
from durable._core.workflow import _refused
from durable.errors import (
    SharedEffectLostError,
    StaleOwnerError,
    WorkflowCancelledError,
    WorkflowInterrupted,
)
from tests.unit.scripted import (
    DEFAULT,
    EPOCH,
    WORKFLOW_ID,
    Script,
    Then,
    body,
    make_run,
    workflow_def,
)


def undo(name: str) -> Any:
    def compensation(*args: Any, **kwargs: Any) -> None:
        return None

    compensation.__name__ = name
    compensation.__durable_step__ = StepDef(name, compensation)  # type: ignore[attr-defined]
    return compensation


def failing_body(run: Any, error: Exception) -> Any:
    def answer(op: Any) -> Any:
        if isinstance(op, Call) and op.fn is body:
            return Outcome(error=error)
        return DEFAULT

    return answer


@pytest.mark.parametrize(("applied_in", "seq"), [(None, 0), (WORKFLOW_ID, None)])
def test_an_undo_without_a_ledger_position_runs_without_a_claim(
    applied_in: str | None, seq: int | None
) -> None:
    run = make_run()
    refund = undo("refund")
    protocol.register_compensation(run, refund, (1,), {}, applied_in, seq)
    script = Script(failing_body(run, RuntimeError("no visa")))
    with pytest.raises(RuntimeError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.executed("claim_undo") == []
    assert "Call refund" in script.labels
    assert script.only("finish_workflow")["status"] == "COMPENSATED"


def test_a_refused_claim_names_the_run_that_lost() -> None:
    run = make_run()
    protocol.register_compensation(run, undo("refund"), (1,), {}, WORKFLOW_ID, 0)
    script = Script(
        failing_body(run, RuntimeError("x")),
        statements={"claim_undo": None},
    )
    with pytest.raises(StaleOwnerError) as caught:
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)


def test_a_lost_shared_ledger_names_the_effect() -> None:
    run = make_run()
    protocol.register_compensation(run, undo("unbook"), (0,), {}, "original", 4)
    script = Script(
        failing_body(run, RuntimeError("x")),
        statements={"claim_undo": {"owned": 1, "undone_by": None, "ledger": False}},
    )
    with pytest.raises(RuntimeError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    detail = json.loads(script.only("finish_workflow")["error"])
    error = SharedEffectLostError(WORKFLOW_ID, "original", 4)
    assert detail["message"] == f"compensation 'unbook' failed: {error}"


def test_an_undo_of_this_runs_own_effect_is_never_lost() -> None:
    # No claim recorded and no ledger flag: the effect is this run's own, so its ledger
    # cannot be another's that is gone; nothing applied there, nothing to undo.
    run = make_run()
    protocol.register_compensation(run, undo("refund"), (0,), {}, WORKFLOW_ID, 2)
    script = Script(
        failing_body(run, RuntimeError("x")),
        statements={"claim_undo": {"owned": 1, "undone_by": None, "ledger": False}},
    )
    with pytest.raises(RuntimeError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert "Call refund" not in script.labels
    assert script.only("finish_workflow")["status"] == "COMPENSATED"


def test_the_body_is_called_as_the_body_and_its_output_kept() -> None:
    points: list[str] = []
    run = make_run(crash_point=points.append)
    script = Script()
    assert script.run(protocol.workflow(run, workflow_def(body), (), {})) == "done"
    assert script.ops[0].body is True
    assert run.output == '"done"'
    assert points == ["before_workflow_finish"]


def test_a_success_refused_by_a_cancel_without_a_reason_stops_as_cancelled() -> None:
    run = make_run()
    script = Script(
        statements={"finish_workflow": Then(0, 1), "finish_refused": {"cancel_reason": None}}
    )
    with pytest.raises(WorkflowCancelledError) as caught:
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert caught.value.reason == "cancelled" and caught.value.workflow_id == WORKFLOW_ID
    assert run.cancel_reason == "cancelled"


def test_a_refused_success_keeps_what_it_held_for_the_cancelled_outcome() -> None:
    run = make_run()
    held_rows = [{"step_name": "earlier"}]
    script = Script(statements={"finish_refused": {"cancel_reason": "operator"}})
    with pytest.raises(WorkflowInterrupted) as caught:
        script.run(_refused(run, WorkflowStatus.SUCCESS, held_rows))
    assert caught.value.workflow_id == WORKFLOW_ID and not caught.value.timed_out
    assert run.pending == held_rows and run.pending is not held_rows


def test_a_refused_failure_names_the_run_that_lost() -> None:
    script = Script(statements={"finish_workflow": 0})
    with pytest.raises(StaleOwnerError) as caught:
        script.run(protocol.finish(make_run(), WorkflowStatus.ERROR, None, "{}"))
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)


@pytest.mark.parametrize("registered", [(0, 1), (1, 0)])
def test_undos_run_in_reverse_position_order_whatever_order_they_were_registered(
    registered: tuple[int, int],
) -> None:
    # Effects of gathered branches register their undos in the order they finish, which a
    # replay does not repeat; the undos (effects with positions of their own) must run in
    # the same order on every run, or a replayed undo is taken for the other's.
    run = make_run()
    refund = undo("refund")
    for seq in registered:
        protocol.register_compensation(run, refund, (f"pay-{seq}",), {}, WORKFLOW_ID, seq)
    script = Script(
        failing_body(run, RuntimeError("x")),
        statements={"claim_undo": {"owned": 1, "undone_by": WORKFLOW_ID, "ledger": True}},
    )
    with pytest.raises(RuntimeError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    undone = [op.args for op in script.ops if isinstance(op, Call) and op.fn is refund]
    assert undone == [("pay-1",), ("pay-0",)]
    assert [c["step_seq"] for c in script.executed("claim_undo")] == [1, 0]
