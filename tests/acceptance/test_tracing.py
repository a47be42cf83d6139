"""OpenTelemetry: one trace per workflow across processes, a span per step that really runs.

A workflow is started under a caller's span in one process and SIGKILLed before its third
step; a worker in another process recovers it. The spans both processes exported (written
to disk as each ended) must form one trace: the caller, the start, the recovered run, and
exactly one span per executed step - the two steps the first process ran are replayed from
the journal by the second, which emits no span for them - with the child workflow's run and
step nested under the run that started it. Run with `async def` (the plain-def spans of a
replay: tests/integration/test_tracing.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.workers import scalar, start_worker, stop_worker, wait_for, world

APP = "tests.apps.traced_app"


def _spans(folder: Path) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = {}
    for path in folder.glob("*.jsonl"):
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        found[int(path.stem)] = [json.loads(line) for line in lines]
    return found


def _attr(span: dict[str, Any], key: str) -> Any:
    return span["attributes"].get(key)


@pytest.mark.parametrize("driver", ["async"])
def test_recovered_workflow_is_one_trace_with_one_span_per_executed_step(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path, driver: str
) -> None:
    suffix = ".async" if driver == "async" else ""
    workflow_id = f"traced-{driver}"
    env = {**subprocess_env, "DURABLE_TEST_SPANS_DIR": str(tmp_path)}
    crashed = subprocess.run(
        [sys.executable, "-m", APP, "run", database_url, workflow_id, driver],
        env={**env, "DURABLE_CRASH_POINTS": "before_step:3"},
        capture_output=True,
        timeout=120,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert [w for _, w, _ in world(database_url, workflow_id)] == ["s1", "s2"]
    first_pid = crashed_pids = set(_spans(tmp_path))
    assert len(crashed_pids) == 1

    worker = start_worker(env, database_url, app=APP)
    try:
        wait_for(
            lambda: (
                scalar(
                    database_url,
                    "SELECT status FROM durable.workflows WHERE workflow_id = %s",
                    workflow_id,
                )
                == "SUCCESS"
            ),
            what="the recovered workflow to finish",
        )
        time.sleep(0.2)  # the run's own span ends just after its outcome commits
    finally:
        stopped = stop_worker(worker)
    assert stopped == 0

    # The world: every step ran once, across both processes.
    assert [w for _, w, _ in world(database_url, workflow_id)] == ["s1", "s2", "s3", "s4"]
    assert [w for _, w, _ in world(database_url, f"{workflow_id}/child")] == ["c1"]

    by_pid = _spans(tmp_path)
    (worker_pid,) = set(by_pid) - first_pid
    (crashed_pid,) = first_pid
    everything = [s for spans in by_pid.values() for s in spans]
    by_id = {s["context"]["span_id"]: s for s in everything}

    # One trace, begun by the caller's span in the first process (killed before it ended).
    caller_trace, caller_span = crashed.stdout.decode().split()
    assert {s["context"]["trace_id"] for s in everything} == {f"0x{caller_trace}"}

    def steps(spans: list[dict[str, Any]], wid: str) -> list[str]:
        return [
            _attr(s, "durable.step.name") + ":" + str(_attr(s, "durable.step.position"))
            for s in spans
            if s["name"].startswith("durable.step ") and _attr(s, "durable.workflow.id") == wid
        ]

    step = f"traced.step{suffix}"
    assert steps(by_pid[crashed_pid], workflow_id) == [f"{step}:0", f"{step}:1"]
    # The recovered run replays positions 0 and 1 without a span; the child is position 3.
    assert steps(by_pid[worker_pid], workflow_id) == [f"{step}:2", f"{step}:4"]
    (child_id,) = {
        _attr(s, "durable.workflow.id")
        for s in everything
        if s["name"] == f"durable.workflow traced.child{suffix}"
    }
    assert steps(everything, child_id) == [f"{step}:0"]

    # The recovered run is a child of the workflow's start span, itself under the caller.
    runs = [s for s in by_pid[worker_pid] if s["name"] == f"durable.workflow traced.parent{suffix}"]
    assert len(runs) == 1
    run = runs[0]
    assert _attr(run, "durable.run.replaying") is True
    assert _attr(run, "durable.run.epoch") >= 2
    start = by_id[run["parent_id"]]
    assert start["name"] == f"durable.start traced.parent{suffix}"
    assert start["parent_id"] == f"0x{caller_span}"

    # The steps of the recovered run, and the child's run and step, nest under it.
    for s in by_pid[worker_pid]:
        if s["name"].startswith("durable.step ") and _attr(s, "durable.workflow.id") == workflow_id:
            assert s["parent_id"] == run["context"]["span_id"]
    (child_step,) = [
        s
        for s in everything
        if _attr(s, "durable.workflow.id") == child_id and s["name"].startswith("durable.step ")
    ]
    child_run = by_id[child_step["parent_id"]]
    assert child_run["name"] == f"durable.workflow traced.child{suffix}"
    child_start = by_id[child_run["parent_id"]]
    assert child_start["name"] == f"durable.start traced.child{suffix}"
    assert child_start["parent_id"] == run["context"]["span_id"]
    assert _attr(child_step, "durable.executor.id") == _attr(run, "durable.executor.id")
