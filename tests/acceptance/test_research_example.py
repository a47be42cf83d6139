"""Runs examples/research_agent the way a user does; checks its outbox and the ledger."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import psycopg


def test_research_agent_resumes_without_calling_a_tool_twice_or_resetting_its_budget(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    env = dict(subprocess_env)
    env["DURABLE_DATABASE_URL"] = database_url
    out = subprocess.run(
        [sys.executable, "-m", "examples.research_agent", "--outbox", str(tmp_path)],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "CRASH" in out.stdout and "PAUSED" in out.stdout
    # The world's record: each tool's code ran once, across the SIGKILL and the resume.
    runs = [json.loads(x) for x in (tmp_path / "tool_runs.jsonl").read_text().splitlines()]
    assert [r["tool"] for r in runs] == ["search_web", "read_page", "search_web", "send_report"]
    first_pid = runs[0]["pid"]
    assert runs[1]["pid"] == first_pid  # before the kill
    assert {runs[2]["pid"], runs[3]["pid"]} != {first_pid}  # after it, in the fresh worker
    reports = list(tmp_path.glob("report-*.txt"))
    assert len(reports) == 1
    assert "MeyGen phase 2" in reports[0].read_text()
    with psycopg.connect(database_url) as conn:
        ledger = conn.execute(
            "SELECT limit_dollars, spent_dollars, spent_tokens, spent_steps FROM durable.budgets"
        ).fetchall()
        charges = conn.execute("SELECT sum(dollars), count(*) FROM durable.charges").fetchone()
        gate = conn.execute(
            "SELECT status FROM durable.approvals WHERE name LIKE 'budget@%'"
        ).fetchall()
    # One ledger: 0.20 raised by 0.25; spent = every scripted charge once (0.06 plan,
    # 3 x 0.04 decisions, 0.01 + 0.02 + 0.01 tools, 0.15 report), not reset by the resume.
    assert ledger == [(Decimal("0.45"), Decimal("0.37"), 6600, 8)]
    assert charges == (Decimal("0.37"), 8)
    assert gate == [("approved",)]
