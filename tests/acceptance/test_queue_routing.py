"""Per-key rate limits and workers routed to queues, across real worker processes: no key
starts more than its rate in any period whichever process dequeues it, and a worker given
`--queues a` never runs an entry of queue b, not even one a SIGKILLed b-worker left
interrupted (the world table `route_runs` records every execution, cut short or not)."""

from __future__ import annotations

import datetime as dt
import signal
import time
from collections import Counter, defaultdict

import psycopg

import durable
from tests.acceptance.workers import scalar, start_worker, stop_worker, wait_for
from tests.apps import routes_app

APP = "tests.apps.routes_app"

Run = tuple[str, str, str | None, int, dt.datetime, dt.datetime | None]


def recorded_runs(url: str) -> list[Run]:
    """Every execution: (entry, queue, key, pid, started, finished or None)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT entry, queue, key, pid, started_at, finished_at FROM route_runs"
            " ORDER BY started_at, id"
        ).fetchall()
    return [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]


def test_a_per_key_rate_limit_holds_across_three_worker_processes(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    queue = routes_app.mail
    count, period = queue.partition_rate_limit or (0, 0.0)
    assert (count, period) == (2, 1.0)
    routes_app.setup(database_url)
    keys: dict[str, str | None] = {}
    with durable.Client(database_url) as client:
        # Two keys' backlogs first (in plain queue order they would start first), then one
        # entry of a third key, then two without a key.
        for key, n in (("k1", 5), ("k2", 5), ("k3", 1), (None, 2)):
            for i in range(n):
                entry = f"{key or 'none'}/{i}"
                keys[entry] = key
                client.enqueue(
                    queue, routes_app.job, entry, queue.name, key, 0.0,
                    workflow_id=entry, partition_key=key,
                )  # fmt: skip
        workers = [
            start_worker(subprocess_env, database_url, app=APP, concurrency=8) for _ in range(3)
        ]
        try:
            for entry in keys:
                assert client.retrieve(entry).result(timeout=120) == entry
        finally:
            for w in workers:
                stop_worker(w)

    runs = recorded_runs(database_url)
    assert Counter(r[0] for r in runs if r[5] is not None) == Counter(dict.fromkeys(keys, 1))
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, partition_key, dequeued_at FROM durable.workflows"
            " ORDER BY dequeued_at"
        ).fetchall()
    dequeued: dict[str | None, list[dt.datetime]] = defaultdict(list)
    for _, key, at in rows:
        dequeued[key].append(at)
    started: dict[str | None, list[dt.datetime]] = defaultdict(list)
    for _, _, key, _, at, _ in runs:
        started[key].append(at)
    window = dt.timedelta(seconds=period)
    for key in ("k1", "k2"):
        starts = dequeued[key]
        # Never more than `count` starts of one key in any period: the (count+1)-th is a
        # period after the first, by the database's records and by the runs' own clock
        # readings (give or take start-up).
        for i in range(len(starts) - count):
            assert starts[i + count] - starts[i] >= window, (key, starts)
            assert started[key][i + count] - started[key][i] >= window - dt.timedelta(seconds=0.5)
        # In every window that opens at a start, at most `count` starts.
        for at in starts:
            assert sum(at <= t < at + window for t in starts) <= count
    # The keys over their rate held back no one: the third key's entry and those without
    # a key started before the first key's third start (which waited a period; with eight
    # threads, the first dequeue took every entry the rates allowed).
    assert max(dequeued["k3"] + dequeued[None]) < dequeued["k1"][count]
    # Without a key, only the queue's limits (none here) apply: both started at once.
    assert len(dequeued[None]) == 2


def test_workers_routed_to_queues_never_run_the_other_queues_entries(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    routes_app.setup(database_url)
    entries: dict[str, str] = {}
    with durable.Client(database_url) as client:
        for queue in (routes_app.route_a, routes_app.route_b):
            for i in range(4):
                # The first entry of b is long, so that its worker is killed while it runs.
                seconds = 2.0 if (queue is routes_app.route_b and i == 0) else 0.1
                entry = f"{queue.name}/{i}"
                entries[entry] = queue.name
                client.enqueue(
                    queue, routes_app.job, entry, queue.name, None, seconds, workflow_id=entry
                )
        a_worker = start_worker(
            subprocess_env, database_url, app=APP, extra=["--queues", "routes.a"]
        )
        b_worker = start_worker(
            subprocess_env, database_url, app=APP, extra=["--queues", "routes.b"]
        )
        workers = [a_worker, b_worker]
        try:
            long_entry = "routes.b/0"

            def long_runs() -> list[tuple[int, dt.datetime | None]]:
                return [(r[3], r[5]) for r in recorded_runs(database_url) if r[0] == long_entry]

            wait_for(long_runs, what="the long b entry running")
            assert long_runs() == [(b_worker.pid, None)]  # in the b-worker
            epoch = scalar(
                database_url,
                "SELECT epoch FROM durable.workflows WHERE workflow_id = %s",
                long_entry,
            )
            b_worker.send_signal(signal.SIGKILL)
            assert b_worker.wait(timeout=30) == -signal.SIGKILL
            # More of b, now that only the a-worker runs.
            for i in range(4, 6):
                entry = f"routes.b/{i}"
                entries[entry] = "routes.b"
                client.enqueue(
                    routes_app.route_b, routes_app.job, entry, "routes.b", None, 0.1,
                    workflow_id=entry,
                )  # fmt: skip
            # The long entry's lease runs out (or is taken back at once: its process died
            # on this host) with the a-worker polling every 0.1 s: a worker of every queue
            # would recover it then, and dequeue the new entries; the a-worker leaves them.
            wait_for(
                lambda: scalar(
                    database_url,
                    "SELECT lease_expires_at < now() OR epoch <> %s FROM durable.workflows"
                    " WHERE workflow_id = %s",
                    epoch,
                    long_entry,
                ),
                what="the lease of the interrupted entry to run out",
            )
            time.sleep(1.0)
            assert [r[0] for r in recorded_runs(database_url)].count(long_entry) == 1
            with psycopg.connect(database_url) as conn:
                left = {
                    r[0]: (r[1], r[2])
                    for r in conn.execute(
                        "SELECT workflow_id, status, epoch FROM durable.workflows"
                        " WHERE workflow_id IN ('routes.b/0', 'routes.b/4', 'routes.b/5')"
                    ).fetchall()
                }
            assert left == {
                long_entry: ("RUNNING", epoch),
                "routes.b/4": ("ENQUEUED", 0),
                "routes.b/5": ("ENQUEUED", 0),
            }
            # A fresh b-worker recovers it, and runs the rest of b.
            fresh_b = start_worker(
                subprocess_env, database_url, app=APP, extra=["--queues", "routes.b"]
            )
            workers.append(fresh_b)
            for entry in entries:
                assert client.retrieve(entry).result(timeout=120) == entry
        finally:
            for w in workers:
                stop_worker(w)

    runs = recorded_runs(database_url)
    ran_in: dict[str, set[int]] = defaultdict(set)
    for entry, _, _, pid, _, _ in runs:
        ran_in[entries[entry]].add(pid)
    assert ran_in["routes.a"] == {a_worker.pid}
    assert ran_in["routes.b"] <= {b_worker.pid, fresh_b.pid}
    # The long entry: cut short by the SIGKILL in the first b-worker, finished in the fresh one.
    long_runs = [(pid, end) for entry, _, _, pid, _, end in runs if entry == long_entry]
    assert long_runs[0] == (b_worker.pid, None)
    assert long_runs[-1][0] == fresh_b.pid and long_runs[-1][1] is not None
    # Every entry finished; one that ran twice was interrupted by the SIGKILL (its step had
    # run, not yet journaled) and ran again in the fresh b-worker.
    assert {r[0] for r in runs if r[5] is not None} == set(entries)
    for entry, n in Counter(r[0] for r in runs).items():
        if n > 1:
            assert b_worker.pid in {r[3] for r in runs if r[0] == entry}, entry
