"""examples/agent_pydantic_ai as a user runs it: real worker processes, a SIGKILL mid-agent,
the cap, an operator's raise; every model request and tool call really made once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path


def test_the_durable_pydantic_ai_agent_survives_a_kill_and_stops_at_the_cap(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.agent_pydantic_ai", "--outbox", str(tmp_path)],
        env={**subprocess_env, "DURABLE_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CRASH" in done.stdout and "PAUSED  at budget@" in done.stdout
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    made = Counter((c["call"], c["topic"]) for c in calls)
    # Two requests and one tool run per question, each once: the killed worker's journaled
    # calls replayed, and the request the cap refused was never sent.
    assert made == {
        (kind, topic): 2 if kind == "model" else 1
        for topic in ("tides", "eclipses", "seasons")
        for kind in ("model", "tool")
    }
    assert len({c["pid"] for c in calls}) == 2  # the killed worker and the fresh one
    assert "progress seen by the reader: [1, 2, 3]" in done.stdout
    assert "spent $0.60, 420000 tokens" in done.stdout
