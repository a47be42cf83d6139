from __future__ import annotations

import datetime as dt
import decimal
import random
import uuid

import pytest

from durable import errors
from durable._base.models import RetryPolicy, StepKind, StepRecord
from durable._core import Journal, encode_error, rebuild_error
from durable.serialization import JSONSerializer, PickleSerializer, dumps_checked


def rec(seq: int, name: str) -> StepRecord:
    return StepRecord(seq, name, StepKind.STEP, '"x"', None, 1)


def test_fresh_journal_executes_everything() -> None:
    j = Journal("w")
    assert j.is_fresh
    assert [j.next_call("a"), j.next_call("b")] == [(0, None), (1, None)]


def test_replay_then_execute_and_name_check() -> None:
    j = Journal.from_records("w", [rec(0, "a"), rec(1, "b")])
    assert j.next_call("a") == (0, rec(0, "a"))
    with pytest.raises(errors.NondeterminismError) as info:
        j.next_call("c")
    assert (info.value.step_seq, info.value.recorded, info.value.current) == (1, "b", "c")
    # Diverged: no new call is made after it (in any branch), only replays.
    with pytest.raises(errors.NondeterminismError) as again:
        j.next_call("d")
    assert again.value is info.value


def test_builtin_errors_rebuild_others_become_step_errors() -> None:
    err = rebuild_error("s", encode_error(ValueError("bad")))
    assert type(err) is ValueError and str(err) == "bad"

    class Custom(Exception):
        pass

    err2 = rebuild_error("s", encode_error(Custom("boom")))
    assert isinstance(err2, errors.StepError)
    assert err2.error_message == "boom" and "Custom" in err2.error_type
    assert "boom" in err2.traceback


def test_a_childs_timeout_or_cancel_rebuilds_as_itself_on_replay() -> None:
    # A child called directly: the parent caught WorkflowTimeoutError on the first run, so
    # every replay raises that type again, with the child's id and the first run's words.
    first = errors.WorkflowTimeoutError("c-1", 0.5)
    again = rebuild_error("child", encode_error(first), "c-1")
    assert type(again) is errors.WorkflowTimeoutError
    assert (again.workflow_id, str(again)) == ("c-1", str(first))
    cancelled = errors.WorkflowCancelledError("c-2", "by an operator")
    again = rebuild_error("child", encode_error(cancelled), "c-2")
    assert type(again) is errors.WorkflowCancelledError and str(again) == str(cancelled)
    # Only for a child's record: a step that raised one is a StepError, as before.
    assert isinstance(rebuild_error("s", encode_error(first)), errors.StepError)


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(retries=5, initial_delay=1, backoff=2, max_delay=5, jitter=0)
    assert [policy.delay(a) for a in range(1, 6)] == [1, 2, 4, 5, 5]
    jittery = RetryPolicy(initial_delay=10, jitter=0.5)
    delays = {jittery.delay(1, random.Random(i)) for i in range(20)}
    assert len(delays) > 1 and all(5 <= d <= 15 for d in delays)
    assert policy.should_retry(ValueError(), 5) and not policy.should_retry(ValueError(), 6)
    assert not RetryPolicy(retries=3, retry_on=(KeyError,)).should_retry(ValueError(), 1)


def test_json_round_trip() -> None:
    s = JSONSerializer()
    value = {
        "t": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        "d": decimal.Decimal("1.10"),
        "u": uuid.UUID(int=1),
        "b": b"\x00\x01",
        "td": dt.timedelta(seconds=90),
        "n": [1, None, "x"],
    }
    assert s.loads(s.dumps(value)) == value


def test_dumps_checked_errors() -> None:
    s = JSONSerializer()
    with pytest.raises(errors.SerializationError, match="step 'x'") as info:
        dumps_checked(s, object(), "the output of step 'x'", 100)
    assert info.value.type_name == "object"
    with pytest.raises(errors.PayloadTooLargeError):
        dumps_checked(s, "é" * 60, "v", 100)  # 120 bytes in UTF-8, 62 characters
    with pytest.raises(errors.SerializationError):
        dumps_checked(s, float("nan"), "v", 100)


def test_pickle_is_opt_in_and_round_trips() -> None:
    p = PickleSerializer()
    assert p.loads(p.dumps({1, 2})) == {1, 2}
