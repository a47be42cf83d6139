"""The last decisions mutation testing found unchecked: a third refusal by the cap has a
gate of its own, a late attempt may not send a model call even with no limit, an effect's
user key is checked, a recv that timed out replays as None, and a success refused by the
timeout stops the run as timed out with the workflow's timeout."""

from __future__ import annotations

from decimal import Decimal

import pytest

from durable import _core as protocol
from durable._base.models import StepKind, StepRecord
from durable._core import StepScope
from durable._core.budget import reserve_call
from durable.errors import (
    InvalidNameError,
    StaleOwnerError,
    WorkflowSuspended,
    WorkflowTimeoutError,
)
from tests.unit.scripted import (
    SERIALIZER,
    T0,
    WORKFLOW_ID,
    Script,
    Then,
    effect_def,
    llm,
    make_run,
    over_the_cap,
    step_def,
    workflow_def,
)


def test_a_third_refusal_by_the_cap_asks_at_a_third_gate() -> None:
    run, script = over_the_cap(approvals=2)
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.step(run, step_def(llm), (), {}))
    looked = [params["name"] for params in script.executed("get_approval")]
    assert looked == ["budget@0:cap0", "budget@0:cap1", "budget@0:cap2"]


def test_a_late_attempt_may_not_send_a_model_call_even_with_no_limit() -> None:
    scope = StepScope("llm", charging=True, live=1)
    with pytest.raises(StaleOwnerError):
        reserve_call(make_run(), scope, 10, 10, None, "max_tokens", attempt=2)
    assert reserve_call(make_run(), scope, 10, 10, None, "max_tokens", attempt=1) == (
        Decimal(0),
        0,
    )


def test_an_effects_user_key_is_checked_before_anything_is_written() -> None:
    def pay(cents: int, *, idempotency_key: str) -> int:
        return cents

    script = Script()
    with pytest.raises(InvalidNameError):
        script.run(protocol.effect(make_run(), effect_def(pay, key=lambda cents: ""), (1,), {}))
    assert script.ops == []


def test_a_recv_that_timed_out_replays_as_none() -> None:
    wake = SERIALIZER.dumps(T0.isoformat())
    records = [
        StepRecord(0, "recv-deadline:chat", StepKind.SLEEP, wake, None, 1),
        StepRecord(1, "recv:chat", StepKind.RECV, None, None, 1),
    ]
    script = Script()
    assert script.run(protocol.recv(make_run(records=records), "chat", 5)) is None
    assert script.ops == []


def test_a_success_refused_by_the_timeout_stops_as_timed_out() -> None:
    def body() -> str:
        return "done"

    script = Script(
        statements={
            "finish_workflow": Then(0, 1),
            "finish_refused": {"cancel_reason": protocol.TIMEOUT_REASON},
        }
    )
    with pytest.raises(WorkflowTimeoutError) as caught:
        script.run(protocol.workflow(make_run(), workflow_def(body, timeout=30.0), (), {}))
    assert caught.value.workflow_id == WORKFLOW_ID and caught.value.timeout == 30.0
