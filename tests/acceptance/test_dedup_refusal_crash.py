"""A queue's dedup refusal inside a workflow is an outcome of the enqueue, journaled at its
position: a worker is SIGKILLed after the workflow took the refused branch, the key is
freed meanwhile, and the worker that recovers the run replays the refusal (the same
branch) instead of enqueuing a child it was refused the first time."""

from __future__ import annotations

import signal
from pathlib import Path

import durable
from tests.acceptance.workers import start_worker, stop_worker, wait_for, world
from tests.apps import counter_app, dedup_app

APP = "tests.apps.dedup_app"


def test_a_refusal_replays_after_a_crash_once_the_key_is_free(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    counter_app.setup(database_url)
    marker = str(tmp_path / "go")
    with durable.Client(database_url) as client:
        # The key's holder may not start for an hour: the key stays taken meanwhile.
        holder = client.enqueue(
            dedup_app.queue, dedup_app.kid, 1, workflow_id="holder", dedup_key="k", delay=3600
        )
        run = client.submit(dedup_app.parent, marker, workflow_id="parent")
        first = start_worker(subprocess_env, database_url, app=APP)
        try:
            wait_for(lambda: world(database_url, "parent") != [], what="the branch taken")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        client.cancel(holder.workflow_id)  # finished: the key is free again
        Path(marker).touch()
        second = start_worker(subprocess_env, database_url, app=APP)
        try:
            assert run.result(timeout=60) == "refused: holder holds k"
        finally:
            stop_worker(second)
        kids = [w.workflow_id for w in client.list_workflows() if w.name == "dedup.kid"]
    # Both runs took the refused branch; no child was enqueued, none ran.
    branches = {what for _, what, _ in world(database_url, "parent")}
    assert branches == {"refused: holder holds k"}
    assert kids == ["holder"]
    assert world(database_url, "kid-2") == []
