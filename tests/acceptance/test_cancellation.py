"""Cancellation and timeouts across real worker processes, judged by the vendor's ledger.
One real process per scenario; both drivers, in one process: tests/integration/
test_twins_inprocess.py."""

from __future__ import annotations

import datetime as dt
import signal
import time
from pathlib import Path

import psycopg
import pytest

import durable
from durable import errors
from tests.acceptance.workers import client, scalar, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app, vendor


@pytest.mark.parametrize("driver", ["async"])
def test_cancel_stops_a_running_tree_and_runs_both_compensations(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(
            counter_app.pick(counter_app.tree, driver), "t1", 60, 0.2, workflow_id="t1"
        )
        worker = start_worker(subprocess_env, database_url)
        try:
            wait_for(lambda: len(world(database_url, "t1/child")) >= 3, what="the child to work")
            assert engine.cancel("t1", reason="the user changed plans") == "RUNNING"
            with pytest.raises(errors.WorkflowCancelledError, match="changed plans"):
                handle.result(timeout=60)
            child_name = "counter.long_trip" + (".async" if driver == "async" else "")
            child_id = next(w.workflow_id for w in engine.list_workflows(name=child_name))
            assert engine.retrieve(child_id).status() == "CANCELLED"
            done = len(world(database_url, "t1/child"))
            time.sleep(1.0)
            assert len(world(database_url, "t1/child")) == done  # nothing runs after the stop
        finally:
            stop_worker(worker)
    assert done < 10  # stopped within a step or two of the request, not after 60
    # hotel +25, flight +10, then the child's undo and the parent's, newest first.
    assert vendor.moved(database_url) == [25, 10, -10, -25]


@pytest.mark.parametrize("driver", ["sync"])
def test_cancel_of_a_suspended_workflow_runs_its_compensation_and_never_resumes_it(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(
            counter_app.pick(counter_app.booked_nap, driver), "n1", 3600.0, workflow_id="n1"
        )
        worker = start_worker(subprocess_env, database_url)
        try:
            wait_for(lambda: handle.status() == "SUSPENDED", what="the sleep to suspend")
            assert engine.cancel("n1") == "PENDING"  # a worker finishes the stop
            with pytest.raises(errors.WorkflowCancelledError):
                handle.result(timeout=60)
        finally:
            stop_worker(worker)
        assert vendor.moved(database_url) == [7, -7]
        assert world(database_url, "n1") == []  # the step after the sleep never ran
        assert engine.cancel("n1") == "CANCELLED"  # repeating it changes nothing


@pytest.mark.parametrize("driver", ["sync"])
def test_never_started_workflows_are_cancelled_at_once_and_never_recovered(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    with client(database_url) as engine:
        three_steps = counter_app.pick(counter_app.three_steps, driver)
        pending = engine.submit(three_steps, "p1", workflow_id="p1")
        queued_wf = counter_app.pick(counter_app.queued, driver)
        queued = engine.enqueue(counter_app.limited, queued_wf, "e1", 0.0)
        assert engine.cancel("p1") == "CANCELLED"
        assert engine.cancel(queued.workflow_id) == "CANCELLED"
        with pytest.raises(errors.WorkflowNotFoundError):
            engine.cancel("no-such-workflow")
        worker = start_worker(subprocess_env, database_url)
        try:
            time.sleep(1.5)  # fifteen polls of a worker that has the code
        finally:
            stop_worker(worker)
        assert pending.status() == "CANCELLED" and queued.status() == "CANCELLED"
        with pytest.raises(errors.WorkflowCancelledError):
            pending.result(timeout=1)
    assert world(database_url) == []
    assert scalar(database_url, "SELECT count(*) FROM queue_runs") == 0


@pytest.mark.parametrize("driver", ["async"])
def test_timeout_counts_across_a_sigkill_and_ends_a_long_sleep(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path, driver: str
) -> None:
    path = tmp_path / "clock"
    clock = durable.FakeClock(dt.datetime(2026, 5, 1, 8, 0, tzinfo=dt.UTC), path=path)
    with client(database_url) as engine:
        nap = counter_app.pick(counter_app.deadline_nap, driver)
        handle = engine.submit(nap, "d1", 2 * 86_400.0, workflow_id="d1")
        first = start_worker(subprocess_env, database_url, clock_file=str(path))
        wait_for(lambda: handle.status() == "SUSPENDED", what="the sleep to suspend")
        first.send_signal(signal.SIGKILL)
        first.wait()
        deadline = scalar(database_url, "SELECT deadline_at FROM durable.workflows")
        assert isinstance(deadline, dt.datetime)
        assert abs(deadline - (clock.now() + dt.timedelta(hours=1))) < dt.timedelta(minutes=1)
        second = start_worker(subprocess_env, database_url, clock_file=str(path))
        try:
            time.sleep(1.0)
            assert handle.status() == "SUSPENDED"  # a restart does not reset the timeout
            clock.advance(dt.timedelta(minutes=61))
            with pytest.raises(errors.WorkflowTimeoutError, match="3600"):
                handle.result(timeout=60)
        finally:
            stop_worker(second)
    assert [w[1] for w in world(database_url, "d1")] == ["before"]
    with psycopg.connect(database_url) as conn:
        status = conn.execute("SELECT status FROM durable.workflows").fetchone()
    assert status == ("CANCELLED",)


@pytest.mark.parametrize("driver", ["sync"])
def test_resume_after_a_cancel_whose_compensations_ran_is_refused_and_pays_nothing_twice(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    """Cancelled while it waits, the workflow's booking is undone once. Resuming it would
    replay the booking on top of its undo (and undo it again with a new key): resume is
    refused with WorkflowNotResumableError naming fork, and nothing more moves."""
    with client(database_url) as engine:
        handle = engine.submit(
            counter_app.pick(counter_app.booked_wait, driver), "bw", workflow_id="bw"
        )
        worker = start_worker(subprocess_env, database_url)
        try:
            wait_for(lambda: handle.status() == "SUSPENDED", what="the recv to suspend")
            engine.cancel("bw")
            with pytest.raises(errors.WorkflowCancelledError):
                handle.result(timeout=60)
            assert vendor.moved(database_url) == [7, -7]
            journal = [(s.step_seq, s.step_name) for s in engine.steps("bw")]
            with pytest.raises(errors.WorkflowNotResumableError, match="fork"):
                engine.resume("bw")
            engine.send("bw", "go", topic="go")
            time.sleep(1.0)  # a worker that took it up again would have run by now
            assert engine.get_workflow("bw").status == "CANCELLED"
        finally:
            stop_worker(worker)
        assert vendor.moved(database_url) == [7, -7]  # one booking, one undo
        assert world(database_url, "bw") == []  # never shipped
        assert [(s.step_seq, s.step_name) for s in engine.steps("bw")] == journal


@pytest.mark.parametrize("driver", ["sync"])
def test_resume_of_a_cancelled_workflow_with_nothing_to_undo_still_runs_it(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(
            counter_app.pick(counter_app.booked_nap, driver), "nap", 3600.0, workflow_id="nap"
        )
        engine.cancel("nap")  # never started: cancelled at once, nothing to undo
        assert handle.status() == "CANCELLED"
        worker = start_worker(subprocess_env, database_url)
        try:
            with durable.Client(database_url) as operator:
                operator.resume("nap")  # a worker runs it
            wait_for(lambda: handle.status() == "SUSPENDED", what="the resumed run's sleep")
        finally:
            stop_worker(worker)
        assert vendor.moved(database_url) == [7]


def test_resume_of_a_succeeded_workflow_returns_its_handle_and_runs_nothing(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(counter_app.three_steps, "done", workflow_id="done")
        worker = start_worker(subprocess_env, database_url)
        try:
            result = handle.result(timeout=60)
            before = engine.get_workflow("done")
            again = engine.resume("done")
            assert again.workflow_id == "done"
            assert again.result(timeout=5) == result
            after = engine.get_workflow("done")
            assert (after.status, after.updated_at) == ("SUCCESS", before.updated_at)
        finally:
            stop_worker(worker)
        assert len(world(database_url, "done")) == 3  # each step once
