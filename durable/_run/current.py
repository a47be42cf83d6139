"""Where the calling code runs: `durable.workflow_id()` and `durable.step_id()`.

A step that calls an outside service wants a key of its own work (an idempotency key, a
log field, a file name) that is the same on every attempt and every replay: the workflow's
id and the step's position in the journal are that (DBOS's `DBOS.workflow_id` and
`DBOS.step_id`).
"""

from __future__ import annotations

from typing import NoReturn

from durable._run.context import current_run, current_step
from durable.errors import NoEngineError, WorkflowIdNotCalledError

__all__ = ["step_id", "workflow_id"]


class WorkflowId:
    """`durable.workflow_id()`: the id of the workflow whose code (or step's code) is
    running.

    A function, not a property as DBOS's `DBOS.workflow_id` is: used as a value (in an
    f-string, compared, tested for truth) it raises WorkflowIdNotCalledError, which says to
    call it, rather than giving the function's repr or comparing unequal to every id."""

    __slots__ = ()

    def __call__(self) -> str:
        """The id of the workflow whose code (or step's code) is running."""
        run = current_run.get()
        if run is None:
            raise NoEngineError(
                "durable.workflow_id() was called outside a workflow: call it from a "
                "workflow function or from a step it runs"
            )
        return run.workflow_id

    def _not_called(self, use: str) -> NoReturn:
        raise WorkflowIdNotCalledError(
            f"durable.workflow_id was used as a value ({use}): call it, "
            "durable.workflow_id(), for the running workflow's id (it is DBOS's "
            "DBOS.workflow_id that is a property)"
        )

    def __str__(self) -> str:
        self._not_called("str()")

    def __format__(self, spec: str) -> str:
        self._not_called("in a format string")

    def __eq__(self, other: object) -> bool:
        self._not_called("compared with ==")

    def __ne__(self, other: object) -> bool:
        self._not_called("compared with !=")

    def __bool__(self) -> bool:
        self._not_called("tested for truth")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "<function durable.workflow_id>"


workflow_id = WorkflowId()


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
