"""Queue partitions across real worker processes: three workers, three partitions, one
worker SIGKILLed while it holds slots, a fresh worker started in its place. At no moment
do more than the partition limit of one partition's entries run, nor more than the
queue's limit in all, and every entry finishes exactly once (the world table
`partition_runs` records every execution, cut short or not)."""

from __future__ import annotations

import datetime as dt
import signal
from collections import Counter, defaultdict

import psycopg

import durable
from tests.acceptance.workers import scalar, start_worker, stop_worker, wait_for
from tests.apps import partitions_app

APP = "tests.apps.partitions_app"
PARTITIONS = ("tenant-a", "tenant-b", "tenant-c")
PER_PARTITION = 8

Run = tuple[str, str, int, dt.datetime, dt.datetime | None]


def recorded_runs(url: str) -> list[Run]:
    """Every execution: (entry, partition, pid, started, finished or None)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT entry, partition, pid, started_at, finished_at FROM partition_runs"
            " ORDER BY started_at, id"
        ).fetchall()
    return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]


def running(url: str, pid: int | None, but: int | None = None) -> list[str]:
    """The entries whose run is in progress in process `pid` (any, but `but`)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT entry FROM partition_runs WHERE finished_at IS NULL"
            " AND (%(pid)s::int IS NULL OR pid = %(pid)s::int)"
            " AND (%(but)s::int IS NULL OR pid <> %(but)s::int) ORDER BY entry",
            {"pid": pid, "but": but},
        ).fetchall()
    return [r[0] for r in rows]


def most_at_once(intervals: list[tuple[dt.datetime, dt.datetime]]) -> int:
    """The largest number of intervals open at one instant (an end before a start at the
    same instant)."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = best = 0
    for _, delta in edges:
        now += delta
        best = max(best, now)
    return best


def test_partition_and_queue_limits_hold_across_workers_and_a_sigkill(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    queue = partitions_app.tenants
    assert queue.concurrency == 5 and queue.partition_concurrency == 2
    partitions_app.setup(database_url)
    entries: dict[str, str] = {}
    with durable.Client(database_url) as client:
        # One partition's backlog first: in plain queue order it would take every slot. The
        # first three entries of each partition are long (so that the first worker is
        # mid-run when it is killed, however slowly the others start).
        for partition in PARTITIONS:
            for i in range(PER_PARTITION):
                entry = f"{partition}/{i}"
                entries[entry] = partition
                client.enqueue(
                    queue,
                    partitions_app.job,
                    entry,
                    partition,
                    4.0 if i < 3 else 0.5,
                    workflow_id=entry,
                    partition_key=partition,
                )
        # The first worker takes four entries at once (two of tenant-a, its limit, then two
        # of tenant-b); the two others start while it runs them; once they run entries too,
        # the first is SIGKILLed mid-run, its entries holding their partitions' slots.
        doomed = start_worker(subprocess_env, database_url, app=APP, concurrency=4)
        workers = [doomed]
        try:
            wait_for(lambda: len(running(database_url, doomed.pid)) == 4, what="four runs")
            assert running(database_url, doomed.pid) == [
                "tenant-a/0",
                "tenant-a/1",
                "tenant-b/0",
                "tenant-b/1",
            ]
            workers += [
                start_worker(subprocess_env, database_url, app=APP, concurrency=4) for _ in range(2)
            ]
            wait_for(
                lambda: (
                    running(database_url, None, but=doomed.pid)
                    and running(database_url, doomed.pid)
                ),
                what="runs in all processes",
            )
            doomed.send_signal(signal.SIGKILL)
            assert doomed.wait(timeout=30) == -signal.SIGKILL
            died_at = scalar(database_url, "SELECT clock_timestamp()")
            assert isinstance(died_at, dt.datetime)
            # A fresh worker in its place; the entries it held are run again, to their end.
            workers.append(start_worker(subprocess_env, database_url, app=APP, concurrency=4))
            for entry in entries:
                assert client.retrieve(entry).result(timeout=180) == entry
        finally:
            for w in workers:
                stop_worker(w)

    runs = recorded_runs(database_url)
    # Every entry finished exactly once; a run without an end is one the SIGKILL cut short,
    # in the killed process, and its entry ran again (to its end) elsewhere.
    finished = Counter(entry for entry, _, _, _, end in runs if end is not None)
    assert finished == Counter(dict.fromkeys(entries, 1))
    cut_short = sorted(entry for entry, _, _, _, end in runs if end is None)
    assert cut_short and {pid for _, _, pid, _, end in runs if end is None} == {doomed.pid}
    # Nothing ran again once it had finished: an entry's finished run is its last.
    last_run = {entry: end for entry, _, _, _, end in runs}  # by start order
    assert all(end is not None for end in last_run.values())
    # The killed worker's entries were recovered (claimed again once its leases lapsed).
    with psycopg.connect(database_url) as conn:
        recovered = conn.execute(
            "SELECT workflow_id FROM durable.workflows WHERE recovery_attempts > 0"
        ).fetchall()
    assert set(cut_short) <= {r[0] for r in recovered}
    assert (
        scalar(database_url, "SELECT count(*) FROM durable.workflows WHERE status <> 'SUCCESS'")
        == 0
    )

    # At no moment more than two of one partition ran, nor more than five in all (a run cut
    # short ended when its process died, at the latest).
    intervals: dict[str, list[tuple[dt.datetime, dt.datetime]]] = defaultdict(list)
    for _, partition, _, start, end in runs:
        span = (start, end if end is not None else died_at)
        intervals[partition].append(span)
        intervals["*"].append(span)
    most = {key: most_at_once(spans) for key, spans in intervals.items()}
    assert all(most[p] <= 2 for p in PARTITIONS), most
    assert most["*"] <= 5, most
    # The partition limit is what held them: some partition did run two at once.
    assert max(most[p] for p in PARTITIONS) == 2, most
