"""Sleeps, messages, budgets, cancellation and timeouts across a dead process, in one
process and for both drivers: the `[sync]`/`[async]` twins of tests/acceptance
(test_sleep_and_messages.py, test_agent_runs.py, test_cancellation.py), each of which keeps
one real worker process. A process dies as tests/integration/inprocess.py says (its
backends terminated, its lease run out on the movable clock); every case checks the world:
the counter app's `world` table, the vendor's rows, the journal and the budget ledger."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import psycopg
import pytest

import durable
from durable import errors
from tests.acceptance.workers import wait_for
from tests.apps import counter_app, loop_faults_app, stream_app, vendor
from tests.integration.inprocess import T0, crash_then_recover, process

# The tests' own reads, at READ COMMITTED whatever the default (under
# DURABLE_TEST_ISOLATION=serializable even a read can be refused with 40001).
READ_COMMITTED = "-c default_transaction_isolation=read\\ committed"

REG = counter_app.registry
DRIVERS = ["sync", "async"]


@pytest.fixture
def url(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DURABLE_DATABASE_URL", database_url)  # the vendor's own connections
    counter_app.setup(database_url)
    return database_url


def world(url: str, workflow_id: str | None = None) -> list[str]:
    with psycopg.connect(url, options=READ_COMMITTED) as conn:
        rows = conn.execute(
            "SELECT what FROM world WHERE %(w)s::text IS NULL OR workflow_id = %(w)s::text"
            " ORDER BY id",
            {"w": workflow_id},
        ).fetchall()
    return [r[0] for r in rows]


def one(url: str, query: str, *params: object) -> Any:
    with psycopg.connect(url, options=READ_COMMITTED) as conn:
        row = conn.execute(query, list(params)).fetchone()
    return None if row is None else row[0]


# -- tests/acceptance/test_sleep_and_messages.py -----------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_sleep_survives_the_death_of_its_process_and_wakes_once(url: str, driver: str) -> None:
    clock = durable.FakeClock(T0)
    napper = counter_app.pick(counter_app.napper, driver)
    with durable.Client(url, clock=clock) as client:
        handle = client.submit(napper, "nap", 3600.0, workflow_id="nap")
        with process(url, REG, clock) as first:
            wait_for(lambda: handle.status() == "SUSPENDED", what="the sleep to suspend")
            # Sleeping holds nothing; the process dies while it sleeps.
            assert one(url, "SELECT owner FROM durable.workflows") is None
            first.proc.kill()
        wake_at = one(url, "SELECT wake_at FROM durable.workflows")
        assert isinstance(wake_at, dt.datetime)
        with process(url, REG, clock):
            time.sleep(0.5)
            assert handle.status() == "SUSPENDED"  # not before it is due
            clock.advance(3600)
            assert handle.result(timeout=60) == "AFTER"
    assert world(url, "nap") == ["before", "after"]  # each once


@pytest.mark.parametrize("driver", DRIVERS)
def test_messages_are_consumed_exactly_once_across_a_crash(url: str, driver: str) -> None:
    clock = durable.FakeClock(T0)
    receiver = counter_app.pick(counter_app.receiver, driver)
    with durable.Client(url, clock=clock) as client:
        handle = client.submit(receiver, "rx", 3, workflow_id="rx")
        # The receiver dies right after consuming (and journaling) the second message.
        with process(url, REG, clock, crash="after_recv:2") as first:
            wait_for(lambda: handle.status() == "SUSPENDED", what="the receiver to wait")
            client.send("rx", "m1", topic="orders", idempotency_key="k1")
            client.send("rx", "m1", topic="orders", idempotency_key="k1")  # duplicate: once
            wait_for(lambda: world(url, "rx") == ["got:m1"], what="the first message")
            client.send("rx", "m2", topic="orders", idempotency_key="k2")
            first.wait_dead()
        client.send("rx", "m3", topic="orders", idempotency_key="k3")
        with process(url, REG, clock):
            assert handle.result(timeout=60) == ["m1", "m2", "m3"]
    assert one(url, "SELECT count(*) FROM durable.messages") == 3
    seqs = one(url, "SELECT array_agg(consumed_seq ORDER BY created_at) FROM durable.messages")
    assert len(set(seqs)) == 3
    assert world(url, "rx") == ["got:m1", "got:m2", "got:m3"]


# -- tests/acceptance/test_agent_runs.py ---------------------------------------------------------

N = 6
DOLLARS = sum((i + 1) * 0.25 for i in range(N))  # 5.25
TOKENS = sum(10 * (i + 1) for i in range(N))  # 210


@pytest.mark.parametrize(
    ("crash", "reruns"),
    [
        # Killed between a charge (recorded with step 3) and the next step.
        ("after_step_record:3", []),
        # Killed after step 3 charged but before its record: the attempt is lost whole
        # (its charge with it) and step 3 runs, and charges, once more.
        ("before_step_record:3", ["spend:2"]),
    ],
)
@pytest.mark.parametrize("driver", DRIVERS)
def test_total_spend_counts_each_step_once_across_a_crash(
    url: str, crash: str, reruns: list[str], driver: str
) -> None:
    spender = counter_app.pick(counter_app.spender, driver)
    client, clock = crash_then_recover(
        url, REG, crash, lambda c: c.submit(spender, "s1", N, workflow_id="s1")
    )
    with client:
        assert len(world(url, "s1")) == 3
        spent_at_kill = client.budget("s1")
        assert spent_at_kill is not None
        with process(url, REG, clock):
            assert client.retrieve("s1").result(timeout=60) == sum(range(N))
        ledger = client.budget("s1")
    assert ledger is not None
    expected = [f"spend:{i}" for i in range(N)]
    assert sorted(world(url, "s1")) == sorted(expected + reruns)
    # The resume continued from what was spent at the kill, not from zero...
    assert spent_at_kill["spent"]["steps"] == (3 if not reruns else 2)
    # ...and the total is each step's charge exactly once.
    assert ledger["spent"] == {"dollars": DOLLARS, "tokens": TOKENS, "steps": N}
    assert [c["step_seq"] for c in ledger["charges"]] == list(range(N))


# -- tests/acceptance/test_cancellation.py -------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_cancel_stops_a_running_tree_and_runs_both_compensations(url: str, driver: str) -> None:
    clock = durable.FakeClock(T0)
    tree = counter_app.pick(counter_app.tree, driver)
    with durable.Client(url, clock=clock) as client, process(url, REG, clock):
        handle = client.submit(tree, "t1", 60, 0.2, workflow_id="t1")
        wait_for(lambda: len(world(url, "t1/child")) >= 2, what="the child to work")
        assert client.cancel("t1", reason="the user changed plans") == "RUNNING"
        with pytest.raises(errors.WorkflowCancelledError, match="changed plans"):
            handle.result(timeout=60)
        child = next(w for w in client.list_workflows() if w.parent_id == "t1")
        assert client.retrieve(child.workflow_id).status() == "CANCELLED"
        done = len(world(url, "t1/child"))
        time.sleep(0.6)
        assert len(world(url, "t1/child")) == done  # nothing runs after the stop
    assert done < 10  # stopped within a step or two of the request, not after 60
    # hotel +25, flight +10, then the child's undo and the parent's, newest first.
    assert vendor.moved(url) == [25, 10, -10, -25]


@pytest.mark.parametrize("driver", DRIVERS)
def test_cancel_of_a_suspended_workflow_compensates_and_never_resumes_it(
    url: str, driver: str
) -> None:
    clock = durable.FakeClock(T0)
    booked_nap = counter_app.pick(counter_app.booked_nap, driver)
    with durable.Client(url, clock=clock) as client, process(url, REG, clock):
        handle = client.submit(booked_nap, "n1", 3600.0, workflow_id="n1")
        wait_for(lambda: handle.status() == "SUSPENDED", what="the sleep to suspend")
        assert client.cancel("n1") == "PENDING"  # a worker finishes the stop
        with pytest.raises(errors.WorkflowCancelledError):
            handle.result(timeout=60)
        clock.advance(7200)  # past the sleep: still never resumed
        time.sleep(0.3)
        assert client.cancel("n1") == "CANCELLED"  # repeating it changes nothing
    assert vendor.moved(url) == [7, -7]
    assert world(url, "n1") == []  # the step after the sleep never ran


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_timeout_counts_across_a_dead_process_and_ends_a_long_sleep(
    url: str, driver: str
) -> None:
    clock = durable.FakeClock(T0)
    nap = counter_app.pick(counter_app.deadline_nap, driver)
    with durable.Client(url, clock=clock) as client:
        handle = client.submit(nap, "d1", 2 * 86_400.0, workflow_id="d1")
        with process(url, REG, clock) as first:
            wait_for(lambda: handle.status() == "SUSPENDED", what="the sleep to suspend")
            first.proc.kill()
        deadline = one(url, "SELECT deadline_at FROM durable.workflows")
        assert abs(deadline - (T0 + dt.timedelta(hours=1))) < dt.timedelta(minutes=1)
        with process(url, REG, clock):
            time.sleep(0.5)
            assert handle.status() == "SUSPENDED"  # a new process does not reset the timeout
            clock.advance(dt.timedelta(minutes=61))
            with pytest.raises(errors.WorkflowTimeoutError, match="3600"):
                handle.result(timeout=60)
    assert world(url, "d1") == ["before"]
    assert one(url, "SELECT status FROM durable.workflows") == "CANCELLED"


@pytest.mark.parametrize("driver", DRIVERS)
def test_resume_after_a_cancel_whose_compensations_ran_is_refused(url: str, driver: str) -> None:
    clock = durable.FakeClock(T0)
    booked_wait = counter_app.pick(counter_app.booked_wait, driver)
    with durable.Client(url, clock=clock) as client, process(url, REG, clock):
        handle = client.submit(booked_wait, "bw", workflow_id="bw")
        wait_for(lambda: handle.status() == "SUSPENDED", what="the recv to suspend")
        client.cancel("bw")
        with pytest.raises(errors.WorkflowCancelledError):
            handle.result(timeout=60)
        journal = [(s.step_seq, s.step_name) for s in client.steps("bw")]
        with pytest.raises(errors.WorkflowNotResumableError, match="fork"):
            client.resume("bw")
        client.send("bw", "go", topic="go")
        time.sleep(0.5)  # a process that took it up again would have run by now
        assert client.get_workflow("bw").status == "CANCELLED"
        assert [(s.step_seq, s.step_name) for s in client.steps("bw")] == journal
    assert vendor.moved(url) == [7, -7]  # one booking, one undo
    assert world(url, "bw") == []  # never shipped


@pytest.mark.parametrize("driver", DRIVERS)
def test_resume_of_a_cancelled_workflow_with_nothing_to_undo_runs_it(url: str, driver: str) -> None:
    clock = durable.FakeClock(T0)
    booked_nap = counter_app.pick(counter_app.booked_nap, driver)
    with durable.Client(url, clock=clock) as client:
        handle = client.submit(booked_nap, "nap", 3600.0, workflow_id="nap")
        client.cancel("nap")  # never started: cancelled at once, nothing to undo
        assert handle.status() == "CANCELLED"
        with process(url, REG, clock):
            client.resume("nap")
            wait_for(lambda: handle.status() == "SUSPENDED", what="the resumed run's sleep")
    assert vendor.moved(url) == [7]


# -- tests/acceptance/test_streams.py ------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_readers_see_each_value_once_across_a_dead_writer(url: str, driver: str) -> None:
    producer = stream_app.producer_async if driver == "async" else stream_app.producer
    seen_live: list[int] = []
    client, clock = crash_then_recover(
        url,
        stream_app.registry,
        "after_stream_write:50",
        lambda c: c.submit(producer, 100, workflow_id="s"),
    )
    with client:
        assert one(url, "SELECT count(*) FROM durable.streams") == 50

        def follow() -> None:
            for value in client.read_stream("s", "progress", poll_interval=0.05):
                seen_live.append(value["i"])

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        with process(url, stream_app.registry, clock):
            assert client.retrieve("s").result(timeout=60) == 100
            reader.join(timeout=60)
            assert not reader.is_alive()
        again = [v["i"] for v in client.read_stream("s", "progress", offset=30)]
    assert seen_live == list(range(100))
    assert again == list(range(30, 100))
    offsets = one(
        url,
        'SELECT array_agg("offset" ORDER BY "offset") FROM durable.streams WHERE NOT closed',
    )
    assert offsets == list(range(100))  # each written once


# -- tests/acceptance/test_async_loop_faults.py ------------------------------------------------


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt"])
def test_an_exit_in_every_run_of_an_async_step_is_given_up_and_the_loop_goes_on(
    url: str, kind: str
) -> None:
    """Each run of a poison workflow (the exit in its body's task, or in a branch of a
    gather) exits once, is given up and counted; a workflow that exits once is recovered;
    a harmless one on the same loop finishes."""
    clock = durable.FakeClock(T0)
    with durable.Client(url, clock=clock) as client:
        with process(url, loop_faults_app.registry, clock, max_recovery_attempts=2):
            harmless = client.submit(loop_faults_app.napping, "h", 0.5, workflow_id="h")
            poison = client.submit(loop_faults_app.exiting, "x1", kind, 99, False, workflow_id="x1")
            branch = client.submit(loop_faults_app.exiting, "x2", kind, 99, True, workflow_id="x2")
            once = client.submit(loop_faults_app.exiting, "x3", kind, 1, True, workflow_id="x3")
            assert once.result(timeout=60) == 2
            assert harmless.result(timeout=60) == "rested"
            for h in (poison, branch):
                wait_for(
                    lambda h=h: h.status() == "MAX_RECOVERY_ATTEMPTS_EXCEEDED",
                    what=f"{h.workflow_id} to be given up",
                )
    for w in ("x1", "x2"):
        assert world(url, w).count("exit-step") == loop_faults_app.MAX_RECOVERY_ATTEMPTS + 1
        assert one(url, "SELECT owner FROM durable.workflows WHERE workflow_id = %s", w) is None
    assert one(url, "SELECT recovery_attempts FROM durable.workflows WHERE workflow_id = 'x3'") == 1
