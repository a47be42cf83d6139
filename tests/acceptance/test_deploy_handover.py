"""A routine deploy: `durable worker` stopped with SIGTERM while its workflows are in the
middle of their steps, and a new worker started beside it. Each run is handed over at its
next step boundary, after the step under way is recorded: no step that finished within
the grace runs again on the new worker (the world records every call)."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.acceptance.workers import (
    client,
    scalar,
    start_worker,
    stop_worker,
    wait_for,
    world,
)
from tests.apps import counter_app

STEPS = 40  # of 0.25 s each: far longer than the grace, so every run is stopped mid-way
SECONDS = 0.25
GRACE = 5.0
# Long enough that no lease runs out during the test: a takeover is only by hand-over.
LEASE = 30.0


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_hands_each_run_over_at_a_step_boundary(
    database_url: str, subprocess_env: dict[str, str], processes: int
) -> None:
    extra = ["--processes", str(processes)] if processes > 1 else []
    ids = [f"d{k}" for k in range(6)]
    with client(database_url) as engine:
        handles = [
            # Sync and `async def` workflows: both drivers stop at the boundary.
            engine.submit(
                counter_app.slow if k % 3 else counter_app.slow_async,
                wid,
                STEPS,
                SECONDS,
                workflow_id=wid,
            )
            for k, wid in enumerate(ids)
        ]
        old = start_worker(
            subprocess_env,
            database_url,
            lease=LEASE,
            concurrency=6,
            grace=GRACE,
            extra=extra,
        )
        new = None
        try:
            # Every workflow is running on the old worker, a few steps in.
            wait_for(
                lambda: all(len(world(database_url, wid)) >= 2 for wid in ids),
                what="every workflow to be under way",
            )
            old_pids = {pid for _, _, pid in world(database_url)}
            old.send_signal(signal.SIGTERM)
            new = start_worker(
                subprocess_env,
                database_url,
                lease=LEASE,
                concurrency=6,
                extra=extra,
            )
            for handle in handles:
                assert handle.result(timeout=120) == [f"s{i}" for i in range(STEPS)]
            assert old.wait(timeout=60) == 0
        finally:
            stop_worker(old)
            if new is not None:
                stop_worker(new)
    rows = world(database_url)
    runs = Counter((wid, what) for wid, what, _ in rows)
    twice = sorted(key for key, n in runs.items() if n > 1)
    assert twice == []  # no step's side effect happened twice
    assert len(runs) == len(ids) * STEPS
    # Handed over, not recovered from an expired lease: no recovery attempt was counted.
    assert scalar(database_url, "SELECT max(recovery_attempts) FROM durable.workflows") == 0
    for wid in ids:
        # Each was started by the old worker and finished by the new one.
        pids = {pid for w, _, pid in rows if w == wid}
        assert pids & old_pids and pids - old_pids
