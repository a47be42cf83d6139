"""Known bug: the documented `workflow_id=` keyword fails strict type checking.

Engine.start, Engine.start_async and Client.submit are typed
`(fn: Callable[P, ...], /, *args: P.args, **kwargs: P.kwargs)` and pop `workflow_id` from
kwargs at run time, so mypy rejects `engine.start(wf, 1, workflow_id="a")` (the README's
own call) with "Unexpected keyword argument "workflow_id"" for any workflow that has no
such parameter, although the package ships py.typed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SNIPPET = """
import durable


@durable.workflow()
def wf(x: int) -> int:
    return x


@durable.workflow()
async def awf(x: int) -> int:
    return x


async def main(engine: durable.Engine, client: durable.Client) -> None:
    engine.start(wf, 1, workflow_id="a")
    await engine.start_async(awf, 1, workflow_id="b")
    client.submit(wf, 1, workflow_id="c")
"""


@pytest.mark.xfail(
    strict=True, reason="start/start_async/submit: workflow_id= is not in their signature"
)
def test_bug_workflow_id_keyword_passes_strict_mypy(tmp_path: Path) -> None:
    path = tmp_path / "uses_workflow_id.py"
    path.write_text(SNIPPET, "utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
