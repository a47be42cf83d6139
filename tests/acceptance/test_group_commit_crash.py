"""Sync-mode step records of workflows stepping at once share commits (a group commit across
workflows, see durable/_io/finishes.py). SIGKILL a worker right after a shared commit and before
any run sharing it has returned: every record in it is durable, so on recovery no step whose
record was committed runs again; effects still happen exactly once; and at most the one step
each workflow had in flight runs a second time (what sync mode always allowed)."""

from __future__ import annotations

import json
import signal
from collections import Counter

import psycopg

from tests.acceptance.workers import client, start_worker, stop_worker, world
from tests.apps import counter_app, vendor

N = 8
PURE = [i for i in range(50) if i not in counter_app.EFFECTS_AT]


def journaled_pure_steps(url: str) -> dict[str, set[int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, output FROM durable.steps WHERE step_name = 'counter.pure_step'"
        ).fetchall()
    out: dict[str, set[int]] = {}
    for wid, output in rows:
        out.setdefault(wid, set()).add(int(json.loads(output)))
    return out


def test_a_kill_after_a_shared_commit_reruns_no_committed_step(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        handles = [
            engine.submit(counter_app.fifty_sync, f"g{k}", workflow_id=f"g{k}") for k in range(N)
        ]
        # The 3rd commit shared by more than one run's record: by then every run is stepping.
        first = start_worker(
            subprocess_env, database_url, crash="after_group_commit:3", concurrency=N
        )
        assert first.wait(timeout=60) == -signal.SIGKILL
        committed = journaled_pure_steps(database_url)
        assert sum(len(s) for s in committed.values()) >= 2
        second = start_worker(subprocess_env, database_url, concurrency=N)
        try:
            for h in handles:
                assert h.result(timeout=90) == sum(range(50))
        finally:
            stop_worker(second)
    # Effects: exactly once each, in every workflow.
    assert sorted(vendor.moved(database_url)) == sorted(list(counter_app.EFFECTS_AT) * N)
    for k in range(N):
        wid = f"g{k}"
        runs = Counter(what for _, what, _ in world(database_url, wid))
        assert set(runs) == {f"p{i}" for i in PURE}
        rerun = [int(w[1:]) for w, n in runs.items() if n > 1]
        assert all(n <= 2 for n in runs.values())
        # No step whose record was committed (the shared commit included) ran again.
        assert not set(rerun) & committed.get(wid, set())
        assert len(rerun) <= 1  # the one step in flight at the kill, if any
