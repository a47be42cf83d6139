"""Keeps benchmarks/checkpoint_overhead.py working: tiny sizes, no timing assertions."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import checkpoint_overhead
from durable.testing import TemplateDatabases


def test_checkpoint_overhead_runs(pg_databases: TemplateDatabases, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    rows = checkpoint_overhead.main(
        [
            "--database-url",
            pg_databases.admin_url,
            "--quick",
            "--rounds",
            "2",
            "--no-peers",
            "--json",
            str(out),
            "--plot",
            "",
        ]
    )
    systems = {(r["system"], r["mode"]) for r in rows}
    assert {("durable", "sync"), ("durable", "async"), ("durable", "exit")} <= systems
    assert ("floor", "INSERT+COMMIT") in systems
    # The async driver is measured beside the sync one, mode by mode, with its ratio to it.
    for mode in ("sync", "async", "exit"):
        twin = next(r for r in rows if r["system"] == "durable" and r["mode"] == mode)
        row = next(r for r in rows if r["system"] == "durable" and r["mode"] == f"async def/{mode}")
        assert row["ratio_to_sync_driver"] == row["median_us"] / twin["median_us"]
        assert twin["ratio_to_sync_driver"] is None
        assert row["median_us"] > 0
        assert row["commits_per_step"] is None or row["commits_per_step"] > 0
    assert all(r["median_us"] > 0 for r in rows if r["mode"] != "plain call")
    # Every system was timed in the floor's rounds, with the median of its per-round ratios.
    floor = next(r for r in rows if r["mode"] == "INSERT+COMMIT")
    for r in rows:
        if r["system"] == "durable" and "length" not in r["mode"]:
            assert r["ratio_to_floor"] is not None
    assert floor["ratio_to_floor"] == 1.0
    assert json.loads(out.read_text()) == rows
    # Beside each ratio, for the floor and durable: statements and CPU per step, the client's
    # (process, measuring thread) and the server's (its backends; local here).
    for r in rows:
        if (r["system"] == "durable" and "length" not in r["mode"]) or r["mode"] == "INSERT+COMMIT":
            assert r["statements_per_step"] is not None, r
            assert r["client_cpu_us_per_step"] > 0, r
            assert r["client_thread_cpu_us_per_step"] > 0, r
            assert r["server_cpu_us_per_step"] > 0, r
