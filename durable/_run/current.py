"""Where the calling code runs: `durable.workflow_id()` and `durable.step_id()`.

A step that calls an outside service wants a key of its own work (an idempotency key, a
log field, a file name) that is the same on every attempt and every replay: the workflow's
id and the step's position in the journal are that (DBOS's `DBOS.workflow_id` and
`DBOS.step_id`).
"""

from __future__ import annotations

from durable._run.context import current_run, current_step
from durable.errors import NoEngineError

__all__ = ["step_id", "workflow_id"]


def workflow_id() -> str:
    """The id of the workflow whose code (or step's code) is running."""
    run = current_run.get()
    if run is None:
        raise NoEngineError(
            "durable.workflow_id() was called outside a workflow: call it from a workflow "
            "function or from a step it runs"
        )
    return run.workflow_id


def step_id() -> int:
    """The position in its workflow's journal of the step (or transaction, effect, tool)
    whose code is running: the same on every attempt of the step and on every run."""
    scope = current_step.get()
    if scope is None or scope.seq < 0:
        raise NoEngineError(
            "durable.step_id() was called outside a step's code: call it from the body of "
            "a @step, @transaction, @effect or @tool (durable.workflow_id() works in "
            "workflow code too)"
        )
    return scope.seq
