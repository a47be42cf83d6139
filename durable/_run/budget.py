"""The budget ledger: spend that a crash cannot lose and a resume cannot reset.

`@durable.workflow(budget=durable.Budget(dollars=5.0, tokens=2_000_000, steps=500))`
gives a workflow tree one ledger (a `budgets` row keyed by the root's id; children draw
from it). Inside a step, `durable.charge(dollars=..., tokens=...)` adds to what the step
spent; the total is written with the step's journal row, in one fenced statement, together
with one `charges` row. So a crash either loses the step and its charge together (the step
runs again and charges again: the money of a lost attempt is not counted twice) or keeps
both; a replayed step returns its journaled output and charges nothing.

The limits are a hard cap: a charge that would take the total past a limit is refused
inside the step (BudgetExceededError, nothing recorded for it), and `durable.reserve()`
sets an estimate aside before an expensive call, refusing it before the call is made. A
step refused either way is not journaled; it waits at the budget gate and runs again if
the budget is raised. `Budget(seconds=...)` limits wall-clock time from the tree's first
start, across crashes and waits.

Before each new step the run compares what was spent with the limits. When the budget is
used up, the step does not run: the workflow asks for a decision at an approval gate
named after the step's position (`_labels.budget_gate`) and suspends.
`engine.raise_budget(...)` raises the limits and approves the gate; denying it raises
BudgetExceededError in the workflow. The decisions are in `_core` (`open_ledger`,
`budget_gate`); these are the public functions.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal

from durable import _core as protocol
from durable._base.models import Budget, Ledger, check_amount, dollars_exact
from durable._core import LateCharge, Run, StepScope
from durable._run.context import current_attempt, current_run, current_step
from durable._run.late_charges import write_late
from durable._run.late_charges_async import write_late_async
from durable.errors import NotInWorkflowError

__all__ = [
    "Budget",
    "Ledger",
    "Reservation",
    "budget_left",
    "call_limit",
    "charge",
    "dollars_exact",
    "reserve",
    "reserve_call",
    "settle",
]


# The background writes of late charges made on an event loop, referenced until they end.
_writing: set[asyncio.Task[None]] = set()


def charge(*, dollars: float = 0.0, tokens: int = 0) -> None:
    """Record what the current step spent (an LLM call's price and tokens, say).

    Written with the step's journal row, so it is counted exactly once however often the
    process crashes; a replayed step does not charge again. What a failed attempt charged
    before a retry counts too (the money was spent), and so does what an attempt that was
    given up (its `timeout`, its `heartbeat_timeout`) charges when its call returns late:
    that is written to the budget's ledger on its own, and the run's next cap check and
    budget gate count it. Call it from a @step or @durable.tool."""
    run, scope = current_run.get(), current_step.get()
    if run is None or scope is None or not scope.charging:
        raise NotInWorkflowError(
            "durable.charge() records what a step spent, with that step's journal row: call "
            "it inside a @durable.step or @durable.tool of a running workflow"
        )
    check_amount("dollars", dollars, whole=False)
    check_amount("tokens", tokens, whole=True)
    attempt = current_attempt.get()
    with run.deciding:  # see Run.deciding: checked and added at once
        late = protocol.charge(run, scope, Decimal(str(dollars)), int(tokens), attempt)
    if late is not None:
        _write_late(run, scope, late)


def _write_late(run: Run, scope: StepScope, late: LateCharge) -> None:
    """Write the charge of an attempt that no longer counts (see _core.charge): on an
    event loop in the background, else now, sent again while the database is away."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        write_late(run, scope, late)
        return
    task = loop.create_task(write_late_async(run, scope, late))
    _writing.add(task)
    task.add_done_callback(_writing.discard)


class Reservation:
    """An estimate set aside by durable.reserve(); as a context manager its block is the
    call it covers (the reservation ends with the block, charges made in it stay)."""

    def __init__(self, run: Run, scope: StepScope, dollars: Decimal, tokens: int) -> None:
        self._run = run
        self._scope = scope
        self.dollars = dollars
        self.tokens = tokens
        self._open = True

    def release(self) -> None:
        if self._open:
            self._open = False
            with self._run.deciding:
                protocol.release(self._scope, self.dollars, self.tokens)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def reserve(*, dollars: float = 0.0, tokens: int = 0) -> Reservation:
    """Set aside an estimate of what the next call will cost, before making it.

    If the estimate does not fit in what the budget has left (counting what this run's
    running steps charged or reserved), BudgetExceededError is raised here, so the call
    is not made; the step then waits at the budget gate. The real cost is what
    `durable.charge()` records; the reservation only holds room until the step records
    (or, used as `with durable.reserve(...):`, until the block ends). An attempt that was
    given up, or whose step has recorded, may not reserve: StaleOwnerError, and its call
    is not made. Call it from a @step or @durable.tool."""
    run, scope = current_run.get(), current_step.get()
    if run is None or scope is None or not scope.charging:
        raise NotInWorkflowError(
            "durable.reserve() sets aside part of a workflow's budget for a step's call: "
            "call it inside a @durable.step or @durable.tool of a running workflow"
        )
    check_amount("dollars", dollars, whole=False)
    check_amount("tokens", tokens, whole=True)
    amount, count = Decimal(str(dollars)), int(tokens)
    attempt = current_attempt.get()
    with run.deciding:
        protocol.reserve(run, scope, amount, count, attempt)
    return Reservation(run, scope, amount, count)


def call_limit(priced: bool) -> str | None:
    """The limit a model call's cost counts against ("dollar", "token"), or None (see
    _core.call_limit). Called inside a running step."""
    run = current_run.get()
    return None if run is None else protocol.call_limit(run, priced)


def reserve_call(
    input_tokens: int,
    output_tokens: int | None,
    rates: tuple[Decimal, Decimal] | None,
    bound_field: str,
) -> Reservation | None:
    """Set aside a model call's worst case before it is sent (durable.llm; see
    _core.reserve_call). None outside a charging step: the call is a plain call."""
    run, scope = current_run.get(), current_step.get()
    if run is None or scope is None or not scope.charging:
        return None
    with run.deciding:
        dollars, tokens = protocol.reserve_call(
            run, scope, input_tokens, output_tokens, rates, bound_field, current_attempt.get()
        )
    return Reservation(run, scope, dollars, tokens)


def settle(dollars: Decimal, tokens: int) -> None:
    """Charge what a model call that was sent cost, past the cap if it must be: it was
    paid for (see _core.settle). Called inside a charging step."""
    run, scope = current_run.get(), current_step.get()
    if run is None or scope is None or not scope.charging:
        raise NotInWorkflowError("a model call is settled inside the step that made it")
    attempt = current_attempt.get()
    with run.deciding:
        late = protocol.settle(run, scope, dollars, tokens, attempt)
    if late is not None:
        _write_late(run, scope, late)


def budget_left() -> Budget:
    """What the workflow's budget still allows (None: unlimited, or no budget)."""
    run = current_run.get()
    if run is None:
        raise NotInWorkflowError(
            "durable.budget_left() reads a workflow's budget: call it inside a workflow"
        )
    return protocol.budget_left(run, current_step.get())
