"""Sending a message and reading an event from inside a workflow: what is journaled, and
what a replay does (nothing). No database: the answers are scripted."""

from __future__ import annotations

import pytest

from durable import _core as protocol
from durable._base.models import StepKind, StepRecord
from durable._core import Execute, Pause
from durable.errors import WorkflowNotFoundError
from tests.unit.scripted import Script, done, make_run


def names(script: Script) -> list[str]:
    return [op.name if isinstance(op, Execute) else type(op).__name__ for op in script.ops]


def test_a_send_delivers_under_an_id_of_its_position_then_journals() -> None:
    run = make_run()
    script = Script(
        statements={
            "get_workflow_status": {"status": "SUSPENDED"},
            "get_incarnation": {"incarnation": "a1b2c3"},
        }
    )
    script.run(protocol.send(run, "to-1", {"hi": 1}, "orders", None))
    assert names(script) == [
        "get_workflow_status",
        "get_incarnation",
        "send_message",
        "notify_work",
        "record_step",
    ]
    sent = script.ops[2].params
    # The same on every run of this workflow (delivered once), and another for a workflow
    # started again under the id once this one is pruned (another incarnation).
    assert sent["message_id"] == "wf-1:send:0@a1b2c3"
    assert (sent["workflow_id"], sent["topic"], sent["payload"]) == ("to-1", "orders", '{"hi":1}')
    assert (sent["sender_id"], sent["sender_seq"]) == ("wf-1", 0)
    recorded = script.ops[4].params
    assert (recorded["step_name"], recorded["kind"]) == ("send:orders", "send")
    # The incarnation is read once per run.
    script.run(protocol.send(run, "to-1", {"hi": 2}, "orders", None))
    assert names(script).count("get_incarnation") == 1
    assert script.executed("send_message")[-1]["message_id"] == "wf-1:send:1@a1b2c3"


def test_a_send_of_a_journal_from_before_incarnations_keeps_its_old_id() -> None:
    # A row with no incarnation (journal version 1): a send cut off before its journal
    # row is sent again under the id it had, so it is still delivered once.
    run = make_run()
    script = Script(
        statements={"get_workflow_status": {"status": "RUNNING"}, "get_incarnation": None}
    )
    script.run(protocol.send(run, "to-1", "m", None, None))
    assert script.executed("send_message")[0]["message_id"] == "wf-1:send:0"


def test_a_send_with_a_key_uses_it() -> None:
    run = make_run()
    script = Script(statements={"get_workflow_status": {"status": "RUNNING"}})
    script.run(protocol.send(run, "to-1", "m", None, "mine"))
    assert script.ops[1].params["message_id"] == "mine"
    assert script.ops[3].params["step_name"] == "send:"


def test_a_replayed_send_sends_nothing() -> None:
    run = make_run(records=[done(0, "send:orders", "wf-1:send:0", StepKind.SEND)])
    script = Script()
    script.run(protocol.send(run, "to-1", "m", "orders", None))
    assert script.ops == []


def test_a_send_to_no_workflow_is_journaled_and_raises_again_on_replay() -> None:
    run = make_run()
    script = Script()  # get_workflow_status finds nothing
    with pytest.raises(WorkflowNotFoundError, match="nope"):
        script.run(protocol.send(run, "nope", "m", None, None))
    assert names(script) == ["get_workflow_status", "record_step"]
    assert script.ops[1].params["error"] is not None
    error = script.ops[1].params["error"]
    replayed = make_run(records=[StepRecord(0, "send:", StepKind.SEND, None, error, 1)])
    again = Script()
    with pytest.raises(WorkflowNotFoundError, match="nope"):
        again.run(protocol.send(replayed, "nope", "m", None, None))
    assert again.ops == []


def test_get_event_reads_until_the_value_appears_and_journals_it() -> None:
    run = make_run()
    answers = iter([None, None, {"value": '"ready"'}])
    script = Script(statements={"get_event": lambda op: next(answers)})
    assert script.run(protocol.get_event(run, "other", "state", 10.0)) == "ready"
    assert names(script) == [
        "get_event",
        "Pause",
        "get_event",
        "Pause",
        "get_event",
        "record_step",
    ]
    pauses = [op.seconds for op in script.ops if isinstance(op, Pause)]
    assert pauses == [0.05, 0.1]  # backing off
    recorded = script.ops[-1].params
    assert (recorded["step_name"], recorded["output"]) == ("get-event:state", '"ready"')


def test_get_event_gives_up_after_its_timeout_and_journals_none() -> None:
    run = make_run()
    script = Script()
    assert script.run(protocol.get_event(run, "other", "state", 0.2)) is None
    assert sum(op.seconds for op in script.ops if isinstance(op, Pause)) == pytest.approx(0.2)
    assert script.ops[-1].params["output"] == "null"


def test_a_replayed_get_event_reads_nothing() -> None:
    run = make_run(records=[done(0, "get-event:state", "ready", StepKind.RECV)])
    script = Script()
    assert script.run(protocol.get_event(run, "other", "state", 10.0)) == "ready"
    assert script.ops == []
