"""examples/async_app.py: an asyncio program starts workflows with start_async and awaits
them while its own coroutine keeps running on the same loop."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.acceptance.workers import scalar
from tests.conftest import ROOT


def test_the_asyncio_example_runs_its_workflows_without_blocking_its_loop(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url}
    for attempt in range(2):  # the second run finds them finished
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "async_app.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "async-app-tides ['history of tides', 'causes of tides', 'effects of tides']" in (
            done.stdout
        )
        match = re.search(r"heartbeat: (\d+) ticks, longest gap (\d+) ms", done.stdout)
        assert match is not None, done.stdout
        during = re.search(r"heartbeat while the workflows ran: (\d+) ticks", done.stdout)
        took = re.search(r"workflows: 5 in ([\d.]+) s", done.stdout)
        assert during is not None and took is not None, done.stdout
        if attempt == 0:
            # The workflows took ~0.5 s of awaited model calls; the heartbeat (every 50 ms)
            # kept ticking through them: the loop was never blocked for long.
            assert int(during.group(1)) >= 5
            assert int(match.group(2)) < 500
            # The five ran at once: one after another they would need 5 x 0.5 s.
            assert float(took.group(1)) < 2.5
    assert (
        scalar(database_url, "SELECT count(*) FROM durable.workflows WHERE status = 'SUCCESS'") == 5
    )
    # Three model calls per workflow, each once though the program ran twice.
    assert scalar(database_url, "SELECT count(*) FROM durable.steps") == 15
