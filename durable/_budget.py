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
approves the gate; denying it raises BudgetExceededError in the workflow. The decisions
are in `_protocol` (`open_ledger`, `budget_gate`); these are the public functions.
"""

from __future__ import annotations

from decimal import Decimal

from durable import _protocol as protocol
from durable._context import current_run, current_step
from durable._models import Budget, Ledger, check_amount, dollars_exact
from durable.errors import NotInWorkflowError

__all__ = ["Budget", "Ledger", "budget_left", "charge", "dollars_exact"]


def charge(*, dollars: float = 0.0, tokens: int = 0) -> None:
    """Record what the current step spent (an LLM call's price and tokens, say).

    Written with the step's journal row, so it is counted exactly once however often the
    process crashes; a replayed step does not charge again. What a failed attempt charged
    before a retry counts too (the money was spent). Call it from a @step or
    @durable.tool."""
    scope = current_step.get()
    if current_run.get() is None or scope is None or not scope.charging:
        raise NotInWorkflowError(
            "durable.charge() records what a step spent, with that step's journal row: call "
            "it inside a @durable.step or @durable.tool of a running workflow"
        )
    check_amount("dollars", dollars, whole=False)
    check_amount("tokens", tokens, whole=True)
    protocol.charge(scope, Decimal(str(dollars)), int(tokens))


def budget_left() -> Budget:
    """What the workflow's budget still allows (None: unlimited, or no budget)."""
    run = current_run.get()
    if run is None:
        raise NotInWorkflowError(
            "durable.budget_left() reads a workflow's budget: call it inside a workflow"
        )
    return protocol.budget_left(run, current_step.get())
