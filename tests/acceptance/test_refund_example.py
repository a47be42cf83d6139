"""Runs examples/refund_agent the way a user does and checks the vendor's own ledgers."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path


def moved(path: Path) -> list[int]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT cents FROM moved ORDER BY id")]


def test_refund_example_moves_money_once(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    env = dict(subprocess_env)
    env["DURABLE_DATABASE_URL"] = database_url
    out = subprocess.run(
        [sys.executable, "-m", "examples.refund_agent", "--ledger-dir", str(tmp_path)],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    # With the effect ledger: every refund moved exactly once across the SIGKILL.
    assert moved(tmp_path / "ledger.sqlite") == [10, 25, 40, 5]
    # Naively (random keys, no ledger): the refund in flight at the crash moved twice.
    assert moved(tmp_path / "naive-ledger.sqlite") == [10, 25, 40, 40, 5]
