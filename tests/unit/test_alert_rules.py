"""The Prometheus alert rules that docs/operations.md gives (deploy/prometheus/alerts.yml)
are valid, and fire as their unit tests say (alerts_test.yml), by Prometheus' own promtool
(Debian's `prometheus` package). Outside CI the test skips when promtool is missing; under
CI=true it fails (.ci/run installs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is missing: apt-get install -y prometheus (Debian's package)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.mark.parametrize(
    ("command", "file"), [("check", "alerts.yml"), ("test", "alerts_test.yml")]
)
def test_alert_rules(command: str, file: str) -> None:
    done = subprocess.run(
        [_promtool(), command, "rules", file],
        cwd=RULES,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_docs_include_the_rules() -> None:
    docs = (RULES.parents[1] / "docs" / "operations.md").read_text("utf-8")
    assert "deploy/prometheus/alerts.yml" in docs
    for rule in ("DurableWorkflowsStuck", "DurableDeadLettersGrowing", "DurableQueueBacklog"):
        assert rule in (RULES / "alerts.yml").read_text("utf-8")
