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
    assert all(r["median_us"] > 0 for r in rows if r["mode"] != "plain call")
    assert json.loads(out.read_text()) == rows
