"""Once a run's code has diverged from its journal (a call that does not match, or a
gather branch that broke its order), no new call is made in any branch: a sibling branch
whose positions shifted would otherwise make its journaled call again, for real, at a
later position. Replays go on. No database: the journal is scripted."""

from __future__ import annotations

import pytest

from durable import _core as protocol
from durable.errors import BranchOrderError, NondeterminismError
from tests.unit.scripted import Script, done, make_run, step_def


def charge() -> str:
    return "charged"


def other() -> str:
    return "other"


def test_after_a_mismatch_no_branch_makes_a_new_call() -> None:
    # Branch A replays position 0 and meets B's record at 1; B then reaches position 2,
    # beyond the journal: it must not charge again there.
    run = make_run(records=[done(0, "charge", "a"), done(1, "charge", "b")])
    script = Script()
    assert script.run(protocol.step(run, step_def(charge), (), {})) == "a"
    with pytest.raises(NondeterminismError) as first:
        script.run(protocol.step(run, step_def(other), (), {}))
    with pytest.raises(NondeterminismError) as second:
        script.run(protocol.step(run, step_def(charge), (), {}))
    assert second.value is first.value  # the run's one divergence, in every branch
    assert script.ops == []  # nothing called, nothing written


def test_replays_go_on_after_a_divergence() -> None:
    run = make_run(records=[done(0, "charge", "a"), done(1, "charge", "b")])
    run.journal.next_seq = 1
    run.journal.diverge(NondeterminismError("wf-1", 5, "x", "y"))
    assert Script().run(protocol.step(run, step_def(charge), (), {})) == "b"


def test_a_branch_order_refusal_stops_every_branch_on_a_first_run() -> None:
    run = make_run()
    with pytest.raises(BranchOrderError):
        protocol.check_branch_order(run, 0, 2)
    script = Script()
    with pytest.raises(BranchOrderError):
        script.run(protocol.step(run, step_def(charge), (), {}))
    with pytest.raises(BranchOrderError):
        script.run(protocol.patched(run, "p"))
    assert script.ops == []
