"""durable.patched() past the first position: the marker is a lazy record at its own
position, the answer is kept for the run (either branch), the app-side question is read
only (rolled back), and deprecate_patch passes over a marker wherever it stands."""

from __future__ import annotations

from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import StepKind, StepRecord
from durable._core import AppEnd
from tests.unit.scripted import DEFAULT, Script, done, make_run, step_def


def fetch() -> str:
    return "page"


def after_two(**options: Any) -> Any:
    run = make_run(records=[done(0, "fetch", "a"), done(1, "fetch", "b")], **options)
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    script.run(protocol.step(run, step_def(fetch), (), {}))
    return run


def test_a_new_marker_takes_the_next_position_only() -> None:
    run = after_two()
    script = Script()
    assert script.run(protocol.patched(run, "fix-tax")) is True
    assert script.only("record_step")["step_seq"] == 2
    assert run.journal.next_seq == 3
    assert run.patches == {"fix-tax": True}
    assert Script().run(protocol.patched(run, "fix-tax")) is True


def test_a_marker_is_a_lazy_record() -> None:
    run = after_two(mode="exit")
    script = Script()
    assert script.run(protocol.patched(run, "fix-tax")) is True
    assert script.executed("record_step") == []
    assert [row["step_name"] for row in run.pending] == ["patch:fix-tax"]


def test_the_old_branch_found_by_a_started_call_is_kept_for_the_run() -> None:
    run = after_two(first_run=False)
    script = Script(statements={"child_started_at": {"workflow_id": "kid"}})
    assert script.run(protocol.patched(run, "fix-tax")) is False
    assert run.patches == {"fix-tax": False}
    again = Script()
    assert again.run(protocol.patched(run, "fix-tax")) is False
    assert again.ops == []


def test_a_replayed_branch_is_kept_for_the_run() -> None:
    run = make_run(records=[done(0, "fetch", "a")])
    assert Script().run(protocol.patched(run, "fix-tax")) is False
    assert run.patches == {"fix-tax": False}


def test_the_app_side_question_is_rolled_back() -> None:
    run = after_two(app_separate=True, first_run=False)
    script = Script()
    assert script.run(protocol.patched(run, "fix-tax")) is True
    ends = script.of_type(AppEnd)
    assert ends == [AppEnd(commit=False)]


def test_an_app_side_question_that_fails_is_rolled_back_and_raised() -> None:
    def refuse(op: Any) -> Any:
        if isinstance(op, protocol.AppExecute):
            raise ConnectionError("app database down")
        return DEFAULT

    script = Script(refuse)
    with pytest.raises(ConnectionError):
        script.run(protocol.patched(after_two(app_separate=True, first_run=False), "fix-tax"))
    assert script.of_type(AppEnd) == [AppEnd(commit=False)]


def test_deprecate_patch_passes_over_a_marker_at_a_later_position() -> None:
    marker = StepRecord(2, "patch:fix-tax", StepKind.PATCH, None, None, 1)
    run = make_run(records=[done(0, "fetch", "a"), done(1, "fetch", "b"), marker])
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    script.run(protocol.step(run, step_def(fetch), (), {}))
    protocol.deprecate_patch(run, "fix-tax")
    assert run.journal.next_seq == 3
    assert run.patches == {"fix-tax": True}
