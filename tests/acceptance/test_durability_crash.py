"""SIGKILL a 50-step workflow with effects in it, recover in a fresh worker, and check the
documented promise of the modes whose records a process holds in memory (async and exit):

- effects happen exactly once in every mode;
- sync: no journaled step runs again;
- async and exit: only pure steps after the last barrier (effect) before the crash run again.

The whole matrix (every mode, both drivers, kills before, between and after the effects)
dies in one process: tests/integration/test_crash_inprocess.py.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.acceptance.workers import client, start_worker, stop_worker, world
from tests.apps import counter_app, vendor

WORKFLOWS = {
    "sync": counter_app.fifty_sync,
    "async": counter_app.fifty_async,
    "exit": counter_app.fifty_exit,
}
PURE = [i for i in range(50) if i not in counter_app.EFFECTS_AT]


# kill_after: the n-th pure step to complete; 19 lies between the first and second effects,
# where every mode has a barrier behind it.
CELLS = [("sync", 19)]


@pytest.mark.parametrize(("driver", "kill_after"), CELLS)
@pytest.mark.parametrize("mode", ["async", "exit"])
def test_crash_costs_only_what_the_mode_promises(
    database_url: str, subprocess_env: dict[str, str], mode: str, kill_after: int, driver: str
) -> None:
    with client(database_url) as engine:
        workflow = counter_app.pick(WORKFLOWS[mode], driver)
        handle = engine.submit(workflow, "w", workflow_id="w")
        first = start_worker(subprocess_env, database_url, crash=f"after_step_record:{kill_after}")
        assert first.wait(timeout=60) == -signal.SIGKILL
        second = start_worker(subprocess_env, database_url)
        try:
            assert handle.result(timeout=60) == sum(range(50))
        finally:
            stop_worker(second)
        assert engine.get_workflow("w").durability == mode
    # Effects: exactly once each, whatever the mode.
    assert vendor.moved(database_url) == list(counter_app.EFFECTS_AT)
    runs = Counter(what for _, what, _ in world(database_url, "w"))
    assert set(runs) == {f"p{i}" for i in PURE}  # every pure step ran
    rerun = sorted(int(w[1:]) for w, n in runs.items() if n > 1)
    assert all(n <= 2 for n in runs.values())
    crashed_at = PURE[kill_after - 1]
    last_barrier = max((e for e in counter_app.EFFECTS_AT if e < crashed_at), default=-1)
    if mode == "sync":
        assert rerun == []
    else:
        window = [i for i in PURE if last_barrier < i <= crashed_at]
        assert set(rerun) <= set(window)
        if mode == "exit":
            assert rerun == window  # exit keeps nothing between barriers
