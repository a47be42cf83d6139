"""@step, @durable.tool and @transaction: run once, journal, replay.

A step replays its record or runs its code, retrying as its policy says, passing the
budget gate first and waiting at the cap gate when a charge is refused; its record, its
charge and (a tool) its call record are one fenced write, sent again while the run's lease
may hold when an outage cuts it off (see journal.outlast). A transaction step commits the
user's SQL and its journal record together, in the system database or through the
application database's `transaction_outputs` (adopted on replay after a crash between
the two commits), and decides which application-database failures retry, which mean lost
ownership, which are an outage, and which are the step's own outcome.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from durable._base.models import Ledger, StepKind
from durable._core.budget import (
    _cap_gate,
    adopt_ledger,
    budget_gate,
    charged_by,
    refresh_ledger,
)
from durable._core.faults import TRANSACTION_OUTPUTS_TAKEN, Fault
from durable._core.heartbeats import begin, begin_attempt, end_attempt
from durable._core.journal import (
    ALREADY_WRITTEN,
    barrier,
    encode_error,
    record,
    replay,
    restore,
    sent,
)
from durable._core.ops import (
    ABORTED,
    CONFLICT_ATTEMPTS,
    AppBegin,
    AppCall,
    AppEnd,
    AppExecute,
    Call,
    Execute,
    Gen,
    Outcome,
    Pause,
    StepScope,
    conflict_backoff,
)
from durable._core.run import Run, _fenced, check_interrupt
from durable.errors import (
    BudgetExceededError,
    DatabaseUnavailableError,
    NondeterminismError,
    SerializationError,
    StaleOwnerError,
    TransactionStepError,
)

if TYPE_CHECKING:
    from durable._base.registry import StepDef

logger = logging.getLogger("durable.protocol")


# What replayed_step returns for a call the journal has no record of.
NOT_JOURNALED: Any = object()


def replayed_step(run: Run, defn: StepDef) -> Any:
    """A step's call as its replay: what its record says it returned (or raises what it
    raised); NOT_JOURNALED, with nothing taken, when the call is new. What `step` does
    first, with no generator to drive: a recovery replays thousands of steps."""
    found = run.journal.replay_next(defn.name)
    if found is None:
        return NOT_JOURNALED
    return replay(run, found, defn.fn)


def step(run: Run, defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Gen[Any]:
    """A step: replay its record, or run it (retrying as its policy says) and journal it."""
    replayed = replayed_step(run, defn)
    if replayed is not NOT_JOURNALED:
        return replayed
    seq, found = run.journal.next_call(defn.name)
    assert found is None  # (replayed_step took it otherwise)
    check_interrupt(run)
    settings = run.settings
    scope = StepScope(
        defn.name,
        charging=True,
        seq=seq,
        kind=defn.kind._value_,  # (not .value: a descriptor call per step)
        heartbeat_timeout=defn.heartbeat_timeout,
    )
    if run.ledger is not None:
        yield from budget_gate(run, seq, defn.name)
    # Counted against the budget from the gate's decision (nothing is yielded in between,
    # so parallel branches cannot all pass a gate that has room for one) until the
    # step's record is answered and its charge is in the run's ledger.
    run.inflight.append(scope)
    try:
        arguments = None
        if defn.kind is StepKind.TOOL:
            # A tool call's arguments are part of its record; checked before it runs.
            arguments = run.dumps(
                {"args": list(args), "kwargs": dict(kwargs)},
                f"the arguments of tool {defn.name!r}",
            )
        settings.crash_point("before_step")
        started = settings.clock.now()
        attempt = refusals = 0
        elapsed = 0.0
        while True:
            attempt += 1
            scope.attempt = attempt
            watched = scope.heartbeat_timeout is not None
            if watched:
                yield from begin_attempt(run, scope, attempt)
            else:
                begin(scope, attempt)
            outcome: Outcome = yield Call(defn.fn, args, kwargs, scope, defn.timeout)
            if watched:
                yield from end_attempt(run, scope, attempt)
            else:
                scope.live = None
            elapsed += outcome.seconds
            exc = outcome.error
            if exc is None:
                break
            if scope.refused is not None and isinstance(exc, BudgetExceededError):
                # A charge or reservation would have passed the cap: nothing of this
                # attempt is recorded; the step waits at the budget gate, and runs again
                # if the budget is raised.
                yield from _cap_gate(run, seq, scope, refusals)
                refusals += 1
                attempt -= 1  # refused by the budget, not failed
                continue
            if isinstance(exc, StaleOwnerError):
                # Refused at a heartbeat: another worker took the workflow over (or the
                # attempt was given up). Nothing more of this run may run or be recorded.
                raise exc
            if defn.retry.should_retry(exc, attempt):
                delay = defn.retry.delay(attempt)
                logger.info(
                    "step %s of %s failed (attempt %d), retrying in %.2f s: %r",
                    defn.name,
                    run.workflow_id,
                    attempt,
                    delay,
                    exc,
                )
                yield Pause(delay)
                elapsed += delay
                check_interrupt(run)  # cancelled during the backoff: no further attempt
                continue
            yield from _record_call(
                run, seq, defn, scope, None, encode_error(exc), attempt, started, arguments, elapsed
            )
            raise exc
        output, value = run.keep(outcome.value, f"the output of step {defn.name!r}", defn.fn)
        settings.crash_point("before_step_record")
        yield from _record_call(
            run, seq, defn, scope, output, None, attempt, started, arguments, elapsed
        )
    finally:
        inflight = run.inflight
        if inflight and inflight[-1] is scope:
            inflight.pop()  # the common case: the last one in (not remove(): __eq__)
        else:
            run.inflight = [s for s in inflight if s is not scope]
    settings.crash_point("after_step_record")
    return value


def _record_call(
    run: Run,
    seq: int,
    defn: StepDef,
    scope: StepScope,
    output: str | None,
    error: str | None,
    attempts: int,
    started: dt.datetime,
    arguments: str | None,
    seconds: float,
) -> Gen[None]:
    """Journal a step; with what it charged and (a tool) its call record, when there is one.

    A plain step of an unbudgeted run is an ordinary (lazy) record. Otherwise the journal
    row, the charge, the tool call and the budget's new totals are one fenced statement:
    a crash keeps all of them or none, so a charge is never lost nor counted twice."""
    dollars, tokens = charged_by(run, scope)
    charged = bool(dollars or tokens)
    if run.budget_id is None and arguments is None and not charged:
        yield from record(
            run, seq, defn.name, defn.kind, output, error, attempts, started, lazy=True
        )
        return
    yield from barrier(run)  # this write is synchronous, so earlier records go first
    op = Execute(
        "record_charged_step",
        {
            "workflow_id": run.workflow_id,
            "epoch": run.epoch,
            "step_seq": seq,
            "step_name": defn.name,
            "kind": defn.kind.value,
            "output": output,
            "error": error,
            "attempts": attempts,
            "started_at": started,
            "budget_id": run.budget_id,
            "dollars": dollars,
            "tokens": tokens,
            "steps": 1 if run.budget_id is not None else 0,
            "arguments": arguments,
            "latency_ms": seconds * 1000.0,
        },
        "one",
        serial=True,
    )
    # Sent again while the lease may hold (see outlast). Found written by the first send,
    # whose answer was lost: the charge is in the budget's ledger once, and the run's copy
    # is read back instead of the totals that answer carried.
    row = yield from sent(run, op, ALREADY_WRITTEN)
    if row is ALREADY_WRITTEN:
        yield from refresh_ledger(run)
        row = {"written": 1, "budget_id": None}
    if row is None or not row["written"]:
        scope.dollars, scope.tokens = Decimal(0), 0
        raise StaleOwnerError(run.workflow_id, run.epoch)
    if row["budget_id"] is not None:
        adopt_ledger(run, Ledger.from_row(row))  # first: see over_cap for the order
    scope.dollars, scope.tokens = Decimal(0), 0


_PASS_THROUGH = (StaleOwnerError, SerializationError, DatabaseUnavailableError, NondeterminismError)


def _app_refuses_writes() -> Gen[bool]:
    """Whether the application database refuses every write (a standby, a database
    read-only by default): an outage to wait out, not one transaction's doing. When the
    question itself fails, the database is as good as gone."""
    try:
        yield AppBegin(None)
        row = yield AppExecute("app_refuses_writes", {}, "one")
    except Exception:
        yield AppEnd(commit=False)
        return True
    yield AppEnd(commit=False)
    return bool(row["refuses"])


def transaction(
    run: Run, defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Gen[Any]:
    """A transaction step: the user's SQL and the step's record commit together.

    When the application database is the system database, the journal row is written in
    the user's own transaction (fenced by epoch): exactly once. When it is another
    database, the record goes to that database's `transaction_outputs` in the same
    transaction, then to the journal; a crash between the two is healed by adopting the
    app-side record on replay."""
    seq, found = run.journal.next_call(defn.name)
    if found is not None:
        return replay(run, found, defn.fn)
    check_interrupt(run)
    yield from barrier(run)
    settings = run.settings
    separate = settings.app_separate
    started = settings.clock.now()
    params: dict[str, Any] = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "step_seq": seq,
        "step_name": defn.name,
        "kind": StepKind.TRANSACTION.value,
        "output": None,
        "error": None,
        "attempts": 1,
        "child_workflow_id": None,
        "started_at": started,
    }
    adopted: str | None = None
    value: Any = None
    attempt = 0
    while True:
        attempt += 1
        recording = False
        try:
            yield AppBegin(defn.isolation_level)
        except Exception as exc:
            # No transaction yet, nothing of the step done: a connection lost at its
            # checkout (the app database restarting) interrupts the run, as any outage.
            fault = settings.classify_app_error(exc)
            if fault is not None and fault.kind is Fault.LOST:
                raise DatabaseUnavailableError(
                    f"lost the database at the start of a transaction: {exc}"
                ) from exc
            raise
        try:
            if separate and not run.first_run:
                # The app database may hold this step's record although the journal does
                # not (a crash between the two commits): adopt it.
                row = yield AppExecute(
                    "app_get_transaction", {"workflow_id": run.workflow_id, "step_seq": seq}, "one"
                )
                if row is not None:
                    if row["step_name"] != defn.name:
                        raise NondeterminismError(run.workflow_id, seq, row["step_name"], defn.name)
                    adopted = row["output"]
            if adopted is None:
                scope = StepScope(defn.name, seq=seq, kind=StepKind.TRANSACTION.value)
                outcome: Outcome = yield AppCall(defn.fn, args, kwargs, scope)
                if outcome.error is not None:
                    raise outcome.error
                params["output"], value = run.keep(
                    outcome.value, f"the output of transaction {defn.name!r}", defn.fn
                )
                settings.crash_point("before_transaction_commit")
                # The record and the COMMIT travel together. Inside the system database
                # the record is fenced by raising when this run lost the workflow (so the
                # COMMIT behind it keeps nothing); in a separate application database its
                # primary key is the fence.
                journal_row = AppExecute(
                    "app_record_transaction" if separate else "record_step_in_app", params
                )
                recording = True
                written = yield AppEnd(commit=True, last=journal_row)
                if written is None:
                    # The step's code ended the transaction: whatever it committed is
                    # beyond recall, and the record has no transaction to go in.
                    raise TransactionStepError(
                        defn.name,
                        "its code ended the transaction itself (conn.commit(), "
                        "conn.rollback(), conn.close(), or a COMMIT or ROLLBACK statement), "
                        "so the step's journal record had no transaction to commit in",
                        "durable commits the transaction with the record: return to commit, "
                        "raise to roll back, and leave the connection open",
                    )
                if written == ABORTED:
                    raise TransactionStepError(
                        defn.name,
                        "its code caught a database error and returned, but the error had "
                        "aborted the transaction, so nothing of it could commit",
                        "let the error propagate (the step fails and rolls back), or run the "
                        "statement that may fail in a savepoint: with conn.begin_nested(): ...",
                    )
                if not separate:
                    _fenced(written, run)
            else:
                yield AppEnd(commit=True)
        except BaseException as exc:
            if isinstance(exc, GeneratorExit):
                raise
            yield AppEnd(commit=False)
            if not isinstance(exc, Exception) or isinstance(exc, _PASS_THROUGH):
                raise
            fault = settings.classify_app_error(exc)
            kind = None if fault is None else fault.kind
            if kind is Fault.READ_ONLY:
                # A standby mid-failover refuses writes with the same error as a
                # transaction the step's code made read-only: ask the server which.
                if (yield from _app_refuses_writes()):
                    kind = Fault.LOST
                elif recording:
                    # The user's code succeeded; the record could not follow it.
                    misuse = TransactionStepError(
                        defn.name,
                        "its code made the transaction read-only (SET TRANSACTION READ "
                        "ONLY), so the step's journal record could not be written in it",
                        "read in a @step instead, or leave the transaction writable",
                    )
                    error = encode_error(misuse)
                    yield from record(
                        run, seq, defn.name, StepKind.TRANSACTION, None, error, 1, started
                    )
                    raise misuse from exc
            if kind is Fault.CONFLICT and attempt < CONFLICT_ATTEMPTS:
                # A serialization failure or a deadlock (SERIALIZABLE isolation, or
                # CockroachDB's default): everything rolled back, the user's writes and
                # the record alike, so the whole transaction runs again, as the database
                # asks. Nothing of the failed attempt was journaled.
                yield Pause(conflict_backoff(attempt))
                continue
            if kind is Fault.FENCE or (separate and fault == TRANSACTION_OUTPUTS_TAKEN):
                # Another owner recorded this position first: our writes rolled back.
                raise StaleOwnerError(run.workflow_id, run.epoch) from exc
            if kind is Fault.LOST:
                # The commit may or may not have landed: interrupted, not failed. Recovery
                # adopts the app-side record if it did (separate database), or finds
                # neither.
                raise DatabaseUnavailableError(
                    f"lost the database in a transaction: {exc}"
                ) from exc
            # The user's transaction rolled back; the failure itself is journaled so a
            # replay raises the same error instead of running the transaction again.
            yield from record(
                run, seq, defn.name, StepKind.TRANSACTION, None, encode_error(exc), 1, started
            )
            raise
        break
    if adopted is not None:
        yield from record(run, seq, defn.name, StepKind.TRANSACTION, adopted, None, 1, started)
        return restore(run, adopted, defn.fn)
    settings.crash_point("after_transaction_commit")
    if separate:
        yield from record(
            run, seq, defn.name, StepKind.TRANSACTION, params["output"], None, 1, started
        )
    return value
