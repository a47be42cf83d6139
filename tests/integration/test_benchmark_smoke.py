"""The step-overhead benchmark runs end to end at tiny sizes (no timing assertions)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rich.console import Console

from benchmarks import step_overhead
from durable.testing import TemplateDatabases

TINY = ["--steps", "5", "--rounds", "2", "--empty-runs", "2"]


def run(argv: list[str]) -> dict[str, Any]:
    return step_overhead.main(argv, console=Console(quiet=True))


def check_results(results: dict[str, Any], path: Path | None) -> None:
    if path is not None:
        assert json.loads(path.read_text("utf-8")) == json.loads(json.dumps(results))
    # Measured times are positive; the per-step cost is a difference of two of them, so at
    # this size noise may make it any sign: check it is that difference, not its value.
    for key in ("floor_us", "empty_workflow_us", "full_workflow_us", "round_trip_us"):
        summary = results[key]
        assert len(summary["samples"]) == 2
        assert all(s > 0 for s in summary["samples"]), key
        assert 0 < summary["min"] <= summary["p25"] <= summary["median"] <= summary["p75"]
    steps = results["config"]["steps"]
    per_step = results["durable_step_us"]["samples"]
    full = results["full_workflow_us"]["samples"]
    empty = results["empty_workflow_us"]["samples"]
    assert per_step == pytest.approx([(w - e) / steps for w, e in zip(full, empty, strict=True)])
    assert math.isfinite(results["ratio"]["of_medians"])
    # The async driver is measured in the same rounds.
    assert len(results["async_step_us"]["samples"]) == 2
    assert math.isfinite(results["async_ratio"]["of_medians"])
    assert len(results["durable_step_cpu_us"]["samples"]) == 2
    assert len(results["async_step_cpu_us"]["samples"]) == 2
    assert results["payload_bytes"] > 0
    assert results["statements_per_step"] == 1
    assert results["statements_per_empty_workflow"] == 2
    # @transaction steps against the same app transactions, and effects, in the same run.
    for key in ("app_transaction_us", "transaction_step_us", "effect_us"):
        assert len(results[key]["samples"]) == 2, key
    assert math.isfinite(results["transaction_ratio"]["of_medians"])
    assert results["statements_per_effect"] == 2  # write-ahead intent, settled outcome
    assert results["commits_per_effect"] in (None, 2)
    # Steps and floor INSERTs interleaved block by block, per durability mode.
    inter = results["interleaved"]
    for mode in ("sync", "async", "exit"):
        assert len(inter[mode]["ratio"]["samples"]) == inter["blocks"]
        assert all(r > 0 for r in inter[mode]["ratio"]["samples"])
    # Beside the wall ratios: the floor's and a step's CPU, client and server (local here).
    for what in ("floor", "durable_step"):
        cpu = results["cpu_per_op"][what]
        assert set(cpu) == {"thread_cpu_us", "process_cpu_us", "server_cpu_us"}, what
        assert all(isinstance(v, float) and math.isfinite(v) for v in cpu.values()), what
    assert results["cpu_per_op"]["floor"]["server_cpu_us"] > 0
    commits = results["commits"]
    if commits["reliable"]:
        assert commits["floor_per_insert"] == 1
        assert commits["durable_per_step"] > 0
    else:
        assert commits["durable_per_step"] is None
        assert commits["note"]


def stored_results() -> dict[str, tuple[int, int]]:
    """The committed results' files: name -> (size, mtime in ns)."""
    return {
        p.name: (p.stat().st_size, p.stat().st_mtime_ns)
        for p in (Path(step_overhead.__file__).parent / "results").iterdir()
    }


def database_exists(admin_url: str, name: str) -> bool:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    return row is not None


def test_scratch_database(pg_databases: TemplateDatabases, tmp_path: Path) -> None:
    """The default mode creates its own database from the admin URL and drops it."""
    out = tmp_path / "results.json"
    results = run(
        [
            *TINY,
            "--database-url",
            pg_databases.admin_url,
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "plot.png"),
        ]
    )
    check_results(results, out)
    assert results["config"]["scratch"] is True
    name = results["config"]["scratch_name"]
    assert name.startswith("durable_bench_")
    assert not database_exists(pg_databases.admin_url, name)


def test_no_scratch(database_url: str) -> None:
    """--no-scratch works inside a schema of its own in the given database and drops it;
    without --out (or --save) the run writes no results file."""
    before = stored_results()
    results = run([*TINY, "--database-url", database_url, "--no-scratch"])
    assert stored_results() == before
    check_results(results, None)
    assert results["config"]["scratch"] is False
    with psycopg.connect(database_url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = %s",
            [results["config"]["scratch_name"]],
        ).fetchall()
    assert left == []


def test_conversation_storage_benchmark_runs_at_tiny_sizes(database_url: str) -> None:
    from benchmarks import conversation_storage

    rows = conversation_storage.main(
        ["--url", database_url, "--turns", "5", "10", "--rounds", "1"],
        console=Console(quiet=True),
    )
    sizes = {(r["kind"], r["turns"]): r["bytes"] for r in rows}
    # One row per turn: twice the turns, twice the bytes; the whole transcript per turn
    # grows faster than that.
    assert 1.9 < sizes[("per turn", 10)] / sizes[("per turn", 5)] < 2.1
    assert sizes[("whole state", 10)] > 3 * sizes[("whole state", 5)]


def test_recovery_benchmark_recovers_every_workflow(
    pg_databases: TemplateDatabases, tmp_path: Path
) -> None:
    """benchmarks/recovery.py at a tiny size: it checks every recovered workflow's output
    itself (and gives up after --timeout), so a broken recovery fails here, not hangs."""
    from benchmarks import recovery

    out = tmp_path / "recovery.json"
    rows = recovery.main(
        [
            "--database-url",
            pg_databases.admin_url,
            "--n",
            "30",
            "--rounds",
            "1",
            "--concurrency",
            "4",
            "--timeout",
            "60",
            "--json",
            str(out),
        ]
    )
    assert [r["workflows"] for r in rows] == [30]
    assert rows[0]["median_seconds"] > 0
    assert json.loads(out.read_text("utf-8")) == rows


def test_server_cpu_benchmark_measures_each_case_and_writes_only_when_asked(
    pg_databases: TemplateDatabases, tmp_path: Path
) -> None:
    from benchmarks import server_cpu

    out = tmp_path / "server_cpu.json"
    tiny = ["--url", pg_databases.admin_url, "--block", "10", "--rounds", "2"]
    assert server_cpu.main([*tiny, "--before", "HEAD", "--out", str(out)]) == 0
    result = json.loads(out.read_text("utf-8"))
    assert list(result["cases"]) == ["floor", "record_step", "unfenced", "record_step@HEAD"]
    for case in result["cases"].values():
        assert case["n"] == 2 and case["median"] > 0 and math.isfinite(case["paired_ratio"])
    before = set(tmp_path.iterdir())
    assert server_cpu.main([*tiny, "--no-prepare"]) == 0
    assert set(tmp_path.iterdir()) == before


def test_step_cpu_benchmark_runs_at_tiny_sizes(
    pg_databases: TemplateDatabases, tmp_path: Path
) -> None:
    """The in-place client CPU benchmark: every measure there, its JSON as printed."""
    from benchmarks import step_cpu

    out = tmp_path / "cpu.json"
    argv = ["--url", pg_databases.admin_url, "--blocks", "2", "--per-block", "3"]
    results = step_cpu.main([*argv, "--starts", "20", "--json", str(out)])
    assert json.loads(out.read_text("utf-8")) == results
    for key in ("floor", "sync_step", "async_step", "start_result"):
        assert results[key] > 0, key
    assert results["sync_over_floor"] == results["sync_step"] / results["floor"]
