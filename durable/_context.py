"""Context variables: which engine is active and which workflow run is executing.

ContextVars (not thread-locals or globals) keep concurrent runs in one process apart, and
carry over to asyncio tasks when async support arrives.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from durable._protocol import Journal

if TYPE_CHECKING:
    from durable._budget import Ledger
    from durable._engine import Engine


@dataclass
class RunContext:
    """The state of one executing workflow run."""

    engine: Engine
    workflow_id: str
    name: str
    epoch: int
    journal: Journal
    in_step: bool = False
    # The system-database connection this run writes through, checked out once per run:
    # a pool checkout per step costs about as much as the step's own client-side work.
    conn: Any = None
    # Undo actions of applied effects, in the order they were registered (a saga). Rebuilt
    # deterministically on replay, because replayed effects register them again.
    approvals_asked: dict[str, int] = field(default_factory=dict)
    # Durability mode of this run and, in "exit" mode, the step records not yet written.
    mode: str = "sync"
    pending: list[dict[str, Any]] = field(default_factory=list)
    compensations: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = field(
        default_factory=list
    )
    # When the workflow times out (from its first start), and why it was asked to stop if
    # it was when claimed. `stopping` is set while compensations of a cancel run, so that
    # they are not interrupted in turn.
    deadline: dt.datetime | None = None
    cancel_reason: str | None = None
    stopping: bool = False
    # The budget this run draws from (its root's id), the run's copy of that ledger, and
    # what the step now executing has charged so far.
    budget_id: str | None = None
    ledger: Ledger | None = None
    charging: bool = False
    step_dollars: Decimal = Decimal(0)
    step_tokens: int = 0
    # The working state (durable.state) and the conversation turns, as of this point of
    # the run: rebuilt by replay, since every update is a journaled call.
    state: str | None = None
    turns: list[Any] = field(default_factory=list)


current_engine: ContextVar[Engine | None] = ContextVar("durable_engine", default=None)
current_run: ContextVar[RunContext | None] = ContextVar("durable_run", default=None)
