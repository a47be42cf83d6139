"""Keeps benchmarks/citus.py working: one server beside a Citus cluster at tiny sizes. It
starts a cluster of its own (it sets cluster-wide settings the shared one must not get). No
timing assertions: the counts it reports are checked against what a step is."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
from rich.console import Console

from benchmarks import citus as citus_bench
from tests import citus

pytestmark = pytest.mark.citus


def test_cluster_benchmark_runs(tmp_path: Path) -> None:
    try:
        citus.ensure_installed()
    except citus.Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))
    out = tmp_path / "c.json"
    # The chart needs matplotlib (the `bench` extra), which the test run may not have.
    plot = importlib.util.find_spec("matplotlib") is not None
    results = citus_bench.main(
        [
            "--steps",
            "10",
            "--rounds",
            "1",
            "--warmup",
            "0",
            "--workflows",
            "6",
            "--workers",
            "1",
            "--concurrency",
            "2",
            "--shards",
            "4",
            "--claim-backlog",
            "10",
            "--claim-seconds",
            "0.3",
            "--spread",
            "--out",
            str(out),
            *(["--plot", str(tmp_path / "c.png")] if plot else []),
        ],
        console=Console(quiet=True),
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    if plot:
        assert (tmp_path / "c.png").stat().st_size > 0
    steps = results["steps"]
    for side in ("single", "citus"):
        # A step's cost is a workflow's time less an empty one's: at this tiny size, noise
        # may make it any sign (the step-overhead smoke test says the same).
        assert math.isfinite(steps[side]["step_us"]["median"])
        # One round trip per step; at this tiny size a statement at the window's edge may
        # fall outside it (0.9 seen), so the figure is read to the nearest whole.
        assert round(steps[side]["statements_per_step"]) == 1
        # A sync step is one commit on the coordinator, wherever its row lands.
        assert steps[side]["per_step"]["coordinator"] >= 1
    assert steps["single"]["per_step"]["workers"] == 0
    # On the cluster the row commits on its shard's worker too, in one phase: a step is
    # a single-shard statement, never a two-phase commit.
    assert steps["citus"]["per_step"]["workers"] >= 1
    assert steps["citus"]["per_step"]["prepared"] < 0.5
    rows = results["throughput"]
    assert {(r["target"], r["workers"]) for r in rows} == {("single", 1), ("citus", 1)}
    for r in rows:
        assert r["workflows"] == 6 and r["workflows_per_s"] > 0
        # CPU per step of the coordinator's server (the one server's, on one server) and of
        # the worker processes, from /proc and wait4: work was done, so some was used (on
        # the coordinator, unless the process was on a worker node: little, maybe no tick).
        assert r["process_cpu_ms_per_step"] > 0
        assert r["placement"] == "spread" or r["coordinator_cpu_ms_per_step"] > 0
    cluster_row = next(
        r for r in rows if r["target"] == "citus" and r["placement"] == "coordinator"
    )
    assert cluster_row["shards"] == 4 and cluster_row["worker_nodes_cpu_ms_per_step"] > 0
    # --spread: the same drain by a process connected to a worker node (which only checks
    # the schema the coordinator migrated, and polls), set beside the one above.
    spread = next(r for r in rows if r["placement"] == "spread")
    assert (spread["target"], spread["shards"], spread["workers"]) == ("citus", 4, 1)
    assert spread["workflows"] == 6 and spread["ratio_to_coordinator"] > 0
    assert spread["worker_nodes_cpu_ms_per_step"] > 0
    # The claim side alone: idle rounds, and claims from a backlog, on each database.
    assert [(c["target"], c["shards"]) for c in results["claims"]] == [
        ("single", None),
        ("citus", 4),
    ]
    for c in results["claims"]:
        assert c["idle_rounds_per_s"] > 0 and c["claims_per_s"] > 0
    assert cluster_row["ratio_to_single"] > 0
    # The claim loop and the heartbeat write over every shard or every node: 2PC.
    assert cluster_row["prepared_per_workflow"] > 0
    # A @transaction step into a table colocated with durable's commits on one shard; a
    # reference table (every node) or the coordinator's own table needs two phases.
    tx = results["transactions"]
    assert set(tx) == {
        "single/local",
        "citus/colocated",
        "citus/reference",
        "citus/citus_local",
        "citus/local",
    }
    assert tx["citus/colocated"]["per_tx_step"]["prepared"] < 0.5
    assert tx["citus/reference"]["per_tx_step"]["prepared"] >= 1
