"""docs/coming-from-dbos.md's programs run as written, in a fresh process, twice (the
second run finds its workflows there already)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOC = ROOT / "docs" / "coming-from-dbos.md"


def _samples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text("utf-8"), flags=re.S)


def test_the_page_has_its_samples() -> None:
    assert len(_samples()) >= 3


@pytest.mark.parametrize("index", range(len(_samples())))
def test_every_sample_runs_as_written(
    index: int, database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / f"dbos_sample_{index}.py"
    script.write_text(_samples()[index], "utf-8")
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url}
    outputs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]  # the second run replays: the same answers
