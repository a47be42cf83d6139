# Generated from durable/_run/state_async.py by tools/async_to_sync.py: do not edit.
# Edit the source, then run `python tools/async_to_sync.py`
# (tests/unit/test_generated_sync.py fails while this file is out of date).
"""Working state and conversation turns of a long run, journaled as the run goes.

An agent's plan, progress and conversation summary live in `durable.state`: a small JSON
value the workflow reads and replaces. Each update is one journal row (kind 'state') at
the position where the workflow made it, holding the whole (small) new value, so the
state at any step position is the latest update before it: a replay rebuilds it on its
way, and a fork from step N starts with the state as it was at N.

A conversation is different: it grows with every turn, so it is stored one row per turn
(kind 'turn'), appended; never the whole transcript per step. Storage grows linearly
with the number of turns.

This module is the source of the awaited writes, for async workflows; `_run/state.py`, the
plain ones, is generated from it by tools/async_to_sync.py. `durable.state` (State, here)
has both.
"""

from __future__ import annotations

from typing import Any

from durable import _core as protocol
from durable._core import Run
from durable._run.context import current_run, current_step
from durable._run.driver import drive
from durable.errors import AsyncInSyncError, BlockingCallError, NotInWorkflowError


def _run_for(what: str, *, is_async: bool = False) -> Run:
    run = current_run.get()
    if run is None or current_step.get() is not None:
        where = "inside a step" if run is not None else "outside a workflow"
        raise NotInWorkflowError(
            f"{what} was called {where}: call it from the @durable.workflow function itself, "
            "where each call is journaled at its position (a step's work is journaled as "
            "its output)"
        )
    if run.is_async != is_async:
        other = what.replace("()", "_async()") if run.is_async else what.replace("_async", "")
        raise (BlockingCallError if run.is_async else AsyncInSyncError)(
            f"{what} in {'an async' if run.is_async else 'a plain-def'} workflow "
            f"({run.name!r}): use `{'await ' if run.is_async else ''}{other}`"
        )
    return run


def _workflow_run(what: str) -> Run:
    """The run of the calling workflow function, for `what` (named as the plain call; its
    awaited twin on this side)."""
    return _run_for(what)


def current_state(default: Any = None) -> Any:
    """A fresh copy of the current state (changing it changes nothing until set())."""
    run = current_run.get()
    if run is None:
        raise NotInWorkflowError(
            "durable.state.get() reads a workflow's state: call it inside a workflow "
            "(engine.get_state(workflow_id) reads it from outside)"
        )
    if run.state is None:
        return default
    return run.loads(run.state)


def _merged(changes: dict[str, Any]) -> dict[str, Any]:
    current = current_state({})
    if not isinstance(current, dict):
        raise TypeError(
            f"durable.state.update() merges into a dict, but the state is a "
            f"{type(current).__name__}: use durable.state.set(value)"
        )
    return {**current, **changes}


class StateWrites:
    """The writes of durable.state (the awaited ones; `_state.StateWrites` has the plain)."""

    def set(self, value: Any) -> None:
        """Replace the state; journaled at this position of the workflow."""
        run = _workflow_run("durable.state.set()")
        drive(run, protocol.set_state(run, value))

    def update(self, **changes: Any) -> None:
        """Merge `changes` into a dict state (an empty dict if there is none yet)."""
        self.set(_merged(changes))


def append_turn(role: str, content: Any) -> None:
    """Append one turn ({"role": ..., "content": ...}) to the workflow's conversation.

    One journal row per turn: a thousand turns are a thousand small rows, not a thousand
    copies of a growing transcript. `durable.conversation()` returns the turns so far.
    (`await durable.append_turn_async(...)` in an async workflow.)"""
    run = _workflow_run("durable.append_turn()")
    drive(run, protocol.append_turn(run, _role(role), content))


def _role(role: str) -> str:
    if not isinstance(role, str) or not role:
        raise TypeError(f"role={role!r}: give a non-empty string such as 'user' or 'assistant'")
    return role
