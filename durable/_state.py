"""Working state and conversation turns of a long run, journaled as the run goes.

An agent's plan, progress and conversation summary live in `durable.state`: a small JSON
value the workflow reads and replaces. Each update is one journal row (kind 'state') at
the position where the workflow made it, holding the whole (small) new value, so the
state at any step position is the latest update before it: a replay rebuilds it on its
way, and a fork from step N starts with the state as it was at N.

A conversation is different: it grows with every turn, so it is stored one row per turn
(kind 'turn'), appended; never the whole transcript per step. Storage grows linearly
with the number of turns.
"""

from __future__ import annotations

from typing import Any

from durable import _protocol as protocol
from durable._context import current_run
from durable._driver import drive
from durable._protocol import Run
from durable.errors import NotInWorkflowError


def _workflow_run(what: str) -> Run:
    run = current_run.get()
    if run is None or run.in_step:
        where = "inside a step" if run is not None else "outside a workflow"
        raise NotInWorkflowError(
            f"{what} was called {where}: call it from the @durable.workflow function itself, "
            "where each call is journaled at its position (a step's work is journaled as "
            "its output)"
        )
    return run


class State:
    """The workflow's working state: `durable.state.get()`, `.set(value)`, `.update(**kv)`.

    The value must be JSON (the engine's serializer) and small: every update stores it
    whole. Updates are journaled calls of the workflow (not of a step), so on replay they
    return without writing and the state is rebuilt exactly as it was."""

    def get(self, default: Any = None) -> Any:
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

    def set(self, value: Any) -> None:
        """Replace the state; journaled at this position of the workflow."""
        run = _workflow_run("durable.state.set()")
        drive(run, protocol.set_state(run, value))

    def update(self, **changes: Any) -> None:
        """Merge `changes` into a dict state (an empty dict if there is none yet)."""
        current = self.get({})
        if not isinstance(current, dict):
            raise TypeError(
                f"durable.state.update() merges into a dict, but the state is a "
                f"{type(current).__name__}: use durable.state.set(value)"
            )
        self.set({**current, **changes})


state = State()


def append_turn(role: str, content: Any) -> None:
    """Append one turn ({"role": ..., "content": ...}) to the workflow's conversation.

    One journal row per turn: a thousand turns are a thousand small rows, not a thousand
    copies of a growing transcript. `durable.conversation()` returns the turns so far."""
    run = _workflow_run("durable.append_turn()")
    if not isinstance(role, str) or not role:
        raise TypeError(f"role={role!r}: give a non-empty string such as 'user' or 'assistant'")
    drive(run, protocol.append_turn(run, role, content))


def conversation() -> list[dict[str, Any]]:
    """The turns appended so far, oldest first (copies)."""
    run = current_run.get()
    if run is None:
        raise NotInWorkflowError(
            "durable.conversation() reads a workflow's turns: call it inside a workflow "
            "(engine.conversation(workflow_id) reads them from outside)"
        )
    return [dict(turn) for turn in run.turns]
