"""The budget: what a run may still spend, and what happens when it may not.

A run draws from its root's ledger. Before a new step the budget gate decides whether it
runs (or waits for a person, keyed by its position); while a step runs, a charge or a
reservation that would pass a limit is refused (the hard cap), counting what every step of
the run now executing holds; and what is left is reported to the workflow's code.

A model call (durable.llm) is decided before it is sent, not after it was paid for: its
worst case is set aside (`reserve_call`: refused, the call is not sent and the step waits
at the cap's gate), and what it really cost is then charged whatever the cap says
(`settle`: the vendor was paid, so the reply is kept and journaled), leaving the next
step's gate to stop what comes after.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from durable._base import labels
from durable._base.models import Budget, Ledger, dollars_exact
from durable._core.gates import gate
from durable._core.ops import Execute, Gen, StepScope
from durable._core.run import Run
from durable.errors import BudgetExceededError, StaleOwnerError, UnboundedModelCallError


def open_ledger(run: Run, limits: Budget | None) -> Gen[None]:
    """Load (or, at a root's first start, create) the run's budget row."""
    if run.budget_id is None:
        return
    if limits is not None and run.budget_id == run.workflow_id:
        row = yield Execute(
            "ensure_budget",
            {
                "budget_id": run.budget_id,
                "limit_dollars": dollars_exact(limits.dollars),
                "limit_tokens": limits.tokens,
                "limit_steps": limits.steps,
                "limit_seconds": limits.seconds,
            },
            "one",
        )
    else:
        row = yield Execute("get_budget", {"budget_id": run.budget_id}, "one")
    run.ledger = None if row is None else Ledger.from_row(row)


def adopt_ledger(run: Run, ledger: Ledger) -> None:
    """Take `ledger` (a budget row a write or a read returned) as the run's copy, unless
    the copy is newer: a late charge's write (from another thread) and the run's own
    records answer in any order. What was spent only grows, so a row that shows less of
    anything than the copy was read before it."""
    with run.deciding:
        held = run.ledger
        if (
            held is not None
            and held.budget_id == ledger.budget_id
            and (
                ledger.spent_dollars < held.spent_dollars
                or ledger.spent_tokens < held.spent_tokens
                or ledger.spent_steps < held.spent_steps
            )
        ):
            return
        run.ledger = ledger


def refresh_ledger(run: Run) -> Gen[None]:
    """Re-read the ledger (after a child, which spends from the same row, returns)."""
    if run.ledger is None:
        return
    row = yield Execute("get_budget", {"budget_id": run.ledger.budget_id}, "one", serial=True)
    if row is not None:
        adopt_ledger(run, Ledger.from_row(row))


def _held(
    scope: StepScope,
    dollars: Decimal = Decimal(0),
    tokens: int = 0,
    reserve_dollars: Decimal = Decimal(0),
    reserve_tokens: int = 0,
) -> tuple[Decimal, int]:
    """What a running step counts against the cap (with an addition): the larger of what
    it charged and what it reserved, since a reservation is an estimate charges use up."""
    return (
        max(scope.dollars + dollars, scope.reserved_dollars + reserve_dollars),
        max(scope.tokens + tokens, scope.reserved_tokens + reserve_tokens),
    )


def with_running_steps(run: Run) -> Ledger:
    """The run's ledger as it will be once the steps of this run executing now have
    recorded: each counts one step and what it holds (_held). Parallel steps of an async
    run pass the gate only while this has room. The running steps are read before the
    ledger, as in over_cap."""
    held = [_held(s) for s in run.inflight if s.charging]
    ledger = run.ledger
    assert ledger is not None
    return replace(
        ledger,
        spent_dollars=ledger.spent_dollars + sum((d for d, _ in held), Decimal(0)),
        spent_tokens=ledger.spent_tokens + sum(t for _, t in held),
        spent_steps=ledger.spent_steps + len(held),
    )


def budget_gate(run: Run, seq: int, step_name: str) -> Gen[None]:
    """Before a new step: if the budget is used up (or its time is), wait for a decision
    instead of running.

    The gate is keyed by the step's position, not journaled as a call of its own, so a
    replay after the decision reaches the same step at the same position. A resumed run
    first looks for a denied gate at this position: a denial ends the step without
    running it again."""
    if run.ledger is None:
        return
    if not run.first_run:
        denied = yield Execute(
            "denied_budget_gate",
            {"workflow_id": run.workflow_id, "name": labels.budget_gate(seq)},
            "one",
        )
        if denied is not None:
            raise BudgetExceededError(run.workflow_id, step_name, denied["comment"] or "denied")
    now = run.settings.clock.now()
    if with_running_steps(run).exhausted(now) is None:
        return
    yield from refresh_ledger(run)
    ledger = with_running_steps(run)
    why = ledger.exhausted(now)
    if why is None:
        return  # raised meanwhile
    payload = run.dumps({"step": step_name, "exhausted": why, **ledger.as_dict()}, "a budget gate")
    decision = yield from gate(run, labels.budget_gate(seq), seq, payload)
    if not decision.approved:
        raise BudgetExceededError(run.workflow_id, step_name, why)
    # Approved: a person let this step run (usually after raising the budget).


def _cap_gate(run: Run, seq: int, scope: StepScope, nth: int) -> Gen[None]:
    """A step refused by the cap waits at gate `_labels.budget_cap_gate(seq, nth)` (the
    n-th refusal at this position: a second refusal after a raise asks again)."""
    why = scope.refused or "the budget"
    with run.deciding:  # the attempt ended: what it charged is final (see charged_by)
        kept = LateCharge(f"{run.epoch}:{seq}:cap{nth}", scope.dollars, scope.tokens)
        scope.dollars, scope.tokens, scope.refused = Decimal(0), 0, None
    if kept.dollars or kept.tokens:
        # What the refused attempt charged before the refusal was paid for: it is kept in
        # the ledger, apart from the step (which is not journaled and may run again).
        yield from write_late_charge(run, scope, kept)
    scope.reserved_dollars, scope.reserved_tokens = Decimal(0), 0
    ledger = run.ledger
    assert ledger is not None
    payload = run.dumps(
        {"step": scope.name, "exhausted": why, "cap": True, **ledger.as_dict()}, "a budget gate"
    )
    decision = yield from gate(run, labels.budget_cap_gate(seq, nth), seq, payload)
    if not decision.approved:
        raise BudgetExceededError(run.workflow_id, scope.name, why)
    yield from refresh_ledger(run)


def over_cap(
    run: Run,
    scope: StepScope,
    dollars: Decimal = Decimal(0),
    tokens: int = 0,
    reserve_dollars: Decimal = Decimal(0),
    reserve_tokens: int = 0,
) -> str | None:
    """Why adding this charge (or reservation) to `scope` would pass a limit, or None.

    Counts what is recorded (the run's ledger) plus what every step of this run now
    executing has charged or reserved (the larger of the two: a reservation is an
    estimate the real charges use up)."""
    if run.ledger is None:
        return None
    # The running steps are read before the ledger: a sync step charging from a worker
    # thread may be deciding while the loop applies a sibling's record, which puts the
    # charge in the ledger before taking it off the step (_record_call). Read in this
    # order, a charge on its way is counted once or twice, never by neither.
    total_dollars, total_tokens = Decimal(0), 0
    steps = run.inflight if any(s is scope for s in run.inflight) else [*run.inflight, scope]
    for step_scope in steps:
        if step_scope is scope:
            d, t = _held(scope, dollars, tokens, reserve_dollars, reserve_tokens)
        else:
            d, t = _held(step_scope)
        total_dollars += d
        total_tokens += t
    ledger = run.ledger
    total_dollars += ledger.spent_dollars
    total_tokens += ledger.spent_tokens
    if ledger.limit_dollars is not None and total_dollars > ledger.limit_dollars:
        return f"dollars: {total_dollars} would pass the limit of {ledger.limit_dollars}"
    if ledger.limit_tokens is not None and total_tokens > ledger.limit_tokens:
        return f"tokens: {total_tokens} would pass the limit of {ledger.limit_tokens}"
    return None


@dataclass(frozen=True, slots=True)
class LateCharge:
    """What an attempt that no longer counts spent (see late): written to the budget's
    ledger on its own, once per `key`."""

    key: str
    dollars: Decimal
    tokens: int


def late(scope: StepScope, attempt: int | None) -> bool:
    """Whether code charging for `scope` as `attempt` (None: code the driver does not run
    as a watched attempt: the step's own thread or task, or a thread it started) no longer
    counts: its attempt was given up, or ended (the step is recording or recorded). What
    it spends was spent all the same, and is charged apart from the step's record."""
    return scope.live is None or (attempt is not None and attempt != scope.live)


def charge(
    run: Run, scope: StepScope, dollars: Decimal, tokens: int, attempt: int | None = None
) -> LateCharge | None:
    """Add to what the step spent, unless it would pass a limit: then nothing is added and
    BudgetExceededError is raised in the step (the hard cap). A charge of an attempt that
    no longer counts (late) is not the step's: it is returned, keyed, to be written to the
    ledger on its own (write_late_charge), past the cap if it must be (it was paid for);
    the next cap check and budget gate of the run count it."""
    if late(scope, attempt):
        if not dollars and not tokens:
            return None
        scope.late_charges += 1
        return LateCharge(f"{run.epoch}:{scope.seq}:{scope.late_charges}", dollars, tokens)
    why = over_cap(run, scope, dollars, tokens)
    if why is not None:
        scope.refused = why
        raise BudgetExceededError(run.workflow_id, scope.name, why)
    scope.dollars += dollars
    scope.tokens += tokens
    return None


def write_late_charge(run: Run, scope: StepScope, spent: LateCharge) -> Gen[None]:
    """Add a late charge to the budget's ledger in a statement of its own, not fenced by
    the step's record nor by the run's epoch (the money was spent, whoever owns the
    workflow now). Its key makes the write idempotent: sent again after an answer was
    lost, it adds nothing more."""
    params: dict[str, Any] = {
        "workflow_id": run.workflow_id,
        "charge_key": spent.key,
        "step_seq": scope.seq,
        "budget_id": run.budget_id,
        "dollars": spent.dollars,
        "tokens": spent.tokens,
    }
    row = yield Execute("add_late_charge", params, "one")
    if row is not None and row["budget_id"] is not None:
        adopt_ledger(run, Ledger.from_row(row))


def charged_by(run: Run, scope: StepScope) -> tuple[Decimal, int]:
    """What a step whose attempts ended charged, for its record. A charge is checked
    (live or late) and added under `run.deciding`, and this reads under it: a charge
    decided while an attempt was live is in the record, and any decided later is late."""
    with run.deciding:
        return scope.dollars, scope.tokens


def reserve(
    run: Run, scope: StepScope, dollars: Decimal, tokens: int, attempt: int | None = None
) -> None:
    """Set aside an estimate before an expensive call; BudgetExceededError (and the call is
    not made) if it does not fit. An attempt that no longer counts (late) may not reserve
    (StaleOwnerError): the call it is about to make is for nobody."""
    if late(scope, attempt):
        raise StaleOwnerError(run.workflow_id, run.epoch)
    why = over_cap(run, scope, reserve_dollars=dollars, reserve_tokens=tokens)
    if why is not None:
        scope.refused = why
        raise BudgetExceededError(run.workflow_id, scope.name, why)
    scope.reserved_dollars += dollars
    scope.reserved_tokens += tokens


def call_limit(run: Run, priced: bool) -> str | None:
    """The limit a model call's cost counts against: "dollar" (a dollar limit, and the
    model has a price), "token" (a token limit), or None (no limit needs to know what the
    call costs: nothing is set aside, and a reply that leaves its usage out is charged
    what it reported)."""
    ledger = run.ledger
    if ledger is None:
        return None
    if ledger.limit_dollars is not None and priced:
        return "dollar"
    if ledger.limit_tokens is not None:
        return "token"
    return None


def reserve_call(
    run: Run,
    scope: StepScope,
    input_tokens: int,
    output_tokens: int | None,
    rates: tuple[Decimal, Decimal] | None,
    bound_field: str,
    attempt: int | None = None,
) -> tuple[Decimal, int]:
    """Before a model call is sent, set aside its worst case: `input_tokens` (an estimate
    of the prompt) plus `output_tokens` (the request's own bound on its output, None when
    it has none), at `rates` (dollars per million input and output tokens; None: the model
    is charged tokens only). Returns what was set aside, to release once the call is
    settled.

    Refused by the cap (BudgetExceededError), the call is not sent and the step waits at
    the cap's gate. Under a limit the call counts against, a call with no output bound
    has no worst case and is refused before it is sent (UnboundedModelCallError): its
    reply could cost any amount, and once paid for it is charged whatever the limit. An
    attempt that no longer counts (late) may not send it (StaleOwnerError)."""
    if late(scope, attempt):
        raise StaleOwnerError(run.workflow_id, run.epoch)
    limit = call_limit(run, rates is not None)
    if limit is None:
        return Decimal(0), 0
    if output_tokens is None:
        raise UnboundedModelCallError(scope.name, bound_field, limit)
    tokens = input_tokens + output_tokens
    dollars = Decimal(0)
    if rates is not None:
        rate_in, rate_out = rates
        dollars = (rate_in * input_tokens + rate_out * output_tokens) / Decimal(1_000_000)
    reserve(run, scope, dollars, tokens, attempt)
    return dollars, tokens


def settle(
    run: Run, scope: StepScope, dollars: Decimal, tokens: int, attempt: int | None = None
) -> LateCharge | None:
    """Charge what a call that was sent cost, with no cap to refuse it: the vendor was
    paid, and refusing the charge would throw the reply away and send the call again once
    the budget is raised. Its worst case was set aside before it was sent, so only what
    that estimate missed can take the total past a limit; the next step's budget gate
    then stops the run. A call settled by an attempt that no longer counts is a late
    charge (see charge)."""
    if late(scope, attempt):
        return charge(run, scope, dollars, tokens, attempt)
    scope.dollars += dollars
    scope.tokens += tokens
    return None


def release(scope: StepScope, dollars: Decimal, tokens: int) -> None:
    """End a reservation (what was charged meanwhile stays charged)."""
    scope.reserved_dollars = max(Decimal(0), scope.reserved_dollars - dollars)
    scope.reserved_tokens = max(0, scope.reserved_tokens - tokens)


def budget_left(run: Run, scope: StepScope | None = None) -> Budget:
    """What the ledger still allows, less what the step now running has charged."""
    ledger = run.ledger
    if ledger is None:
        return Budget()
    spent_dollars = ledger.spent_dollars + (scope.dollars if scope is not None else 0)
    spent_tokens = ledger.spent_tokens + (scope.tokens if scope is not None else 0)
    seconds = None
    if ledger.limit_seconds is not None:
        elapsed = ledger.elapsed(run.settings.clock.now())
        seconds = max(0.0, float(ledger.limit_seconds) - elapsed)
    return Budget(
        dollars=None
        if ledger.limit_dollars is None
        else max(0.0, float(ledger.limit_dollars - spent_dollars)),
        tokens=None if ledger.limit_tokens is None else max(0, ledger.limit_tokens - spent_tokens),
        steps=None
        if ledger.limit_steps is None
        else max(0, ledger.limit_steps - ledger.spent_steps),
        seconds=seconds,
    )
