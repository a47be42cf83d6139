"""A journal loaded as rows makes each record only when a call reaches its position."""

from __future__ import annotations

import pytest

from durable._base.models import StepKind, StepRecord
from durable._core import Journal
from durable.errors import NondeterminismError


def row(seq: int, name: str = "s", kind: str = "step", output: str | None = "1") -> tuple:
    # load_journals' columns: workflow_id, step_seq, step_name, kind, output, error,
    # attempts, child_workflow_id, started_at, finished_at, applied_in
    return ("w", seq, name, kind, output, None, 1, None, None, None, None)


def test_records_are_made_as_calls_reach_them() -> None:
    # A row no code could read (an unknown kind) at position 2: nothing fails until a
    # call reaches it, and the calls before it replay as records of their rows.
    journal = Journal.from_rows("w", {0: row(0), 1: row(1, output='"x"'), 2: row(2, kind="?")})
    assert not journal.is_fresh and journal.replaying_at(2) and not journal.replaying_at(3)
    seq, found = journal.next_call("s")
    assert (seq, found) == (0, StepRecord(0, "s", StepKind.STEP, "1", None, 1))
    assert journal.records.get(1) == StepRecord(1, "s", StepKind.STEP, '"x"', None, 1)
    assert journal.replay_next("s") is journal.records[1]
    with pytest.raises(KeyError):
        journal.next_call("s")
    assert journal.replay_next("s") is None and journal.next_seq == 3  # nothing taken


def test_a_row_of_another_call_diverges_as_a_record_does() -> None:
    journal = Journal.from_rows("w", {0: row(0, name="a")})
    with pytest.raises(NondeterminismError):
        journal.replay_next("b")
    assert Journal.from_rows("w", {}).is_fresh
