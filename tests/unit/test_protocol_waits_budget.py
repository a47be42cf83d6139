"""The one gate (approvals and the budget), the ledger, sleep, messages and events."""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
import threading
from decimal import Decimal
from typing import Any

import pytest

import durable
from durable import _core as protocol
from durable._base.models import Budget, Decision, Ledger, StepKind
from durable._core import Call, Pause
from durable._run.context import current_run, current_step
from durable.errors import (
    BudgetExceededError,
    StaleOwnerError,
    StreamClosedError,
    UnboundedModelCallError,
    WorkflowInterrupted,
    WorkflowSuspended,
)
from tests.unit.scripted import (
    DEFAULT,
    EPOCH,
    SERIALIZER,
    T0,
    WORKFLOW_ID,
    FixedClock,
    Script,
    Then,
    approval_row,
    done,
    held,
    ledger,
    ledger_row,
    llm,
    make_run,
    step_def,
)

APPROVED = approval_row("approved", comment="fine", decided_by="ann")


# -- approval: the one gate -----------------------------------------------------------------


def test_approval_with_no_row_requests_then_suspends() -> None:
    script = Script()
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.approval(make_run(), "ship", {"order": 7}, timeout=60, default=True))
    assert script.labels == [
        "Execute get_approval",
        "Execute approval_request",
        "Park",
        "Execute suspend_for_approval",
        "Execute wake_if_decided",
    ]
    assert script.ops[0].fetch == "one"
    assert script.only("get_approval") == {"workflow_id": WORKFLOW_ID, "name": "ship"}
    assert script.only("approval_request") == {
        "workflow_id": WORKFLOW_ID,
        "name": "ship",
        "epoch": EPOCH,
        "step_seq": 0,
        "payload": '{"order":7}',
        "default_approved": True,
        "timeout_seconds": 60,
    }
    assert script.only("suspend_for_approval") == {
        "workflow_id": WORKFLOW_ID,
        "name": "ship",
        "epoch": EPOCH,
    }


def test_a_refused_request_is_a_stale_owner() -> None:
    script = Script(statements={"approval_request": 0})
    with pytest.raises(StaleOwnerError):
        script.run(protocol.approval(make_run(), "ship"))
    assert script.executed("suspend_for_approval") == []


def test_a_decision_landing_before_the_suspend_is_returned_and_journaled() -> None:
    script = Script(statements={"get_approval": Then(None, APPROVED), "suspend_for_approval": 0})
    decision = script.run(protocol.approval(make_run(), "ship"))
    assert decision == Decision(True, "fine", "ann", False)
    assert script.labels == [
        "Execute get_approval",
        "Execute approval_request",
        "Park",
        "Execute suspend_for_approval",
        "Execute get_approval",
        "Execute record_step",
    ]
    record = script.only("record_step")
    assert (record["step_seq"], record["step_name"], record["kind"]) == (
        0,
        "approval:ship",
        "approval",
    )
    assert SERIALIZER.loads(record["output"]) == {
        "approved": True,
        "comment": "fine",
        "decided_by": "ann",
        "timed_out": False,
    }


def test_not_suspended_and_still_waiting_is_a_stale_owner() -> None:
    waiting = approval_row("waiting")
    script = Script(statements={"get_approval": Then(None, waiting), "suspend_for_approval": 0})
    with pytest.raises(StaleOwnerError):
        script.run(protocol.approval(make_run(), "ship"))
    assert script.executed("record_step") == []


def test_an_already_decided_gate_journals_the_decision_without_asking() -> None:
    script = Script(statements={"get_approval": approval_row("denied", comment="no")})
    decision = script.run(protocol.approval(make_run(), "ship"))
    assert decision == Decision(False, "no", None, False)
    assert script.labels == ["Execute get_approval", "Execute record_step"]


def test_a_waiting_gate_asked_before_suspends_without_asking_again() -> None:
    script = Script(statements={"get_approval": approval_row("waiting")})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.approval(make_run(), "ship"))
    assert script.labels == [
        "Execute get_approval",
        "Park",
        "Execute suspend_for_approval",
        "Execute wake_if_decided",
    ]


def test_a_timed_out_gate_decides_by_its_default() -> None:
    row = approval_row("timed_out", comment="ignored", decided_by="ignored", default_approved=True)
    script = Script(statements={"get_approval": row})
    assert script.run(protocol.approval(make_run(), "ship")) == Decision(True, None, None, True)


def test_a_replayed_approval_returns_the_decision_without_asking() -> None:
    stored = {"approved": True, "comment": "ok", "decided_by": "ann", "timed_out": False}
    run = make_run(records=[done(0, "approval:ship", stored, StepKind.APPROVAL)])
    script = Script()
    assert script.run(protocol.approval(run, "ship")) == Decision(True, "ok", "ann", False)
    assert script.ops == []


def test_a_cancelled_run_is_interrupted_before_asking() -> None:
    script = Script()
    with pytest.raises(WorkflowInterrupted):
        script.run(protocol.approval(make_run(cancel="stop"), "ship"))
    assert script.ops == []


def test_the_gate_writes_pending_records_before_looking() -> None:
    run = make_run(mode="exit")
    run.pending.append(held(0, "earlier"))
    script = Script(statements={"get_approval": APPROVED})
    script.run(protocol.approval(run, "ship"))
    assert script.labels[:2] == ["WriteSteps 1", "Execute get_approval"]


# -- the ledger -----------------------------------------------------------------------------


def test_open_ledger_without_a_budget_asks_nothing() -> None:
    run = make_run()
    script = Script()
    script.run(protocol.open_ledger(run, Budget(dollars=1)))
    assert script.ops == []
    assert run.ledger is None


def test_open_ledger_of_a_root_creates_it_with_exact_limits() -> None:
    run = make_run(budget_id=WORKFLOW_ID)
    row = ledger_row(limit_dollars="0.1", limit_steps=3)
    script = Script(statements={"ensure_budget": row})
    script.run(protocol.open_ledger(run, Budget(dollars=0.1, steps=3)))
    assert script.only("ensure_budget") == {
        "budget_id": WORKFLOW_ID,
        "limit_dollars": Decimal("0.1"),
        "limit_tokens": None,
        "limit_steps": 3,
        "limit_seconds": None,
    }
    assert run.ledger == Ledger(WORKFLOW_ID, Decimal("0.1"), None, 3, Decimal(0), 0, 0)


def test_open_ledger_of_a_child_reads_its_roots_ledger() -> None:
    run = make_run(budget_id="root")
    script = Script(statements={"get_budget": ledger_row(budget_id="root", limit_steps=9)})
    script.run(protocol.open_ledger(run, Budget(steps=1)))
    assert script.labels == ["Execute get_budget"]
    assert script.only("get_budget") == {"budget_id": "root"}
    assert run.ledger is not None and run.ledger.limit_steps == 9


def test_budget_left_counts_the_running_steps_charges() -> None:
    run = make_run(ledger=ledger(limit_dollars="2", spent_dollars="0.5", limit_tokens=100))
    scope = protocol.StepScope("llm", charging=True, live=1)
    protocol.charge(run, scope, Decimal("0.25"), 40)
    assert protocol.budget_left(run, scope) == Budget(dollars=1.25, tokens=60, steps=None)
    assert protocol.budget_left(run) == Budget(dollars=1.5, tokens=100, steps=None)


# -- the budget gate ------------------------------------------------------------------------


def budgeted_run(**row: Any) -> Any:
    return make_run(budget_id=WORKFLOW_ID, ledger=ledger(**row))


def test_a_ledger_with_room_asks_nothing() -> None:
    script = Script()
    script.run(protocol.budget_gate(budgeted_run(limit_steps=5, spent_steps=4), 4, "llm"))
    assert script.ops == []


def test_an_exhausted_ledger_is_refreshed_then_gated() -> None:
    run = budgeted_run(limit_steps=5, spent_steps=5)
    script = Script(statements={"get_budget": ledger_row(limit_steps=5, spent_steps=5)})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.budget_gate(run, 5, "llm"))
    assert script.labels == [
        "Execute get_budget",
        "Execute get_approval",
        "Execute approval_request",
        "Park",
        "Execute suspend_for_approval",
        "Execute wake_if_decided",
    ]
    request = script.only("approval_request")
    assert (request["name"], request["step_seq"]) == ("budget@5", 5)
    payload = SERIALIZER.loads(request["payload"])
    assert payload["step"] == "llm"
    assert payload["exhausted"] == "steps: 5 of 5 used"
    assert payload["spent"]["steps"] == 5


def test_an_approved_budget_gate_lets_the_step_run() -> None:
    run = budgeted_run(limit_steps=1, spent_steps=1)
    row = ledger_row(limit_steps=1, spent_steps=2, written=True)
    script = Script(
        statements={
            "get_budget": ledger_row(limit_steps=1, spent_steps=1),
            "get_approval": APPROVED,
            "record_charged_step": row,
        }
    )
    assert script.run(protocol.step(run, step_def(llm), (), {})) == "reply"
    assert script.labels == [
        "Execute get_budget",
        "Execute get_approval",
        "Call llm",
        "Execute record_charged_step",
    ]
    assert script.only("get_approval")["name"] == "budget@0"
    assert run.ledger is not None and run.ledger.spent_steps == 2


def test_a_denied_budget_gate_raises_budget_exceeded() -> None:
    run = budgeted_run(limit_dollars="1", spent_dollars="1")
    script = Script(
        statements={
            "get_budget": ledger_row(limit_dollars="1", spent_dollars="1"),
            "get_approval": approval_row("denied"),
        }
    )
    with pytest.raises(BudgetExceededError) as info:
        script.run(protocol.step(run, step_def(llm), (), {}))
    assert (info.value.step_name, info.value.exhausted) == ("llm", "dollars: 1 of 1 spent")
    assert not script.of_type(Call)


def test_a_budget_raised_meanwhile_needs_no_gate() -> None:
    run = budgeted_run(limit_tokens=100, spent_tokens=100)
    script = Script(
        statements={
            "get_budget": ledger_row(limit_tokens=500, spent_tokens=100),
            "record_charged_step": ledger_row(limit_tokens=500, spent_tokens=100, written=True),
        }
    )
    script.run(protocol.step(run, step_def(llm), (), {}))
    assert script.labels == ["Execute get_budget", "Call llm", "Execute record_charged_step"]


# -- sleep ----------------------------------------------------------------------------------


def test_sleep_journals_its_wake_time_then_suspends() -> None:
    script = Script(statements={"suspend_until": 1})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.sleep(make_run(), 60))
    wake = T0 + dt.timedelta(seconds=60)
    assert script.labels == ["Execute record_step", "Park", "Execute suspend_until"]
    record = script.only("record_step")
    assert (record["step_name"], record["kind"]) == ("sleep", "sleep")
    assert SERIALIZER.loads(record["output"]) == wake.isoformat()
    assert script.only("suspend_until") == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "wake_at": wake,
        "topic": None,
    }


def test_a_refused_sleep_suspension_is_a_stale_owner() -> None:
    script = Script(statements={"suspend_until": 0})
    with pytest.raises(StaleOwnerError):
        script.run(protocol.sleep(make_run(), 60))


def test_a_short_sleep_on_the_system_clock_pauses_in_place() -> None:
    run = make_run(clock=FixedClock(is_system=True))
    script = Script()
    script.run(protocol.sleep(run, 0.5))
    assert script.labels == ["Execute record_step", "Pause 0.5"]


def test_a_short_sleep_on_a_fake_clock_still_suspends() -> None:
    script = Script()
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.sleep(make_run(), 0.5))
    assert not script.of_type(Pause)


def test_a_replayed_sleep_whose_time_passed_returns() -> None:
    wake = (T0 - dt.timedelta(seconds=5)).isoformat()
    run = make_run(records=[done(0, "sleep", wake, StepKind.SLEEP)])
    script = Script()
    script.run(protocol.sleep(run, 3600))
    assert script.ops == []


def test_a_replayed_sleep_waits_only_for_what_is_left() -> None:
    wake = T0 + dt.timedelta(seconds=30)
    run = make_run(records=[done(0, "sleep", wake.isoformat(), StepKind.SLEEP)])
    script = Script()
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.sleep(run, 3600))
    assert script.labels == ["Park", "Execute suspend_until"]
    assert script.only("suspend_until")["wake_at"] == wake


# -- messages -------------------------------------------------------------------------------


def test_recv_consumes_and_journals_in_one_statement() -> None:
    script = Script(statements={"consume_message": {"output": '{"n":1}'}})
    assert script.run(protocol.recv(make_run(), "orders", None)) == {"n": 1}
    assert script.labels == ["Execute adopt_early_messages", "Execute consume_message"]
    assert script.ops[1].fetch == "one"
    assert script.only("consume_message") == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "topic": "orders",
        "step_seq": 0,
        "step_name": "recv:orders",
    }


def test_recv_with_nothing_there_suspends_on_the_topic() -> None:
    script = Script()
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.recv(make_run(), None, None))
    assert script.labels == [
        "Execute adopt_early_messages",
        "Execute consume_message",
        "Park",
        "Execute suspend_until",
        "Execute wake_if_message",
    ]
    assert script.only("suspend_until")["topic"] == ""
    assert script.only("suspend_until")["wake_at"] is None


def test_recv_consumes_a_message_that_arrived_before_the_suspend() -> None:
    script = Script(
        statements={"consume_message": Then(None, {"output": '"late"'}), "suspend_until": 0}
    )
    assert script.run(protocol.recv(make_run(), "t", None)) == "late"
    assert script.labels == [
        "Execute adopt_early_messages",
        "Execute consume_message",
        "Park",
        "Execute suspend_until",
        "Execute consume_message",
    ]


def test_recv_with_a_timeout_journals_its_deadline_and_suspends_until_it() -> None:
    script = Script()
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.recv(make_run(), "t", 30))
    assert script.labels == [
        "Execute record_step",
        "Execute adopt_early_messages",
        "Execute consume_message",
        "Park",
        "Execute suspend_until",
        "Execute wake_if_message",
    ]
    deadline = script.only("record_step")
    assert (deadline["step_name"], deadline["kind"]) == ("recv-deadline:t", "sleep")
    assert script.only("consume_message")["step_seq"] == 1
    assert script.only("suspend_until")["wake_at"] == T0 + dt.timedelta(seconds=30)


def test_a_run_takes_the_messages_sent_before_it_existed_once_before_its_first_look() -> None:
    """Messages sent to the id before the workflow existed (send(before_start=True)) are
    moved to the run before its first look, so they come first; once per run (a sender
    that keeps one later finds the workflow and moves it itself), never on a replay."""
    run = make_run(records=[done(0, "recv:t", "replayed", StepKind.RECV)])
    script = Script(statements={"consume_message": {"output": '"fresh"'}})
    assert script.run(protocol.recv(run, "t", None)) == "replayed"
    assert script.labels == []
    assert script.run(protocol.recv(run, "t", None)) == "fresh"
    assert script.run(protocol.recv(run, "u", None)) == "fresh"
    assert script.labels == [
        "Execute adopt_early_messages",
        "Execute consume_message",
        "Execute consume_message",
    ]
    assert script.only("adopt_early_messages") == {"workflow_id": WORKFLOW_ID, "wake": False}


def test_recv_with_a_timeout_takes_both_its_positions_before_it_waits() -> None:
    """A recv with a timeout is two journaled calls (its deadline, its message). In a
    gather, the sibling branches run while the deadline is written: had the message's
    position been taken after that write, a sibling would take it on the first run but
    not on a replay (where the deadline returns at once), and the replay would meet
    another call's record there (NondeterminismError, or a step of the same name
    answering with a sibling's output)."""
    run = make_run()
    gen = protocol.recv(run, "t", 30)
    first = next(gen)  # the deadline's write: siblings may start calls meanwhile
    assert isinstance(first, protocol.Execute) and first.name == "record_step"
    assert run.journal.next_seq == 2
    sibling_seq, _ = run.journal.next_call("a sibling's step")
    assert sibling_seq == 2
    gen.close()


def test_recv_past_its_timeout_records_none() -> None:
    past = (T0 - dt.timedelta(seconds=1)).isoformat()
    run = make_run(records=[done(0, "recv-deadline:t", past, StepKind.SLEEP)])
    script = Script()
    assert script.run(protocol.recv(run, "t", 30)) is None
    assert script.labels == [
        "Execute adopt_early_messages",
        "Execute consume_message",
        "Execute record_step",
    ]
    record = script.only("record_step")
    assert (record["step_seq"], record["step_name"], record["kind"]) == (1, "recv:t", "recv")
    assert record["output"] is None


def test_a_replayed_recv_returns_the_message() -> None:
    run = make_run(records=[done(0, "recv:t", "hello", StepKind.RECV)])
    script = Script()
    assert script.run(protocol.recv(run, "t", None)) == "hello"
    assert script.ops == []


def test_recv_of_a_run_that_lost_ownership_stops() -> None:
    # A stale epoch: nothing can be consumed, and the suspension is refused.
    script = Script(statements={"suspend_until": 0}, limit=50)
    with pytest.raises(StaleOwnerError):
        script.run(protocol.recv(make_run(), "t", None))


# -- events ---------------------------------------------------------------------------------


def test_set_event_publishes_and_journals_in_one_statement() -> None:
    script = Script()
    script.run(protocol.set_event(make_run(), "progress", {"done": 3}))
    assert script.labels == ["Execute set_event"]
    assert script.only("set_event") == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "step_seq": 0,
        "step_name": "event:progress",
        "key": "progress",
        "value": '{"done":3}',
    }


def test_set_event_is_fenced() -> None:
    with pytest.raises(StaleOwnerError):
        Script(statements={"set_event": 0}).run(protocol.set_event(make_run(), "k", 1))


def test_an_event_set_in_a_step_is_written_under_the_step_with_no_call_of_its_own() -> None:
    """The step's record is its journal: the event takes no position (a step run again
    sets it again, in its latest value), and the run's next call keeps its position."""
    run = make_run()
    script = Script()
    script.run(protocol.set_event_in_step(run, 4, "progress", {"done": 1}))
    script.run(protocol.set_event_in_step(run, 4, "progress", {"done": 2}))
    assert script.labels == ["Execute set_step_event", "Execute set_step_event"]
    assert script.executed("set_step_event")[-1] == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "step_seq": 4,
        "key": "progress",
        "value": '{"done":2}',
    }
    assert run.journal.next_call("event:k")[0] == 0


def test_an_event_set_in_a_step_is_fenced() -> None:
    with pytest.raises(StaleOwnerError):
        Script(statements={"set_step_event": 0}).run(
            protocol.set_event_in_step(make_run(), 1, "k", 1)
        )


def test_a_replayed_set_event_publishes_nothing() -> None:
    run = make_run(records=[done(0, "event:k", 1, StepKind.EVENT)])
    script = Script()
    script.run(protocol.set_event(run, "k", 1))
    assert script.ops == []


# -- the hard cap and reservations -------------------------------------------------------------


def _charging(run: Any, amounts: list[str], seen: list[str]) -> Any:
    """A step body charging each amount in turn (one per attempt)."""

    def answer(op: Any) -> Any:
        if isinstance(op, Call) and op.scope is not None:
            amount = amounts[len(seen)]
            seen.append(amount)
            try:
                protocol.charge(run, op.scope, Decimal(amount), 0)
            except BudgetExceededError as exc:
                return protocol.Outcome(error=exc)
            return protocol.Outcome("ok")
        return DEFAULT

    return answer


def test_a_charge_past_the_limit_is_refused_and_the_step_waits_at_a_gate() -> None:
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.9"))
    seen: list[str] = []
    script = Script(
        _charging(run, ["0.3"], seen),
        statements={"get_approval": None, "suspend_for_approval": 1},
    )
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.step(run, step_def(llm), (), {}))
    assert seen == ["0.3"]
    # Nothing recorded for the refused attempt; the gate is the cap's at this position.
    assert "record_charged_step" not in " ".join(script.labels)
    asked = script.only("approval_request")
    assert asked["name"] == "budget@0:cap0"
    assert SERIALIZER.loads(asked["payload"])["cap"] is True
    assert run.inflight == []


def test_an_approved_cap_gate_runs_the_step_again_and_a_denied_one_raises() -> None:
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.9"))
    seen: list[str] = []
    raised = ledger_row(limit_dollars="2", spent_dollars="0.9", written=True)
    script = Script(
        _charging(run, ["0.3", "0.3"], seen),
        statements={
            "get_approval": APPROVED,
            "get_budget": ledger_row(limit_dollars="2", spent_dollars="0.9"),
            "record_charged_step": raised,
        },
    )
    assert script.run(protocol.step(run, step_def(llm), (), {})) == "ok"
    assert seen == ["0.3", "0.3"]
    written = script.only("record_charged_step")
    assert (written["dollars"], written["attempts"]) == (Decimal("0.3"), 1)

    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.9"))
    denied = approval_row("denied", comment="too dear", decided_by="ann")
    script = Script(_charging(run, ["0.3"], []), statements={"get_approval": denied})
    with pytest.raises(BudgetExceededError, match="dollars"):
        script.run(protocol.step(run, step_def(llm), (), {}))


def test_a_resumed_run_does_not_run_a_step_whose_gate_was_denied() -> None:
    run = make_run(
        budget_id=WORKFLOW_ID,
        ledger=ledger(limit_dollars="1", spent_dollars="0.9"),
        first_run=False,
    )
    seen: list[str] = []
    script = Script(
        _charging(run, ["0.3"], seen),
        statements={"denied_budget_gate": {"name": "budget@0:cap0", "comment": "no"}},
    )
    with pytest.raises(BudgetExceededError):
        script.run(protocol.step(run, step_def(llm), (), {}))
    assert seen == []  # the step's code never ran


def test_reservations_count_until_released_and_against_parallel_steps() -> None:
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.5"))
    a, b = (
        protocol.StepScope("a", charging=True, live=1),
        protocol.StepScope("b", charging=True, live=1),
    )
    run.inflight = [a, b]
    protocol.reserve(run, a, Decimal("0.3"), 0)
    with pytest.raises(BudgetExceededError, match="would pass the limit of 1"):
        protocol.reserve(run, b, Decimal("0.3"), 0)  # 0.5 + 0.3 + 0.3 > 1
    assert b.refused is not None and b.reserved_dollars == 0
    protocol.charge(run, a, Decimal("0.2"), 0)  # inside a's reservation: fits
    protocol.release(a, Decimal("0.3"), 0)
    protocol.charge(run, b, Decimal("0.3"), 0)  # a now counts 0.2: 0.5 + 0.2 + 0.3 = 1
    with pytest.raises(BudgetExceededError):
        protocol.charge(run, b, Decimal("0.01"), 0)


def test_sync_steps_charging_from_threads_at_once_never_pass_the_cap() -> None:
    """durable.to_thread runs parallel sync steps in worker threads: their charges are
    decided at the same moment, and a charge checked before a sibling's was added (a
    thread switch between the check and the addition) would pass the cap unseen."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: the race shows
    try:
        for _ in range(1500):
            run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1"))
            run.deciding = threading.Lock()  # as the runner gives each run
            scopes = [protocol.StepScope(f"s{i}", charging=True, live=1) for i in range(8)]
            run.inflight = list(scopes)
            start = threading.Barrier(len(scopes))

            def charge_in(
                scope: protocol.StepScope,
                run: protocol.Run = run,
                start: threading.Barrier = start,
            ) -> None:
                current_run.set(run)
                current_step.set(scope)
                start.wait()
                with contextlib.suppress(BudgetExceededError):
                    durable.charge(dollars=0.2)

            threads = [threading.Thread(target=charge_in, args=(s,)) for s in scopes]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sum(s.dollars for s in scopes) <= Decimal(1)
    finally:
        sys.setswitchinterval(switch)


# -- model calls: decided before they are sent, settled after ---------------------------------

RATES = (Decimal(1000), Decimal(3000))  # dollars per million input and output tokens


def test_a_model_calls_limit_is_the_one_its_cost_counts_against() -> None:
    def limit(priced: bool, **row: Any) -> str | None:
        return protocol.call_limit(make_run(budget_id=WORKFLOW_ID, ledger=ledger(**row)), priced)

    assert protocol.call_limit(make_run(), priced=True) is None  # no budget
    assert limit(True, limit_steps=5) is None
    assert limit(True, limit_dollars="1") == "dollar"
    assert limit(False, limit_dollars="1") is None  # priced None: tokens cost no dollars
    assert limit(False, limit_dollars="1", limit_tokens=10) == "token"
    assert limit(True, limit_tokens=10) == "token"


def test_a_model_calls_worst_case_is_set_aside_and_refused_before_it_is_sent() -> None:
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.6"))
    a, b = (
        protocol.StepScope("a", charging=True, live=1),
        protocol.StepScope("b", charging=True, live=1),
    )
    run.inflight = [a, b]
    # 100 input tokens at $1000/M and 50 output at $3000/M: $0.25, 150 tokens.
    held = protocol.reserve_call(run, a, 100, 50, RATES, "max_tokens")
    assert held == (Decimal("0.25"), 150)
    assert (a.reserved_dollars, a.reserved_tokens) == held
    with pytest.raises(BudgetExceededError, match="would pass the limit of 1"):
        protocol.reserve_call(run, b, 100, 50, RATES, "max_tokens")  # 0.6 + 0.25 + 0.25
    assert b.refused is not None  # refused by the cap: the step waits at its gate


def test_a_model_call_with_no_output_bound_fails_under_a_limit_and_goes_without_one() -> None:
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_tokens=1000))
    scope = protocol.StepScope("openai.chat.completions.create", charging=True, live=1)
    with pytest.raises(UnboundedModelCallError, match=r"max_completion_tokens=\.\.\.") as info:
        protocol.reserve_call(run, scope, 100, None, None, "max_completion_tokens")
    assert (info.value.limit, info.value.field) == ("token", "max_completion_tokens")
    # A mistake in the program, not the cap: the step fails instead of waiting.
    assert scope.refused is None and scope.reserved_tokens == 0
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1"))
    # Priced None under a dollar limit: nothing to set aside, nothing to bound.
    assert protocol.reserve_call(run, scope, 100, None, None, "max_tokens") == (Decimal(0), 0)


def test_a_settled_call_is_recorded_past_the_cap_and_the_next_step_waits() -> None:
    """A reply that cost more than was set aside was paid for: its charge is recorded
    past the limit (not refused, which would send it again), and the gate stops the
    step after it."""
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.5"))
    sent: list[str] = []

    def answer(op: Any) -> Any:
        if isinstance(op, Call) and op.scope is not None:
            held = protocol.reserve_call(run, op.scope, 100, 50, RATES, "max_tokens")
            sent.append(op.scope.name)
            protocol.settle(run, op.scope, Decimal("0.8"), 800)  # the prompt was longer
            protocol.release(op.scope, *held)
            return protocol.Outcome("reply")
        return DEFAULT

    script = Script(
        answer,
        statements={
            "record_charged_step": ledger_row(
                limit_dollars="1", spent_dollars="1.3", spent_steps=1, written=True
            ),
            "get_budget": ledger_row(limit_dollars="1", spent_dollars="1.3", spent_steps=1),
            "get_approval": None,
            "suspend_for_approval": 1,
        },
    )
    assert script.run(protocol.step(run, step_def(llm), (), {})) == "reply"
    written = script.only("record_charged_step")
    assert (written["dollars"], written["tokens"], written["attempts"]) == (
        Decimal("0.8"),
        800,
        1,
    )
    assert script.executed("approval_request") == []
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.step(run, step_def(llm), (), {}))
    assert sent == ["llm"]  # the next call was not made
    assert script.only("approval_request")["name"] == "budget@1"


def test_a_time_budget_is_used_up_by_the_clock() -> None:
    start = T0 - dt.timedelta(seconds=61)
    run = make_run(
        budget_id=WORKFLOW_ID,
        ledger=ledger(limit_dollars="5", limit_seconds=Decimal(60), started_at=start),
    )
    script = Script(
        statements={
            "get_budget": ledger_row(
                limit_dollars="5", limit_seconds=Decimal(60), started_at=start
            ),
            "get_approval": None,
            "suspend_for_approval": 1,
        }
    )
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.step(run, step_def(llm), (), {}))
    payload = SERIALIZER.loads(script.only("approval_request")["payload"])
    assert payload["exhausted"].startswith("seconds: 61.0 of 60")
    assert protocol.budget_left(run).seconds == 0.0


# -- streams -----------------------------------------------------------------------------------


def test_stream_writes_take_offsets_in_order_and_a_replay_writes_nothing() -> None:
    run = make_run(records=[done(0, "stream:out", "a", StepKind.STREAM)])
    script = Script()
    assert script.run(protocol.write_stream(run, "out", "a")) == 0  # replayed: no statement
    assert script.ops == []
    assert script.run(protocol.write_stream(run, "out", "b")) == 1
    written = script.only("write_stream")
    assert (written["step_seq"], written["offset"], written["closed"]) == (1, 1, False)
    assert SERIALIZER.loads(written["value"]) == "b"
    assert written["channel"] == "durable_streams"
    assert script.run(protocol.write_stream(run, "out", None, closing=True)) is None
    assert script.executed("write_stream")[-1]["closed"] is True
    with pytest.raises(StreamClosedError):
        script.run(protocol.write_stream(run, "out", "c"))


def test_a_fenced_stream_write_is_a_lost_claim() -> None:
    with pytest.raises(StaleOwnerError):
        Script(statements={"write_stream": 0}).run(protocol.write_stream(make_run(), "k", 1))


# -- the cap across parallel steps of one run ---------------------------------------------------


def test_a_step_counts_against_the_cap_until_its_record_is_answered() -> None:
    """A sibling charging while this step's record is on its way sees this step's charge
    (it is neither in the ledger the run holds nor to be forgotten)."""
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.3"))
    sibling = protocol.StepScope("sibling", charging=True, live=1)
    seen: list[str] = []
    verdicts: list[str | None] = []

    def recorded(op: Any) -> dict[str, Any]:
        # While the record is in flight: 0.3 recorded + 0.3 this step + 0.3 the sibling
        # would be 0.9, fine; + 0.5 would pass the cap.
        verdicts.append(protocol.over_cap(run, sibling, Decimal("0.5")))
        return ledger_row(limit_dollars="1", spent_dollars="0.6", spent_steps=1, written=True)

    script = Script(_charging(run, ["0.3"], seen), statements={"record_charged_step": recorded})
    assert script.run(protocol.step(run, step_def(llm), (), {})) == "ok"
    assert verdicts[0] is not None and "would pass the limit of 1" in verdicts[0]
    # Answered: the charge is the ledger's now, counted once.
    assert run.inflight == [] and run.ledger is not None
    assert run.ledger.spent_dollars == Decimal("0.6")
    assert protocol.over_cap(run, sibling, Decimal("0.4")) is None


def test_statements_that_read_or_write_the_ledger_are_answered_in_order() -> None:
    """Parallel branches of a run use connections of their own: the ledger's statements
    are marked serial, so the driver sends them one at a time and the run's copy of the
    ledger is never replaced by an older answer."""
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1"))
    seen: list[str] = []
    script = Script(
        _charging(run, ["0.3"], seen),
        statements={"record_charged_step": ledger_row(limit_dollars="1", written=True)},
    )
    script.run(protocol.step(run, step_def(llm), (), {}))
    (op,) = [o for o in script.ops if getattr(o, "name", None) == "record_charged_step"]
    assert op.serial
    script = Script(statements={"get_budget": ledger_row(limit_dollars="1")})
    script.run(protocol.refresh_ledger(run))
    (op,) = [o for o in script.ops if getattr(o, "name", None) == "get_budget"]
    assert op.serial


def test_a_step_limit_counts_the_steps_running_in_parallel() -> None:
    """One step of three allowed is recorded and two are running: a fourth must wait at
    the gate instead of running."""
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_steps=3, spent_steps=1))
    run.inflight = [
        protocol.StepScope("a", charging=True, live=1),
        protocol.StepScope("b", charging=True, live=1),
    ]
    script = Script(
        statements={
            "get_budget": ledger_row(limit_steps=3, spent_steps=1),
            "get_approval": None,
            "suspend_for_approval": 1,
        }
    )
    ran: list[str] = []

    def body() -> str:
        ran.append("body")
        return "ok"

    with pytest.raises(WorkflowSuspended):
        script.run(protocol.step(run, step_def(body), (), {}))
    assert ran == []
    payload = SERIALIZER.loads(script.only("approval_request")["payload"])
    assert payload["exhausted"].startswith("steps: 3 of 3")


def test_dollars_charged_by_running_steps_close_the_gate_for_a_new_one() -> None:
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.4"))
    running = protocol.StepScope("a", charging=True, dollars=Decimal("0.6"))
    run.inflight = [running]
    script = Script(
        statements={
            "get_budget": ledger_row(limit_dollars="1", spent_dollars="0.4"),
            "get_approval": None,
            "suspend_for_approval": 1,
        }
    )
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.step(run, step_def(llm), (), {}))
    assert script.only("approval_request")["name"] == "budget@0"


# -- parking a run whose branches run in parallel ----------------------------------------------


def _joined(op: Any) -> Any:
    return True if isinstance(op, protocol.Park) else DEFAULT


def test_a_gate_whose_sibling_parked_the_run_asks_and_joins_that_suspension() -> None:
    run = make_run()
    script = Script(_joined, statements={"get_approval": None})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.approval(run, "ship", {"order": 1}))
    # Its request is written (a decision on it wakes the workflow); no second suspension.
    assert script.labels == [
        "Execute get_approval",
        "Execute approval_request",
        "Park",
        "Execute wake_if_decided",
    ]
    assert not run.parked


def test_a_timed_gate_whose_sibling_parked_the_run_adds_its_expiry() -> None:
    expires = T0 + dt.timedelta(seconds=60)
    asked = {**approval_row("waiting"), "expires_at": expires}
    script = Script(_joined, statements={"get_approval": Then(None, asked)})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.approval(make_run(), "ship", timeout=60))
    assert script.labels[-4:] == [
        "Park",
        "Execute get_approval",
        "Execute join_suspension",
        "Execute wake_if_decided",
    ]
    assert script.only("join_suspension") == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "wake_at": expires,
    }


def test_a_sleep_whose_sibling_parked_the_run_adds_its_wake_time() -> None:
    run = make_run()
    script = Script(_joined)
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.sleep(run, 60))
    assert script.labels == ["Execute record_step", "Park", "Execute join_suspension"]
    joined = script.only("join_suspension")
    assert joined["wake_at"] == T0 + dt.timedelta(seconds=60)
    assert joined["epoch"] == EPOCH


def test_a_recv_whose_sibling_parked_the_run_looks_for_its_message() -> None:
    run = make_run()
    script = Script(_joined)
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.recv(run, "go", None))
    assert script.labels[-3:] == ["Park", "Execute join_suspension", "Execute wake_if_message"]
    assert script.only("join_suspension")["wake_at"] is None


def test_the_branch_that_parks_the_run_marks_it_parked() -> None:
    run = make_run()
    script = Script(statements={"get_approval": None, "suspend_for_approval": 1})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.approval(run, "ship", {"order": 1}))
    assert run.parked
    run = make_run()
    with pytest.raises(WorkflowSuspended):
        Script().run(protocol.sleep(run, 60))
    assert run.parked


def test_a_cancel_seen_after_the_siblings_finished_stops_instead_of_parking() -> None:
    run = make_run()

    def cancelled_meanwhile(op: Any) -> Any:
        if isinstance(op, protocol.Park):
            run.cancel_reason = "operator"
            return False
        return DEFAULT

    script = Script(cancelled_meanwhile, statements={"get_approval": None})
    with pytest.raises(WorkflowInterrupted):
        script.run(protocol.approval(run, "ship", {"order": 1}))
    assert "Execute suspend_for_approval" not in script.labels


def test_a_gate_woken_at_its_expiry_is_decided_by_its_default() -> None:
    """Nobody decided and no worker's round expired it: the run that finds the gate past
    its time decides it (expire_approval) and journals the default."""
    expired = approval_row("timed_out", default_approved=True)
    script = Script(
        statements={"get_approval": approval_row("waiting"), "expire_approval": expired}
    )
    decision = script.run(protocol.approval(make_run(), "ship", timeout=60, default=True))
    assert decision == Decision(True, None, None, True)
    assert script.labels == [
        "Execute get_approval",
        "Execute expire_approval",
        "Execute record_step",
    ]
    assert script.only("expire_approval") == {"workflow_id": WORKFLOW_ID, "name": "ship"}


def test_a_gate_not_yet_expired_suspends_again() -> None:
    script = Script(statements={"get_approval": approval_row("waiting"), "expire_approval": None})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.approval(make_run(), "ship", timeout=60))
    assert script.labels[:3] == ["Execute get_approval", "Execute expire_approval", "Park"]
    assert "Execute suspend_for_approval" in script.labels


def test_a_gate_without_a_timeout_never_expires_itself() -> None:
    script = Script(statements={"get_approval": approval_row("waiting")})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.approval(make_run(), "ship"))
    assert script.executed("expire_approval") == []
