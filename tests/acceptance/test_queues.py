"""Queues across real worker processes: limits hold for all of them at once."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

import durable
from durable import errors
from tests.acceptance.workers import client, scalar, start_worker, stop_worker
from tests.apps import counter_app


def runs(url: str) -> list[tuple[str, dt.datetime, dt.datetime]]:
    """Every entry's run as the workflows recorded it: (id, started, finished)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, started_at, finished_at FROM queue_runs ORDER BY started_at"
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def most_at_once(intervals: list[tuple[str, dt.datetime, dt.datetime]]) -> int:
    """The largest number of runs in progress at one instant (a sweep over the intervals)."""
    edges = [(start, 1) for _, start, _ in intervals] + [(end, -1) for _, _, end in intervals]
    edges.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    now = best = 0
    for _, delta in edges:
        now += delta
        best = max(best, now)
    return best


def test_concurrency_two_holds_across_three_worker_processes(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        ids = [f"q{i}" for i in range(10)]
        handles = [
            engine.enqueue(counter_app.limited, counter_app.queued, i, 0.4, workflow_id=i)
            for i in ids
        ]
        assert {h.status() for h in handles} == {"ENQUEUED"}
        workers = [start_worker(subprocess_env, database_url, concurrency=4) for _ in range(3)]
        try:
            assert sorted(h.result(timeout=120) for h in handles) == sorted(ids)
        finally:
            for w in workers:
                stop_worker(w)
    recorded = runs(database_url)
    assert sorted(r[0] for r in recorded) == sorted(ids)  # each entry ran exactly once
    # Twelve slots were free; the queue allowed two, and used them.
    assert most_at_once(recorded) == 2


def test_rate_limit_holds_across_three_worker_processes(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    count, period = counter_app.throttled.rate_limit or (0, 0.0)
    with client(database_url) as engine:
        handles = [
            engine.enqueue(counter_app.throttled, counter_app.queued, f"r{i}", 0.0)
            for i in range(9)
        ]
        workers = [start_worker(subprocess_env, database_url) for _ in range(3)]
        try:
            for h in handles:
                h.result(timeout=120)
        finally:
            for w in workers:
                stop_worker(w)
    with psycopg.connect(database_url) as conn:
        dequeued = [
            r[0]
            for r in conn.execute(
                "SELECT dequeued_at FROM durable.workflows ORDER BY dequeued_at"
            ).fetchall()
        ]
    started = sorted(r[1] for r in runs(database_url))
    assert len(started) == 9
    window = dt.timedelta(seconds=period)
    for i in range(len(dequeued) - count):
        # Never more than `count` starts in any `period`: the (count+1)-th is a period later.
        assert dequeued[i + count] - dequeued[i] >= window
        # The runs themselves (their own clock readings) agree, give or take start-up.
        assert started[i + count] - started[i] >= window - dt.timedelta(seconds=0.3)
    # Three batches of three (the runs' own clock readings, give or take start-up).
    assert started[-1] - started[0] >= 2 * window - dt.timedelta(seconds=0.3)


def test_priority_dedup_and_delay(database_url: str, subprocess_env: dict[str, str]) -> None:
    with client(database_url) as engine:
        for name, priority in [("p5", 5), ("p1", 1), ("p3", 3), ("p0", 0)]:
            engine.enqueue(
                counter_app.ranked,
                counter_app.queued,
                name,
                0.05,
                workflow_id=name,
                priority=priority,
            )
        first = engine.enqueue(
            counter_app.limited, counter_app.queued, "d1", 0.0, dedup_key="report-42"
        )
        with pytest.raises(errors.QueueDedupError) as caught:
            engine.enqueue(
                counter_app.limited, counter_app.queued, "d2", 0.0, dedup_key="report-42"
            )
        assert caught.value.workflow_id == first.workflow_id
        assert "another key" in str(caught.value)
        late = engine.enqueue(
            counter_app.limited, counter_app.queued, "late", 0.0, workflow_id="late", delay=1.5
        )
        enqueued_at = scalar(
            database_url, "SELECT created_at FROM durable.workflows WHERE workflow_id = 'late'"
        )
        worker = start_worker(subprocess_env, database_url, concurrency=4)
        try:
            first.result(timeout=60)
            # Finished, the key is free again.
            again = engine.enqueue(
                counter_app.limited, counter_app.queued, "d3", 0.0, dedup_key="report-42"
            )
            again.result(timeout=60)
            late.result(timeout=60)
            for name in ["p0", "p1", "p3", "p5"]:
                engine.retrieve(name).result(timeout=60)
        finally:
            stop_worker(worker)
    order = [r[0] for r in runs(database_url) if r[0].startswith("p")]
    assert order == ["p0", "p1", "p3", "p5"]  # lowest priority number first
    late_start = scalar(
        database_url, "SELECT started_at FROM queue_runs WHERE workflow_id = 'late'"
    )
    assert isinstance(late_start, dt.datetime) and isinstance(enqueued_at, dt.datetime)
    assert late_start - enqueued_at >= dt.timedelta(seconds=1.5)
    assert scalar(database_url, "SELECT count(*) FROM queue_runs WHERE workflow_id = 'd2'") == 0


def test_bad_queue_input_is_refused_and_stores_nothing(database_url: str) -> None:
    with client(database_url) as engine:
        with pytest.raises(errors.ConfigurationError, match="priority=True"):
            engine.enqueue(counter_app.limited, counter_app.queued, "x", 0.0, priority=1)
        with pytest.raises(errors.InvalidWaitError, match="zero or more"):
            engine.enqueue(counter_app.limited, counter_app.queued, "x", 0.0, delay=-1)
        with pytest.raises(errors.ConfigurationError, match="rate_limit"):
            durable.Queue("bad", rate_limit=(0, 60), registry=counter_app.registry)
        with pytest.raises(errors.ConfigurationError, match="concurrency"):
            durable.Queue("bad", concurrency=0, registry=counter_app.registry)
        with pytest.raises(errors.DuplicateNameError):
            durable.Queue("counter.limited", registry=counter_app.registry)
        assert engine.list_workflows() == []
