"""Claims without row locks (compare-and-set), as on a Citus-distributed schema: two
workers claiming the same backlog at once run each workflow exactly once, and a queue's
entries are dequeued once each, within its limit."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import durable


def test_two_workers_claiming_by_compare_and_set_run_everything_once(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_CLAIMS", "cas")
    reg = durable.Registry()
    queue = durable.Queue("cas-q", concurrency=3, registry=reg)
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    @durable.step(registry=reg, name="touch")
    def touch(key: str) -> str:
        with lock:
            runs[key] += 1
        return key

    @durable.workflow(registry=reg, name="one")
    def one(key: str) -> str:
        return touch(key)

    with durable.Client(database_url) as client:
        for i in range(120):
            client.submit(one, f"w{i}", workflow_id=f"w{i}")
        for i in range(30):
            client.enqueue(queue, one, f"q{i}", workflow_id=f"q{i}")
    workers = [
        durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.02, max_workers=4)
        for _ in range(2)
    ]
    with workers[0] as a, workers[1] as b:
        assert a.client.db.cas_claims and b.client.db.cas_claims
        for i in range(120):
            assert a.retrieve(f"w{i}").result(timeout=60) == f"w{i}"
        for i in range(30):
            assert a.retrieve(f"q{i}").result(timeout=60) == f"q{i}"
    assert runs == Counter({f"w{i}": 1 for i in range(120)} | {f"q{i}": 1 for i in range(30)})


def test_an_unknown_claim_mode_is_refused(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_CLAIMS", "optimistic")
    with pytest.raises(durable.errors.ConfigurationError, match="DURABLE_CLAIMS"):
        durable.Client(database_url).connect()


def test_a_compare_and_set_claim_does_not_take_a_workflow_moved_to_another_version(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator moves a PENDING workflow to version 2 while a version-1 worker's claim
    has already picked it: the claim's compare-and-set sees the move and leaves it."""
    import psycopg

    monkeypatch.setenv("DURABLE_CLAIMS", "cas")
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="moved", version="1")
    def moved() -> str:
        return "v1"

    with durable.Client(database_url) as client:
        client.submit(moved, workflow_id="m")
    engine = durable.Engine(database_url, registry=reg)  # not a worker: claims only when asked
    with engine, psycopg.connect(database_url) as operator:
        # The move holds the row, uncommitted, while the claim reads the old version...
        operator.execute("UPDATE durable.workflows SET version = '2' WHERE workflow_id = 'm'")
        claimed: list[object] = []
        claim = threading.Thread(target=lambda: claimed.extend(engine.recover()))
        claim.start()
        claim.join(timeout=1.0)
        assert claim.is_alive()  # waiting for the operator's row lock
        operator.commit()  # ...and commits: the claim must see version 2 and leave it
        claim.join(timeout=10)
        assert claimed == []
        assert engine.get_workflow("m").status is durable.WorkflowStatus.PENDING
        assert engine.get_workflow("m").version == "2"
