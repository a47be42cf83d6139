"""Three deploys of one workflow, `patching.order`, for the patching tests.

v1 computes the tax the old way. v2 fixes it behind `durable.patched("fix-tax")`: the new
branch has another step and adds one (an audit). v3, once no run from before the patch
is left, keeps only the new branch with `durable.deprecate_patch("fix-tax")` in the
patch's place. Every step call is recorded in the `world` table as "<deploy>:<step>",
so a test sees which code ran what. `block` holds, per deploy, the step at which a run
waits forever (for a SIGKILL), e.g. {"v1": "finish"}.
"""

from __future__ import annotations

import time

from tests.apps.counter_app import World

WORKFLOW = "patching.order"


def run_step(deploy: str, step: str, order_id: str, block: dict[str, str]) -> None:
    World.record(order_id, f"{deploy}:{step}")
    if block.get(deploy) == step:
        while True:  # killed here
            time.sleep(1)
