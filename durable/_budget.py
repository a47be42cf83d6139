"""The budget ledger: spend that a crash cannot lose and a resume cannot reset.

`@durable.workflow(budget=durable.Budget(dollars=5.0, tokens=2_000_000, steps=500))`
gives a workflow tree one ledger (a `budgets` row keyed by the root's id; children draw
from it). Inside a step, `durable.charge(dollars=..., tokens=...)` adds to what the step
spent; the total is written with the step's journal row, in one fenced statement, together
with one `charges` row. So a crash either loses the step and its charge together (the step
runs again and charges again: the money of a lost attempt is not counted twice) or keeps
both; a replayed step returns its journaled output and charges nothing.

Before each new step the run compares what was spent with the limits. When the budget is
used up, the step does not run: the workflow asks for a decision at an approval gate
named `budget@<position>` and suspends. `engine.raise_budget(...)` raises the limits and
approves the gate; denying it raises BudgetExceededError in the workflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from durable._context import RunContext, current_run
from durable.errors import (
    BudgetExceededError,
    InvalidBudgetError,
    NotInWorkflowError,
    StaleOwnerError,
    WorkflowSuspended,
)
from durable.serialization import dumps_checked


def _check_amount(name: str, value: object, whole: bool) -> None:
    if value is None:
        return
    kinds: tuple[type, ...] = (int,) if whole else (int, float, Decimal)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or (isinstance(value, float) and not math.isfinite(value))
        or value < 0  # type: ignore[operator]
    ):
        kind = "a whole number" if whole else "a number"
        raise InvalidBudgetError(f"{name}={value!r}: give {kind} of zero or more (or None)")


def dollars_exact(value: float | Decimal | None) -> Decimal | None:
    """An amount of money as the exact decimal the user wrote (0.1 stays 0.1, not
    0.1000000000000000055...), so the ledger's sums in NUMERIC match the charges."""
    return None if value is None else Decimal(str(value))


@dataclass(frozen=True)
class Budget:
    """Limits of one workflow tree; None is unlimited. Also what `budget_left()` returns."""

    dollars: float | None = None
    tokens: int | None = None
    steps: int | None = None

    def __post_init__(self) -> None:
        _check_amount("dollars", self.dollars, whole=False)
        _check_amount("tokens", self.tokens, whole=True)
        _check_amount("steps", self.steps, whole=True)


@dataclass
class Ledger:
    """A run's copy of its budget row, refreshed by every charged write."""

    budget_id: str
    limit_dollars: Decimal | None
    limit_tokens: int | None
    limit_steps: int | None
    spent_dollars: Decimal
    spent_tokens: int
    spent_steps: int

    @staticmethod
    def from_row(row: dict[str, Any]) -> Ledger:
        return Ledger(
            row["budget_id"],
            row["limit_dollars"],
            row["limit_tokens"],
            row["limit_steps"],
            Decimal(row["spent_dollars"]),
            int(row["spent_tokens"]),
            int(row["spent_steps"]),
        )

    def exhausted(self) -> str | None:
        """What is used up (for the next step to be refused), or None."""
        if self.limit_steps is not None and self.spent_steps >= self.limit_steps:
            return f"steps: {self.spent_steps} of {self.limit_steps} used"
        if self.limit_dollars is not None and self.spent_dollars >= self.limit_dollars:
            return f"dollars: {self.spent_dollars} of {self.limit_dollars} spent"
        if self.limit_tokens is not None and self.spent_tokens >= self.limit_tokens:
            return f"tokens: {self.spent_tokens} of {self.limit_tokens} used"
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "limits": {
                "dollars": None if self.limit_dollars is None else float(self.limit_dollars),
                "tokens": self.limit_tokens,
                "steps": self.limit_steps,
            },
            "spent": {
                "dollars": float(self.spent_dollars),
                "tokens": self.spent_tokens,
                "steps": self.spent_steps,
            },
        }


def charge(*, dollars: float = 0.0, tokens: int = 0) -> None:
    """Record what the current step spent (an LLM call's price and tokens, say).

    Written with the step's journal row, so it is counted exactly once however often the
    process crashes; a replayed step does not charge again. What a failed attempt charged
    before a retry counts too (the money was spent). Call it from a @step or
    @durable.tool."""
    run = current_run.get()
    if run is None or not run.charging:
        raise NotInWorkflowError(
            "durable.charge() records what a step spent, with that step's journal row: call "
            "it inside a @durable.step or @durable.tool of a running workflow"
        )
    _check_amount("dollars", dollars, whole=False)
    _check_amount("tokens", tokens, whole=True)
    run.step_dollars += Decimal(str(dollars))
    run.step_tokens += int(tokens)


def budget_left() -> Budget:
    """What the workflow's budget still allows (None: unlimited, or no budget)."""
    run = current_run.get()
    if run is None:
        raise NotInWorkflowError(
            "durable.budget_left() reads a workflow's budget: call it inside a workflow"
        )
    ledger = run.ledger
    if ledger is None:
        return Budget()
    spent_dollars = ledger.spent_dollars + run.step_dollars
    spent_tokens = ledger.spent_tokens + run.step_tokens
    return Budget(
        dollars=None
        if ledger.limit_dollars is None
        else max(0.0, float(ledger.limit_dollars - spent_dollars)),
        tokens=None if ledger.limit_tokens is None else max(0, ledger.limit_tokens - spent_tokens),
        steps=None
        if ledger.limit_steps is None
        else max(0, ledger.limit_steps - ledger.spent_steps),
    )


def open_ledger(run: RunContext, limits: Budget | None) -> None:
    """Load (or, at a root's first start, create) the run's budget row."""
    if run.budget_id is None:
        return
    engine = run.engine
    if limits is not None and run.budget_id == run.workflow_id:
        row = engine.db.fetch_one(
            "ensure_budget",
            {
                "budget_id": run.budget_id,
                "limit_dollars": dollars_exact(limits.dollars),
                "limit_tokens": limits.tokens,
                "limit_steps": limits.steps,
            },
        )
    else:
        row = engine.db.fetch_one("get_budget", {"budget_id": run.budget_id})
    run.ledger = None if row is None else Ledger.from_row(row)


def refresh(run: RunContext) -> None:
    """Re-read the ledger (after a child, which spends from the same row, returns)."""
    if run.ledger is None:
        return
    row = run.engine.db.fetch_one("get_budget", {"budget_id": run.ledger.budget_id})
    if row is not None:
        run.ledger = Ledger.from_row(row)


def gate(run: RunContext, seq: int, step_name: str) -> None:
    """Before a new step: if the budget is used up, wait for a decision instead of running.

    The gate is keyed by the step's position, not journaled as a call of its own, so a
    replay after the decision reaches the same step at the same position."""
    ledger = run.ledger
    if ledger is None or ledger.exhausted() is None:
        return
    engine = run.engine
    refresh(run)
    ledger = run.ledger
    assert ledger is not None
    why = ledger.exhausted()
    if why is None:
        return  # raised meanwhile
    name = f"budget@{seq}"
    ids = {"workflow_id": run.workflow_id, "name": name}
    row = engine.db.fetch_one("get_approval", ids)
    if row is None:
        payload = {"step": step_name, "exhausted": why, **ledger.as_dict()}
        written = engine.db.execute_on(
            run.conn,
            "approval_request",
            {
                **ids,
                "epoch": run.epoch,
                "step_seq": seq,
                "payload": dumps_checked(
                    engine.serializer, payload, "a budget gate", engine.max_payload_bytes
                ),
                "default_approved": False,
                "timeout_seconds": None,
            },
        )
        if written == 0:
            raise StaleOwnerError(run.workflow_id, run.epoch)
        row = engine.db.fetch_one("get_approval", ids)
    assert row is not None
    if row["status"] == "waiting":
        if engine.db.execute_on(run.conn, "suspend_for_approval", {**ids, "epoch": run.epoch}):
            raise WorkflowSuspended(run.workflow_id)
        row = engine.db.fetch_one("get_approval", ids)
        if row is None or row["status"] == "waiting":
            raise StaleOwnerError(run.workflow_id, run.epoch)
    if row["status"] == "approved":
        return  # a person let this step run (usually after raising the budget)
    raise BudgetExceededError(run.workflow_id, step_name, why)
