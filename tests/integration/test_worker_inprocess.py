from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

import durable
from durable import errors


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args], capture_output=True, text=True, timeout=60
    )


def make_app() -> tuple[durable.Registry, object, list[int], threading.Event]:
    reg = durable.Registry()
    runs: list[int] = []
    gate = threading.Event()

    @durable.step(registry=reg, name="tick")
    def tick(i: int) -> int:
        runs.append(i)
        if i == 2:
            gate.wait(10)
        return i

    @durable.workflow(registry=reg, name="ticker", version="v1")
    def ticker(n: int) -> int:
        return sum(tick(i) for i in range(n))

    return reg, ticker, runs, gate


def test_worker_runs_submitted_workflows(database_url: str) -> None:
    reg, ticker, _runs, gate = make_app()
    gate.set()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handles = [engine.submit(ticker, 4, workflow_id=f"t{i}") for i in range(5)]
        assert [h.result(timeout=20) for h in handles] == [6] * 5


def test_other_version_waits_for_a_worker(database_url: str) -> None:
    reg, ticker, _runs, gate = make_app()
    other = durable.Registry()

    @durable.workflow(registry=other, name="ticker", version="v2")
    def ticker_v2(n: int) -> int:
        return -1

    gate.set()
    with durable.Engine(database_url, registry=reg) as client:
        handle = client.submit(ticker, 3, workflow_id="needs-v1")
    with durable.Engine(database_url, registry=other, worker=True, poll_interval=0.05) as w2:
        time.sleep(0.5)
        assert w2.retrieve("needs-v1").status() == "PENDING"  # never run by the wrong code
        listed = cli("executors", "list", "--database-url", database_url, "--json")
        assert "needs-v1" in listed.stdout
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as w1:
        assert w1.retrieve(handle.workflow_id).result(timeout=20) == 3


def test_cancel_stops_the_runner_at_its_next_step_and_fork_reuses_steps(
    database_url: str,
) -> None:
    reg, ticker, runs, gate = make_app()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.submit(ticker, 5, workflow_id="c1")
        deadline = time.monotonic() + 10
        while 2 not in runs and time.monotonic() < deadline:
            time.sleep(0.01)
        out = cli("workflows", "cancel", "c1", "--database-url", database_url)
        assert out.returncode == 0, out.stderr
        assert "cancel requested" in out.stdout
        # The runner's poll sees the request.
        time.sleep(3 * engine._services.heartbeat.cancel_poll_interval)
        gate.set()
        with pytest.raises(errors.WorkflowCancelledError, match="command line"):
            handle.result(timeout=10)
        # Cooperative: the step in flight finished and was journaled; no later step started.
        assert runs == [0, 1, 2]
        assert [s.step_seq for s in engine.steps("c1")] == [0, 1, 2]
        assert engine.retrieve("c1").status() == "CANCELLED"

        again = cli("workflows", "cancel", "c1", "--database-url", database_url)
        assert again.returncode == 1 and "already finished" in again.stderr

        runs.clear()
        forked = cli(
            "workflows",
            "fork",
            "c1",
            "--from-step",
            "1",
            "--new-id",
            "c1-fork",
            "--database-url",
            database_url,
        )
        assert forked.returncode == 0, forked.stderr
        assert engine.retrieve("c1-fork").result(timeout=20) == 10
        assert runs == [1, 2, 3, 4]  # step 0 came from the journal

        resumed = cli("workflows", "resume", "c1", "--database-url", database_url)
        assert resumed.returncode == 0, resumed.stderr
        assert engine.retrieve("c1").result(timeout=20) == 10


def test_enqueue_inside_a_workflow_is_journaled_and_not_repeated_on_replay(
    database_url: str,
) -> None:
    reg = durable.Registry()
    queue = durable.Queue("children", concurrency=1, registry=reg)

    @durable.workflow(registry=reg, name="child")
    def child(x: int) -> int:
        return x * 2

    @durable.workflow(registry=reg, name="parent")
    def parent() -> str:
        handle = queue.enqueue(child, 21)
        durable.recv("go", timeout=60)  # suspends: the body runs again from the top
        return handle.workflow_id

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(parent, workflow_id="p")
        deadline = time.monotonic() + 20
        while handle.status() != "SUSPENDED" and time.monotonic() < deadline:
            time.sleep(0.02)
        engine.send("p", "now", topic="go")
        child_id = handle.result(timeout=20)
        assert engine.retrieve(child_id).result(timeout=20) == 42
        children = engine.list_workflows(name="child")
        assert [c.workflow_id for c in children] == [child_id]  # queued once, not per replay
        assert engine.steps("p")[0].kind == "child"


def test_timeout_cancels_at_the_next_step_and_bad_timeouts_are_refused(
    database_url: str,
) -> None:
    reg = durable.Registry()
    ran: list[int] = []

    @durable.step(registry=reg, name="slow")
    def slow(i: int) -> int:
        ran.append(i)
        time.sleep(0.2)
        return i

    @durable.workflow(registry=reg, name="bounded", timeout=1.0)
    def bounded(n: int) -> int:
        return sum(slow(i) for i in range(n))

    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(errors.WorkflowTimeoutError, match=r"after 1\.0 s") as caught:
            engine.start(bounded, 30, workflow_id="b").result(timeout=20)
        assert isinstance(caught.value, errors.WorkflowCancelledError)
        assert 3 <= len(ran) <= 7  # about one second of 0.2 s steps, then no more
        assert len(engine.steps("b")) == len(ran)
        assert engine.retrieve("b").status() == "CANCELLED"
    for bad in (0, -5, "soon", float("nan")):
        with pytest.raises(errors.DefinitionError, match="positive number of seconds"):
            durable.workflow(registry=reg, name=f"bad-{bad}", timeout=bad)  # type: ignore[arg-type]
    assert reg.get_workflow("bad-0") is None


def test_notify_wakes_a_waiting_workflow_without_polling_also_after_reconnect(
    database_url: str,
) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="inbox")
    def inbox(n: int) -> list[str]:
        return [durable.recv("mail") for _ in range(n)]

    import psycopg

    # A poll every 10 minutes: only a notification can wake the worker within the test.
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=600) as engine:
        handle = engine.start(inbox, 2, workflow_id="inbox")
        deadline = time.monotonic() + 20
        while handle.status() != "SUSPENDED" and time.monotonic() < deadline:
            time.sleep(0.02)
        engine.send("inbox", "first", topic="mail")
        while len(engine.steps("inbox")) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [s.kind for s in engine.steps("inbox")] == ["recv"]
        while handle.status() != "SUSPENDED" and time.monotonic() < deadline:
            time.sleep(0.02)
        # Cut the LISTEN connection: the worker must listen again, or this send is missed.
        with psycopg.connect(database_url, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query ILIKE 'LISTEN%%') AS t"
            ).fetchone()
        assert killed == (1,)
        time.sleep(1.0)  # the listener notices and reconnects (with backoff)
        engine.send("inbox", "second", topic="mail")
        assert handle.result(timeout=15) == ["first", "second"]


def test_a_freed_slot_takes_the_next_queue_entry_without_waiting_for_a_poll(
    database_url: str,
) -> None:
    """A worker whose slots are all busy with queue entries, with more entries waiting,
    dequeues the next one as soon as one ends, not at its next poll (30 s here: the six
    entries, two at a time, would take a minute or more)."""
    reg = durable.Registry()
    backlog = durable.Queue("backlog", registry=reg)

    @durable.step(registry=reg, name="nap")
    def nap(i: int) -> int:
        time.sleep(0.05)
        return i

    @durable.workflow(registry=reg, name="napper")
    def napper(i: int) -> int:
        return nap(i)

    with durable.Client(database_url, migrate=True) as client:
        for i in range(6):
            client.enqueue(backlog, napper, i, workflow_id=f"entry-{i}")
    with durable.Engine(
        database_url, registry=reg, worker=True, max_workers=2, poll_interval=30.0
    ) as engine:
        results = [engine.retrieve(f"entry-{i}").result(timeout=20) for i in range(6)]
    assert results == list(range(6))


def test_a_queue_backlog_drains_without_a_claim_round_per_entry(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a queue's backlog drains, each ended entry dequeues the next one; a round of
    claims of other work (interrupted runs, woken sleepers: two statements and their
    Python, finding nothing here) runs once per poll interval, not once per entry."""
    from durable._host.claims import Claims

    rounds: list[int] = []
    claim_round = Claims.round

    def counted(self: Claims, *args: Any, **kwargs: Any) -> Any:
        rounds.append(1)
        return claim_round(self, *args, **kwargs)

    monkeypatch.setattr(Claims, "round", counted)
    reg = durable.Registry()
    backlog = durable.Queue("backlog", registry=reg)

    @durable.step(registry=reg, name="nap")
    def nap(i: int) -> int:
        time.sleep(0.02)
        return i

    @durable.workflow(registry=reg, name="napper")
    def napper(i: int) -> int:
        return nap(i)

    with durable.Client(database_url, migrate=True) as client:
        for i in range(12):
            client.enqueue(backlog, napper, i, workflow_id=f"entry-{i}")
    with durable.Engine(
        database_url, registry=reg, worker=True, max_workers=2, poll_interval=30.0
    ) as engine:
        results = [engine.retrieve(f"entry-{i}").result(timeout=20) for i in range(12)]
    assert results == list(range(12))
    assert len(rounds) <= 3, len(rounds)  # (12 entries, 2 at a time: 6 or more without)


def test_a_claim_the_worker_never_heard_back_about_expires_and_runs(database_url: str) -> None:
    # A claim that committed on the server while the answer was lost (the connection died
    # with it, as in a failover) leaves a row owned by this worker that no thread runs.
    # The heartbeat must not keep it alive: its lease expires and a worker recovers it.
    reg, ticker, runs, gate = make_app()
    gate.set()
    with durable.Engine(database_url, registry=reg) as client:
        client.submit(ticker, 3, workflow_id="orphan")
    # Held by nobody the worker could take it from until the test hands it over (else the
    # worker may claim it first, and the hand-over below would fence its run).
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable.workflows SET status = 'RUNNING', owner = 'elsewhere',"
            " lease_expires_at = now() + interval '1 hour' WHERE workflow_id = 'orphan'"
        )
    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.05, lease_seconds=1.0
    ) as worker:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE durable.workflows SET status = 'RUNNING', owner = %s, epoch = epoch + 1,"
                " lease_expires_at = now() + interval '1 second' WHERE workflow_id = 'orphan'",
                [worker.executor_id],
            )
        assert worker.retrieve("orphan").result(timeout=20) == 3
    assert sorted(runs) == [0, 1, 2]


def outage(engine: durable.Engine, url: str) -> None:
    """A real, short outage of the system database as this engine sees it: the server
    drops every connection of the engine's, the engine notices, and reconnects."""
    before = engine.client.db.outage.generation
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    deadline = time.monotonic() + 20
    while engine.client.db.outage.generation == before:
        assert time.monotonic() < deadline, "the engine never saw the outage end"
        try:
            engine.list_workflows()
        except errors.DatabaseUnavailableError:
            time.sleep(0.05)


def claim_submitted(engine: durable.Engine, ticker: Any, workflow_id: str) -> Any:
    """Submit a three-tick workflow and claim it by hand, as the worker loop would."""
    engine.submit(ticker, 3, workflow_id=workflow_id)
    claimed = engine.runner.claim(workflow_id)
    assert claimed is not None
    return claimed


def take_over(url: str, workflow_id: str) -> None:
    """Another worker claims the workflow (its epoch moves on)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable.workflows SET epoch = epoch + 1, owner = 'other-worker',"
            " lease_expires_at = now() + interval '1 minute' WHERE workflow_id = %s",
            [workflow_id],
        )


@pytest.mark.parametrize("stolen", [True, False])
def test_a_claim_that_waited_through_an_outage_runs_only_if_still_owned(
    database_url: str, stolen: bool
) -> None:
    # A claim queued behind busy threads (or blocked on a connection) while the database
    # was down was not renewed: it may have expired and been taken, even finished, by
    # another worker. Started late, it must not run its first step's code again as a
    # zombie; one still owned runs as usual.
    reg, ticker, runs, gate = make_app()
    gate.set()
    with durable.Engine(database_url, registry=reg, lease_seconds=4.0) as engine:
        claimed = claim_submitted(engine, ticker, "queued")
        assert claimed.doubts == engine.client.db.outage.doubts
        if stolen:
            take_over(database_url, "queued")
        outage(engine, database_url)
        future = engine.runner.submit(claimed)
        if stolen:
            assert future.result(timeout=20) is None
            assert runs == []
            info = engine.get_workflow("queued")
            assert (info.status, info.owner) == ("RUNNING", "other-worker")
        else:
            assert future.result(timeout=20) == "3"  # the text of its stored output
            assert runs == [0, 1, 2]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_claim_whose_lease_ran_out_untaken_in_an_outage_is_renewed_before_it_runs(
    database_url: str, asynchronous: bool
) -> None:
    # Nobody took it while the database was down: it is still this worker's, but a lease
    # in the past would let another worker take it while it runs. It is renewed first.
    reg = durable.Registry()

    def lease_left(workflow_id: str) -> float:
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM lease_expires_at - now())::float"
                " FROM durable.workflows WHERE workflow_id = %s",
                [workflow_id],
            ).fetchone()
        assert row is not None
        return float(row[0])

    if asynchronous:

        @durable.step(registry=reg, name="lease_left")
        async def lease_left_async(workflow_id: str) -> float:
            return lease_left(workflow_id)

        @durable.workflow(registry=reg, name="leased")
        async def leased_async() -> float:
            return await lease_left_async("late")

        leased: object = leased_async
    else:
        step = durable.step(registry=reg, name="lease_left")(lease_left)

        @durable.workflow(registry=reg, name="leased")
        def leased_sync() -> float:
            return step("late")

        leased = leased_sync

    with durable.Engine(database_url, registry=reg, lease_seconds=4.0) as engine:
        engine.submit(leased, workflow_id="late")  # type: ignore[arg-type]
        claimed = engine.runner.claim("late")
        assert claimed is not None
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE durable.workflows SET lease_expires_at = now() - interval '1 second'"
                " WHERE workflow_id = 'late'"
            )
        outage(engine, database_url)
        # (the future holds the text of the stored output)
        assert float(engine.runner.submit(claimed).result(timeout=20)) > 2.0


def test_a_claim_that_waited_longer_than_its_lease_without_renewal_is_proven_first(
    database_url: str,
) -> None:
    # No outage: the heartbeat was starved (or the claim sat in the queue past its lease
    # before a renewal covered it), the lease ran out and another worker took the
    # workflow. The late run must not run its first step as a zombie.
    reg, ticker, runs, gate = make_app()
    gate.set()
    # A long lease keeps the heartbeat from renewing anything while the test runs.
    with durable.Engine(database_url, registry=reg, lease_seconds=30.0) as engine:
        claimed = claim_submitted(engine, ticker, "starved")
        take_over(database_url, "starved")
        engine.client.db.outage.renewed_at = (
            0.0  # no renewal since (what a starved heartbeat leaves)
        )
        late = claimed._replace(claimed_at=claimed.claimed_at - 30.0)
        assert engine.runner.submit(late).result(timeout=20) is None
        assert runs == []
