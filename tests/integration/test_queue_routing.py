"""Per-key rate limits (`durable.Queue(..., partition_rate_limit=(n, seconds))`) and engines
routed to named queues (`Engine(queues=[...])`, `durable worker --queues`), in one process
on a fake clock. (Across worker processes, with a SIGKILL: tests/acceptance/
test_queue_routing.py.)"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter

import psycopg
import pytest

import durable
from durable import errors

WORKER = [sys.executable, "-m", "durable.cli", "worker", "--app", "tests.apps.routes_app"]


def statuses(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT workflow_id, status FROM durable.workflows").fetchall())


def wait_until(predicate: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def run_keys_over_their_rate(url: str, period: float = 60.0, fake: bool = True) -> None:
    """Key a's backlog, two entries of b and one without a key, on a queue that starts at most
    two of one key per `period`: two of a start at once, and two more each period; b and
    the entry without a key are not held back. `fake`: the period passes on a fake clock
    (else it is waited for: on Citus, a count over every shard reads the nodes' clocks)."""
    reg = durable.Registry()
    mail = durable.Queue("mail", partition_rate_limit=(2, period), registry=reg)
    ran: Counter[str] = Counter()
    lock = threading.Lock()

    @durable.workflow(registry=reg, name="send")
    def send(entry: str) -> str:
        with lock:
            ran[entry] += 1
        return entry

    clock = durable.FakeClock() if fake else None

    def a_period_later() -> None:
        if clock is not None:
            clock.advance(period + 1)
        else:
            time.sleep(period)

    with durable.Client(url) as client:
        # Key a's backlog first: in plain queue order it would start first.
        for entry, key in [(f"a{i}", "a") for i in range(5)] + [
            ("b0", "b"),
            ("b1", "b"),
            ("n0", None),
        ]:
            client.enqueue(mail, send, entry, workflow_id=entry, partition_key=key)
    with durable.Engine(url, registry=reg, worker=True, poll_interval=0.02, clock=clock) as engine:
        # Two of a start; the rest of a is passed over, and b and the entry without a key
        # (only the queue's limits, none here) start behind it.
        for entry in ("a0", "a1", "b0", "b1", "n0"):
            assert engine.retrieve(entry).result(timeout=30) == entry
        assert {w: s for w, s in statuses(url).items() if s == "ENQUEUED"} == {
            "a2": "ENQUEUED",
            "a3": "ENQUEUED",
            "a4": "ENQUEUED",
        }
        a_period_later()  # two more of a
        for entry in ("a2", "a3"):
            assert engine.retrieve(entry).result(timeout=30) == entry
        assert statuses(url)["a4"] == "ENQUEUED"
        a_period_later()
        assert engine.retrieve("a4").result(timeout=30) == "a4"
    assert ran == Counter(dict.fromkeys(["a0", "a1", "a2", "a3", "a4", "b0", "b1", "n0"], 1))


@pytest.mark.parametrize("claims", ["skip-locked", "cas"])
def test_a_key_over_its_rate_is_passed_over_and_starts_a_period_later(
    database_url: str, claims: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_CLAIMS", claims)
    run_keys_over_their_rate(database_url)


def test_a_partition_rate_limit_is_checked_and_takes_partition_keys(database_url: str) -> None:
    reg = durable.Registry()
    for bad in ((0, 60), (2, 0), (2,), [2, 60], (2.5, 60), (True, 60), (2, float("inf")), 5):
        with pytest.raises(errors.ConfigurationError, match="partition_rate_limit"):
            durable.Queue("bad", partition_rate_limit=bad, registry=reg)  # type: ignore[arg-type]
    both = durable.Queue(
        "both", partition_concurrency=1, partition_rate_limit=(3, 1.5), registry=reg
    )
    params = both.dequeue_params(schema="durable", owner="me", lease_seconds=30.0, defs=[], limit=4)
    assert params["partition_concurrency"] == 1
    assert (params["partition_rate_count"], params["partition_rate_period"]) == (3, 1.5)
    plain = durable.Queue("plain", registry=reg)
    with pytest.raises(errors.ConfigurationError, match="partition_rate_limit=\\(N, seconds\\)"):
        plain.check_options(None, None, "user-1")


def run_routed_engines(url: str) -> None:
    """An engine given queues=["a"] runs a's entries and work from no queue, and leaves b's
    entries (enqueued first) to an engine given queues=["b"]."""
    reg = durable.Registry()
    qa = durable.Queue("a", registry=reg)
    qb = durable.Queue("b", registry=reg)
    ran: list[str] = []

    @durable.workflow(registry=reg, name="job")
    def job(entry: str) -> str:
        ran.append(entry)
        return entry

    with durable.Client(url) as client:
        # b's entries first: a worker of every queue would take them in its first round.
        for entry in ("b0", "b1"):
            client.enqueue(qb, job, entry, workflow_id=entry)
        for entry in ("a0", "a1"):
            client.enqueue(qa, job, entry, workflow_id=entry)
        # Work from no queue, that no one owns yet (a client's start).
        client.submit(job, "free", workflow_id="free")
    with durable.Engine(url, registry=reg, worker=True, poll_interval=0.02, queues=["a"]) as engine:
        assert engine.config.queues == ("a",)
        for entry in ("a0", "a1", "free"):
            assert engine.retrieve(entry).result(timeout=30) == entry
        assert statuses(url)["b0"] == statuses(url)["b1"] == "ENQUEUED"
    with durable.Engine(url, registry=reg, worker=True, poll_interval=0.02, queues=["b"]) as engine:
        for entry in ("b0", "b1"):
            assert engine.retrieve(entry).result(timeout=30) == entry
    assert sorted(ran) == ["a0", "a1", "b0", "b1", "free"]


def test_a_routed_engine_runs_its_queues_and_work_from_no_queue_only(database_url: str) -> None:
    run_routed_engines(database_url)


def test_an_unknown_queue_is_refused_before_anything_starts(database_url: str) -> None:
    reg = durable.Registry()
    durable.Queue("emails", registry=reg)
    engine = durable.Engine(database_url, registry=reg, queues=["emails", "emials"])
    with pytest.raises(errors.ConfigurationError, match=r"'emials'.*its queues: emails"):
        engine.launch()
    assert not engine.running
    # The command line says so too, and exits with an error (not a worker left idle).
    url = ["--database-url", database_url]
    for queues, code, said in (("nope", 1, "no queue named 'nope'"), (",", 2, "--queues")):
        done = subprocess.run(
            [*WORKER, "--queues", queues, *url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == code, done.stderr
        assert said in done.stderr
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM durable.executors").fetchone() == (0,)
