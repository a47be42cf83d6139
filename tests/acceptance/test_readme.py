"""The README's first sample runs as written, in a fresh process (twice: the second run
finds the workflow done and replays nothing)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT


def first_sample() -> str:
    readme = (ROOT / "README.md").read_text("utf-8")
    match = re.search(r"```python\n(.*?)```", readme, flags=re.S)
    assert match is not None
    return match.group(1)


def test_the_readme_sample_runs_as_written(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url}
    code = first_sample()
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1] == "8000"
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT order_id, cents FROM refunds ORDER BY order_id").fetchall()
        status = conn.execute(
            "SELECT status FROM durable.workflows WHERE workflow_id = 'refund-42'"
        ).fetchone()
    assert rows == [("o1", 4000), ("o2", 4000)]  # once each, though the program ran twice
    assert status == ("SUCCESS",)


def _samples() -> list[str]:
    readme = (ROOT / "README.md").read_text("utf-8")
    return re.findall(r"```python\n(.*?)```", readme, flags=re.S)


def test_the_readme_has_its_samples() -> None:
    assert len(_samples()) >= 10


@pytest.mark.parametrize("index", range(1, len(_samples())))
def test_every_readme_sample_runs_as_written(
    index: int,
    database_url: str,
    subprocess_env: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Each sample is a whole program: run it as a file, in a fresh process, twice (the
    second run finds its workflows there already, as a reader's second try would)."""
    sample = _samples()[index]
    if "RabbitMQ(" in sample:
        request.getfixturevalue("rabbitmq_url")  # skips (fails under CI) without RabbitMQ
    script = tmp_path / f"sample_{index}.py"
    script.write_text(sample)
    # What the callback URLs' sample says its workers need (any 32 characters or more).
    secret = "readme-samples-callback-secret-0123456789"
    env = {
        **subprocess_env,
        "DURABLE_DATABASE_URL": database_url,
        "DURABLE_CALLBACK_SECRET": secret,
    }
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            cwd=tmp_path,
        )
        assert done.returncode == 0, f"sample {index}:\n{sample}\n{done.stderr}"


@pytest.mark.parametrize(
    ("heading", "extra"),
    [
        ("### Model calls that charge themselves", "llm"),
        ("### pydantic-ai agents", "pydantic-ai"),
        ("## Console", "ui"),
        ("## Callback URLs", "ui"),
        ("## Tracing", "otel"),
        ("## Triggers: a workflow per broker message", "rabbitmq"),
    ],
)
def test_each_readme_section_says_the_extra_it_needs(heading: str, extra: str) -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
    assert f"pip install 'durable-pg[{extra}]'" in section
