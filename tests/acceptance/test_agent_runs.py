"""Budgets and retention across real worker processes killed with SIGKILL. Both drivers,
and the kill after the record, in one process: tests/integration/test_twins_inprocess.py."""

from __future__ import annotations

import datetime as dt
import signal
from pathlib import Path
from typing import Any

import pytest

import durable
from tests.acceptance.workers import client, scalar, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app, vendor

N = 6
# What the six steps charge: (i + 1) quarters and 10 * (i + 1) tokens each.
DOLLARS = sum((i + 1) * 0.25 for i in range(N))  # 5.25
TOKENS = sum(10 * (i + 1) for i in range(N))  # 210


@pytest.mark.parametrize(
    ("crash", "reruns"),
    [
        # Killed after step 3 charged but before its record: the attempt is lost whole
        # (its charge with it) and step 3 runs, and charges, once more.
        ("before_step_record:3", ["spend:2"]),
    ],
)
@pytest.mark.parametrize("driver", ["sync"])
def test_total_spend_counts_each_step_once_across_a_sigkill(
    database_url: str, subprocess_env: dict[str, str], crash: str, reruns: list[str], driver: str
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(
            counter_app.pick(counter_app.spender, driver), "s1", N, workflow_id="s1"
        )
        first = start_worker(subprocess_env, database_url, crash=crash)
        assert first.wait(timeout=60) == -signal.SIGKILL
        wait_for(lambda: len(world(database_url, "s1")) == 3, what="three steps before the kill")
        spent_at_kill = engine.budget("s1")
        assert spent_at_kill is not None
        second = start_worker(subprocess_env, database_url)
        try:
            assert handle.result(timeout=60) == sum(range(N))
        finally:
            stop_worker(second)
        ledger = engine.budget("s1")
    assert ledger is not None
    ran = [what for _wf, what, _pid in world(database_url, "s1")]
    expected = [f"spend:{i}" for i in range(N)]
    assert sorted(ran) == sorted(expected + reruns)
    # The resume continued from what was spent at the kill, not from zero...
    assert spent_at_kill["spent"]["steps"] == (3 if not reruns else 2)
    # ...and the total is each step's charge exactly once.
    assert ledger["spent"] == {"dollars": DOLLARS, "tokens": TOKENS, "steps": N}
    assert [c["step_seq"] for c in ledger["charges"]] == list(range(N))
    assert sum(c["dollars"] for c in ledger["charges"]) == DOLLARS


@pytest.mark.parametrize("driver", ["sync"])
def test_retention_with_workers_running_keeps_effects_and_suspended_work(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path, driver: str
) -> None:
    def pick(workflow: Any) -> Any:
        return counter_app.pick(workflow, driver)

    clock_file = str(tmp_path / "clock")
    clock = durable.FakeClock(path=clock_file)
    env = dict(subprocess_env, DURABLE_FAKE_CLOCK=clock_file)
    steps_of = "SELECT count(*) FROM durable.steps WHERE workflow_id = %s"
    effects_of = "SELECT count(*) FROM durable.effects WHERE workflow_id = %s"
    with client(database_url) as engine:
        old = [
            engine.submit(pick(counter_app.three_steps), f"f{i}", workflow_id=f"f{i}")
            for i in (1, 2)
        ]
        trip = engine.submit(pick(counter_app.trip), workflow_id="trip")
        gated = engine.submit(pick(counter_app.big_refund), 500, None, workflow_id="gated")
        workers = [
            start_worker(
                env,
                database_url,
                clock_file=clock_file,
                extra=[
                    "--prune-finished-after",
                    "7d",
                    "--prune-effects-after",
                    "90d",
                    "--prune-interval",
                    "0.2",
                ],
            )
            for _ in range(2)
        ]
        try:
            for h in old:
                assert len(h.result(timeout=60)) == 3
            with pytest.raises(durable.errors.WorkflowFailedError):
                trip.result(timeout=60)  # the card is declined; both bookings are undone
            wait_for(lambda: gated.status() == "SUSPENDED", what="the gate to suspend")
            trip_effects = scalar(database_url, effects_of, "trip")
            assert trip_effects == 5  # two bookings, the declined card, two undos
            gated_steps = scalar(database_url, steps_of, "gated")

            clock.advance(dt.timedelta(days=8))
            young = engine.submit(pick(counter_app.three_steps), "young", workflow_id="young")
            assert len(young.result(timeout=60)) == 3
            wait_for(
                lambda: (
                    scalar(
                        database_url,
                        "SELECT count(*) FROM durable.workflows"
                        " WHERE workflow_id IN ('f1', 'f2', 'trip')",
                    )
                    == 0
                ),
                what="old finished workflows to be pruned",
            )
            for wf in ("f1", "f2", "trip"):
                assert scalar(database_url, steps_of, wf) == 0
            # The effect ledger outlives the journal; the suspended workflow is untouched;
            # a workflow finished a moment ago stays.
            assert scalar(database_url, effects_of, "trip") == trip_effects
            assert gated.status() == "SUSPENDED"
            assert scalar(database_url, steps_of, "gated") == gated_steps
            assert scalar(database_url, steps_of, "young") == 3

            engine.decide("gated", "refund-over-limit", True, comment="ok after a week")
            assert gated.result(timeout=60) == "refunded 500 (ok after a week)"

            clock.advance(dt.timedelta(days=83))  # 91 days after the trip's effects
            wait_for(
                lambda: scalar(database_url, effects_of, "trip") == 0,
                what="the trip's effect records to pass their window",
            )
            # The gated workflow finished 83 days ago: its journal goes (7 days; a pass of
            # the prune may take it just after the effects above), its effect record stays
            # (90 days).
            wait_for(
                lambda: scalar(database_url, steps_of, "gated") == 0,
                what="the gated workflow's journal to be pruned",
            )
            assert scalar(database_url, effects_of, "gated") == 1
        finally:
            for w in workers:
                stop_worker(w)
    # What reached the vendor: both bookings and their undos, and the approved refund.
    assert vendor.moved(database_url) == [10, 25, -25, -10, 500]
