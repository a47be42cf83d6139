"""Boundaries and small decisions of the pure core: a deadline reached exactly, a sleep
with nothing or just under a second left, the backoffs' growth and bounds, which unique
violation means a journal row already written, how a replayed failure is rebuilt, and a
stream write replayed or closed."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import StepKind, StepRecord
from durable._core import AppFault, Fault
from durable._core.journal import decode_error, rebuild_error, replay, restore
from durable._core.ops import conflict_backoff, outage_backoff
from durable.errors import (
    DatabaseUnavailableError,
    StaleOwnerError,
    StepError,
    StreamClosedError,
    WorkflowCancelledError,
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
    done,
    make_run,
)

# -- deadlines -------------------------------------------------------------------------------


def test_a_deadline_reached_exactly_stops_the_run() -> None:
    run = make_run(deadline=T0)
    assert protocol.stop_reason(run) == protocol.TIMEOUT_REASON
    with pytest.raises(WorkflowInterrupted) as caught:
        protocol.check_interrupt(run)
    assert caught.value.workflow_id == WORKFLOW_ID and caught.value.timed_out
    assert protocol.stop_reason(make_run(deadline=T0 + dt.timedelta(microseconds=1))) is None


def test_a_cancel_is_asked_for_this_run() -> None:
    asked: list[tuple[str, int]] = []

    def cancel(workflow_id: str, epoch: int) -> str | None:
        asked.append((workflow_id, epoch))
        return None

    run = make_run()
    run.settings = dataclasses.replace(run.settings, cancel_request=cancel)
    assert protocol.stop_reason(run) is None
    assert asked == [(WORKFLOW_ID, EPOCH)]


def test_a_recv_whose_deadline_is_reached_exactly_returns_none_journaled() -> None:
    # The deadline (T0 + 5 s) was journaled at position 0; the clock is there exactly.
    wake = SERIALIZER.dumps((T0 + dt.timedelta(seconds=5)).isoformat())
    records = [StepRecord(0, "recv-deadline:chat", StepKind.SLEEP, wake, None, 1)]
    run = make_run(records=records, clock=FixedClock(T0 + dt.timedelta(seconds=5)))
    script = Script()
    assert script.run(protocol.recv(run, "chat", 5)) is None
    record = script.only("record_step")
    assert (record["step_seq"], record["step_name"]) == (1, "recv:chat")


def test_a_recv_refused_twice_names_the_run_that_lost() -> None:
    script = Script(statements={"suspend_until": 0})
    with pytest.raises(StaleOwnerError) as caught:
        script.run(protocol.recv(make_run(), "chat", None))
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)


def test_a_recv_that_consumes_passes_its_crash_point() -> None:
    points: list[str] = []
    script = Script(statements={"consume_message": {"output": SERIALIZER.dumps(1)}})
    assert script.run(protocol.recv(make_run(crash_point=points.append), "chat", None)) == 1
    assert points == ["after_recv"]


def test_a_sleep_with_nothing_left_returns_and_one_under_a_second_pauses() -> None:
    wake = SERIALIZER.dumps(T0.isoformat())
    run = make_run(records=[StepRecord(0, "sleep", StepKind.SLEEP, wake, None, 1)])
    script = Script()
    script.run(protocol.sleep(run, 0))
    assert script.ops == []
    script = Script()
    script.run(protocol.sleep(make_run(clock=FixedClock(is_system=True)), 1.0))
    assert script.labels == ["Execute record_step", "Pause 1"]


def test_a_suspended_sleep_names_its_workflow() -> None:
    script = Script()
    with pytest.raises(WorkflowSuspended) as caught:
        script.run(protocol.sleep(make_run(), 60))
    assert caught.value.args == (WORKFLOW_ID,)


# -- backoffs --------------------------------------------------------------------------------


@pytest.mark.parametrize(("jitter", "factor"), [(0.0, 0.5), (0.999, 1.499)])
def test_a_conflict_backs_off_from_2_ms_doubling_to_200_ms_with_jitter(
    monkeypatch: pytest.MonkeyPatch, jitter: float, factor: float
) -> None:
    monkeypatch.setattr(random, "random", lambda: jitter)
    bases = [conflict_backoff(a) / factor for a in (1, 2, 3, 8, 9, 30)]
    assert bases == pytest.approx([0.002, 0.004, 0.008, 0.2, 0.2, 0.2])


@pytest.mark.parametrize(("jitter", "factor"), [(0.0, 0.5), (0.999, 1.499)])
def test_an_outage_backs_off_from_50_ms_doubling_to_1_s_with_jitter(
    monkeypatch: pytest.MonkeyPatch, jitter: float, factor: float
) -> None:
    monkeypatch.setattr(random, "random", lambda: jitter)
    bases = [outage_backoff(a) / factor for a in (1, 2, 3, 5, 6, 30)]
    assert bases == pytest.approx([0.05, 0.1, 0.2, 0.8, 1.0, 1.0])


def test_a_resent_record_backs_off_more_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.5)
    down = DatabaseUnavailableError("down")
    tries: list[int] = []

    def answer(op: Any) -> Any:
        if isinstance(op, protocol.Execute) and op.name == "record_step":
            tries.append(1)
            if len(tries) < 4:
                raise down
            return 1
        return DEFAULT

    script = Script(answer)
    script.run(protocol.record(make_run(), 0, "fetch", StepKind.STEP, "1"))
    pauses = [op.seconds for op in script.of_type(protocol.Pause)]
    assert pauses == pytest.approx([0.05, 0.1, 0.2])


# -- a journal row already written -----------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "written"),
    [
        (AppFault(Fault.UNIQUE, "steps_pkey"), True),
        (AppFault(Fault.UNIQUE, "steps_pkey_12"), True),  # a partition's copy of the key
        (AppFault(Fault.UNIQUE, "steps_pkey_x"), False),
        (AppFault(Fault.UNIQUE, "steps_pkeyx12"), False),
        (AppFault(Fault.UNIQUE, "other_12"), False),
        (AppFault(Fault.UNIQUE, None), False),
        (AppFault(Fault.CONFLICT, "steps_pkey"), False),
        (None, False),
    ],
)
def test_only_the_journals_own_key_means_the_row_is_written(
    fault: AppFault | None, written: bool
) -> None:
    error = RuntimeError("duplicate key")
    run = make_run(classify_app_error=lambda exc: fault)
    assert protocol.journal._already_written(run, error) is written


# -- replaying failures ----------------------------------------------------------------------


def test_a_replayed_builtin_error_keeps_the_step_error_as_its_cause() -> None:
    text = protocol.encode_error(ValueError("bad"))
    rebuilt = rebuild_error("fetch", text)
    assert type(rebuilt) is ValueError and str(rebuilt) == "bad"
    cause = rebuilt.__cause__
    assert isinstance(cause, StepError)
    assert (cause.step_name, cause.error_type, cause.error_message) == (
        "fetch",
        "builtins.ValueError",
        "bad",
    )
    assert cause.traceback == decode_error(text)[2] and "ValueError" in cause.traceback


def test_a_dotted_builtin_name_is_not_a_builtin() -> None:
    text = '{"type": "os.path.ValueError", "message": "m", "traceback": ""}'
    assert isinstance(rebuild_error("fetch", text), StepError)
    text = '{"type": "builtins.len", "message": "m", "traceback": ""}'
    assert isinstance(rebuild_error("fetch", text), StepError)


def test_an_error_missing_its_fields_decodes_to_empty_strings() -> None:
    assert decode_error("{}") == ("", "", "")


def test_a_replayed_child_cancellation_is_raised_as_the_childs() -> None:
    text = protocol.encode_error(WorkflowCancelledError("kid", "stop"))
    record = StepRecord(0, "kid", StepKind.CHILD, None, text, 1, child_workflow_id="kid")
    with pytest.raises(WorkflowCancelledError) as caught:
        replay(make_run(), record)
    assert caught.value.workflow_id == "kid"
    step = StepRecord(0, "fetch", StepKind.STEP, None, text, 1, child_workflow_id="kid")
    with pytest.raises(StepError):
        replay(make_run(), step)


@dataclasses.dataclass
class Point:
    x: int


def where() -> Point:
    return Point(1)


def untyped():  # type: ignore[no-untyped-def]
    return None


def test_a_replayed_value_is_rebuilt_as_the_functions_return_type() -> None:
    run = make_run(records=[done(0, "where", {"x": 1})])
    assert replay(run, run.journal.records[0], where) == Point(1)
    assert restore(run, '{"x":1}', None) == {"x": 1}
    assert restore(run, '{"x":1}', untyped) == {"x": 1}


# -- streams ---------------------------------------------------------------------------------


def test_a_replayed_stream_write_returns_its_offset_and_writes_nothing() -> None:
    run = make_run(records=[done(0, "stream:s", None, StepKind.STREAM)])
    script = Script()
    assert script.run(protocol.write_stream(run, "s", "a")) == 0
    assert script.ops == [] and run.stream_offsets == {"s": 1}


def test_a_closed_stream_refuses_more_writes_naming_it() -> None:
    points: list[str] = []
    run = make_run(crash_point=points.append)
    script = Script()
    assert script.run(protocol.write_stream(run, "s", None, closing=True)) is None
    assert points == ["after_stream_write"]
    written = script.only("write_stream")
    assert written["closed"] is True and written["value"] is None
    with pytest.raises(StreamClosedError) as caught:
        Script().run(protocol.write_stream(run, "s", "late"))
    assert (caught.value.workflow_id, caught.value.key) == (WORKFLOW_ID, "s")


def test_a_sleep_whose_suspension_is_refused_names_the_run_that_lost() -> None:
    script = Script(statements={"suspend_until": 0})
    with pytest.raises(StaleOwnerError) as caught:
        script.run(protocol.sleep(make_run(), 60))
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)


def test_a_message_wait_parked_by_a_sibling_names_its_workflow() -> None:
    def answer(op: Any) -> Any:
        return True if isinstance(op, protocol.Park) else DEFAULT

    script = Script(answer)
    with pytest.raises(WorkflowSuspended) as caught:
        script.run(protocol.recv(make_run(), "chat", None))
    assert caught.value.args == (WORKFLOW_ID,)
    assert script.only("wake_if_message") == {"workflow_id": WORKFLOW_ID, "topic": "chat"}
