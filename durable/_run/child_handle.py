"""The handle of a child started from workflow code (durable.start_child): what the
parent waits for, in a plain-def workflow (`result()`, from `_run/children.py`) or an async
one (`await handle`, `result_async()`, from `_run/children_async.py`)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from durable._core import OnChild
from durable._run.children import ChildResult
from durable._run.children_async import AsyncChildResult


class ChildHandle(ChildResult, AsyncChildResult):
    """A child workflow started from workflow code with durable.start_child(). Waiting
    for it (`result()`, or `await handle` / `result_async()` in an async workflow) is a
    journaled call of the parent that parks the parent until the child ends; the handle
    also goes into durable.wait_first() as one of its conditions."""

    def __init__(self, workflow_id: str, name: str, fn: Callable[..., Any] | None) -> None:
        self._condition = OnChild(workflow_id, name, fn)

    @property
    def workflow_id(self) -> str:
        return self._condition.workflow_id

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result_async().__await__()

    def __repr__(self) -> str:
        return f"ChildHandle({self.workflow_id!r})"
