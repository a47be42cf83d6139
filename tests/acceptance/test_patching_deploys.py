"""Three deploys of one workflow under running work, through real worker processes.

v1 runs and is SIGKILLed; v2 (the tax fixed behind `durable.patched("fix-tax")`, with an
added audit step) recovers v1's runs: one killed after the patch point replays the old
branch (no NondeterminismError), one killed before it takes the new branch (it never ran
the old one), and a run started on v2 takes the new branch. v2 is SIGKILLed in turn, and
v3 (`durable.deprecate_patch("fix-tax")` in the patch's place) finishes the run it left.
The `world` table records every step execution with the deploy that ran it.
"""

from __future__ import annotations

import signal

import durable
from tests.acceptance.workers import start_worker, stop_worker, wait_for, world
from tests.apps import counter_app
from tests.apps.patching import v1, v2, v3

APPS = {name: f"tests.apps.patching.{name}" for name in ("v1", "v2", "v3")}


def ran(url: str, workflow_id: str) -> list[str]:
    return [what for _, what, _ in world(url, workflow_id)]


def journal(client: durable.Client, workflow_id: str) -> list[str]:
    return [s.step_name for s in client.steps(workflow_id)]


def test_a_patch_ships_under_running_workflows(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    counter_app.setup(database_url)
    with durable.Client(database_url) as client:
        # v1: one run stops in its last step (after the patch point), one in its first.
        after = client.submit(v1.order, "after", {"v1": "finish"}, workflow_id="after")
        before = client.submit(v1.order, "before", {"v1": "a"}, workflow_id="before")
        first = start_worker(subprocess_env, database_url, app=APPS["v1"])
        try:
            wait_for(lambda: "v1:finish" in ran(database_url, "after"), what="v1 at finish")
            wait_for(lambda: "v1:a" in ran(database_url, "before"), what="v1 at a")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)

        # v2 recovers both and runs a new one; a second new one stops after the patch point.
        fresh = client.submit(v2.order, "fresh", {}, workflow_id="fresh")
        cut = client.submit(v2.order, "cut", {"v2": "finish"}, workflow_id="cut")
        second = start_worker(subprocess_env, database_url, app=APPS["v2"])
        try:
            assert after.result(timeout=60) == 110  # the old tax (10%)
            assert before.result(timeout=60) == 120  # the fixed tax (20%)
            assert fresh.result(timeout=60) == 120
            wait_for(lambda: "v2:finish" in ran(database_url, "cut"), what="v2 at finish")
        finally:
            second.send_signal(signal.SIGKILL)
            second.wait(timeout=30)

        # v3 finishes what v2 left, and a run started on v3 journals no marker.
        newest = client.submit(v3.order, "newest", {}, workflow_id="newest")
        third = start_worker(subprocess_env, database_url, app=APPS["v3"])
        try:
            assert cut.result(timeout=60) == 120
            assert newest.result(timeout=60) == 120
        finally:
            stop_worker(third)

        # What ran where: journaled steps never ran again; only the step in flight did.
        assert ran(database_url, "after") == ["v1:a", "v1:old_tax", "v1:finish", "v2:finish"]
        assert journal(client, "after") == ["patching.a", "patching.old_tax", "patching.finish"]
        assert ran(database_url, "before") == [
            "v1:a",
            "v2:a",
            "v2:new_tax",
            "v2:audit",
            "v2:finish",
        ]
        marked = ["patching.a", "patch:fix-tax", "patching.new_tax", "patching.audit"]
        assert journal(client, "before") == [*marked, "patching.finish"]
        assert ran(database_url, "fresh") == ["v2:a", "v2:new_tax", "v2:audit", "v2:finish"]
        assert ran(database_url, "cut") == [
            "v2:a",
            "v2:new_tax",
            "v2:audit",
            "v2:finish",
            "v3:finish",
        ]
        assert journal(client, "cut") == [*marked, "patching.finish"]
        assert journal(client, "newest") == [
            "patching.a",
            "patching.new_tax",
            "patching.audit",
            "patching.finish",
        ]
        statuses = {w.workflow_id: w.status for w in client.list_workflows()}
        assert set(statuses.values()) == {durable.WorkflowStatus.SUCCESS}, statuses
