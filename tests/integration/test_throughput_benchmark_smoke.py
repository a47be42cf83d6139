"""Keeps benchmarks/throughput.py (and the page benchmarks/report.py writes) working: tiny
sizes, no timing assertions."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from benchmarks import report, throughput
from durable.testing import TemplateDatabases


def test_throughput_runs(pg_databases: TemplateDatabases, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    results = throughput.main(
        [
            "--database-url",
            pg_databases.admin_url,
            "--workflows",
            "12",
            "--workers",
            "1",
            "2",
            "--modes",
            "sync",
            "async",
            "--group-commit",
            "both",
            "--concurrency",
            "4",
            "--insert-seconds",
            "0.3",
            "--connections",
            "1",
            "2",
            "--json",
            str(out),
        ],
        console=Console(quiet=True),
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert all(v > 0 for v in results["insert_rate"].values())
    rows = results["durable"]
    assert {(r["mode"], r["group_commit"], r["workers"]) for r in rows} == {
        (m, g, w) for m in ("sync", "async") for g in (False, True) for w in (1, 2)
    }
    for r in rows:
        assert r["workflows"] == 12 and r["workflows_per_s"] > 0
        assert abs(r["steps_per_s"] - r["workflows_per_s"] * 10) < 1e-6 * r["steps_per_s"]
        if r["mode"] == "sync":
            assert r["commits_per_step"] >= 1  # every step commits, and polls commit too
        assert r["wal_syncs_per_step"] >= 0
        # What a step costs whatever a commit costs: CPU (the workers' and their backends'
        # over the run's window; the server is local here) and statements.
        assert (
            r["statements_per_step"] >= 1 if r["mode"] == "sync" else r["statements_per_step"] > 0
        )
        assert r["worker_cpu_us_per_step"] > 0
        assert r["server_cpu_us_per_step"] > 0


def test_a_run_without_out_writes_no_results(pg_databases: TemplateDatabases) -> None:
    results_dir = Path(throughput.__file__).parent / "results"

    def stored() -> dict[str, tuple[int, int]]:
        return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in results_dir.iterdir()}

    before = stored()
    results = throughput.main(
        [
            *("--database-url", pg_databases.admin_url, "--workflows", "4", "--workers", "1"),
            *("--modes", "async", "--group-commit", "off", "--concurrency", "2"),
            *("--insert-seconds", "0.2", "--connections", "1"),
        ],
        console=Console(quiet=True),
    )
    assert stored() == before
    assert results["durable"][0]["worker_cpu_us_per_step"] > 0


def test_the_benchmarks_page_renders_from_stored_results() -> None:
    written: list[str] = []
    page = report.main(["--render"], write=written.append)
    assert written == [page]
    assert page.startswith("# Benchmarks\n")
    assert "## One unit of work" in page and "x floor" in page
