"""durable.patched() and durable.deprecate_patch(): ship a change to a workflow's code while
runs of the old code are in flight (the decision is in `_core/patches.py`).

    if durable.patched("fix-tax"):
        total = with_tax_fixed(order)      # runs that reach here on the new code
    else:
        total = with_old_tax(order)        # runs whose journal was written before

A later deploy, once no run from before the patch is left, keeps only the new branch and
calls `durable.deprecate_patch("fix-tax")` in its place; the one after drops the call.
See docs/versioning.md.

This module is the source of `patched_async`, for async workflows; `_run/patches.py`, with
`patched`, is generated from it by tools/async_to_sync.py.
"""

from __future__ import annotations

from durable import _core as protocol
from durable._base.names import check_name
from durable._run.acompat import workflow_run_async
from durable._run.context import workflow_code_run
from durable._run.driver_async import drive_async
from durable.errors import NoEngineError


async def patched_async(patch_id: str) -> bool:
    """Whether this run takes the new branch of patch `patch_id`: True when it reaches this
    point on code that has the patch (a marker is journaled here) or replays a run that
    did; False when it replays a journal written before the patch existed (take the old
    branch, and no NondeterminismError is raised). Call it from the workflow function
    (`await durable.patched_async(...)` in an async one); the first answer for an id holds
    for the rest of the run."""
    check_name("patch_id", patch_id)
    run = workflow_run_async("durable.patched()")
    return await drive_async(run, protocol.patched(run, patch_id))


def deprecate_patch(patch_id: str) -> None:
    """Where `durable.patched(patch_id)` stood, once no run from before the patch is left:
    a run that journaled the patch's marker passes over it here, a new run journals
    nothing. Works in sync and async workflows alike (it never waits)."""
    check_name("patch_id", patch_id)
    run = workflow_code_run()
    if run is None:
        raise NoEngineError("durable.deprecate_patch() must be called from a workflow (not a step)")
    protocol.deprecate_patch(run, patch_id)
