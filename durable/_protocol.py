"""The pure core: every replay-or-execute decision of a workflow run, and nothing else.

A run walks its journal in call order: the n-th journaled call gets position n. If the
journal has a record at n, the call replays it (after checking the name, so changed code
cannot read another step's output); if not, it executes. Around that sit the rest of the
decisions: durability barriers, retries with backoff, the effect state machine (intent ->
pending -> applied, reconciliation, refused key reuse), the one gate that approvals and
the budget share, waits that suspend, compensations, and the finish.

Each operation is a generator, in the style of psycopg's `generators.py`: it yields
operations (`Execute` a named statement, `Call` user code, `Pause`, `RunChild`, app
transaction steps, ...) and receives their results; it never touches a connection, a
thread or a clock of its own. A driver performs the operations: `_driver.py` for
ordinary functions; an async driver runs the same generators with `await`. So each
decision exists once, and the unit tests drive these generators with no database at all
(`tests/unit/`).
"""

from __future__ import annotations

import builtins
import datetime as dt
import hashlib
import json
import logging
import random
import traceback as tb
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from durable import _labels as labels
from durable._models import (
    ApprovalStatus,
    Budget,
    Decision,
    EffectStatus,
    Ledger,
    StepKind,
    StepRecord,
    WorkflowStatus,
    dollars_exact,
)
from durable._names import check_name
from durable.errors import (
    ApprovalDeniedError,
    BudgetExceededError,
    DatabaseUnavailableError,
    IdempotencyKeyReusedError,
    NondeterminismError,
    SerializationError,
    StaleOwnerError,
    StepError,
    StreamClosedError,
    TransactionStepError,
    WorkflowCancelledError,
    WorkflowInterrupted,
    WorkflowSuspended,
    WorkflowTimeoutError,
)
from durable.serialization import Serializer, dumps_checked, faithful, rebuild, return_type

if TYPE_CHECKING:
    from durable._clock import Clock
    from durable._registry import StepDef, WorkflowDef

logger = logging.getLogger("durable.protocol")

T = TypeVar("T")

# -- operations: what a generator asks of its driver --------------------------------------------

Fetch = Literal["count", "one", "all"]


@dataclass(slots=True)
class Execute:
    """Run a named statement on the run's system-database connection (autocommit: one
    statement, one commit). Sends back the row count, the first row or all rows.

    `serial`: a statement that reads or writes the run's budget ledger. Parallel branches
    of an async run use connections of their own, so their answers could arrive in any
    order; the driver sends a run's serial statements one at a time, so each answer is
    applied to the run's copy of the ledger in the order the database committed them (a
    charge is never counted by neither copy nor by both)."""

    name: str
    params: dict[str, Any]
    fetch: Fetch = "count"
    serial: bool = False


@dataclass(slots=True)
class WriteSteps:
    """Journal many step records in one statement; sends back the workflow id of each row
    written (a fence refuses rows of runs that lost ownership). With `finish` (the
    finish_workflow parameters of the rows' one run), the run's outcome is written in the
    same statement: all of it or, if the run lost ownership, none."""

    rows: list[dict[str, Any]]
    finish: dict[str, Any] | None = None


@dataclass(slots=True)
class Enqueue:
    """Hand a step record to the background writer (async durability)."""

    row: dict[str, Any]


@dataclass(slots=True)
class AwaitWriter:
    """Wait until the background writer has written every record this run queued; the
    driver raises StaleOwnerError if the database refused them."""


@dataclass(slots=True)
class StepScope:
    """A step whose user code is running: the driver makes it the current step (a context
    variable) for the call, so decorated calls inside it are plain calls, and what the
    code charges is counted for this step alone (parallel steps of one run charge apart).
    `charging`: durable.charge() is allowed (steps and tools)."""

    name: str
    charging: bool = False
    dollars: Decimal = Decimal(0)
    tokens: int = 0
    # What durable.reserve() set aside (counted until the step records, or the
    # reservation's block ends), and why a charge or reservation was refused by the cap.
    reserved_dollars: Decimal = Decimal(0)
    reserved_tokens: int = 0
    refused: str | None = None
    # Where the step is in the journal, what it is and which attempt runs (for its span);
    # seq -1: code that is no journaled position of its own.
    seq: int = -1
    kind: str = "step"
    attempt: int = 1


@dataclass(slots=True)
class Call:
    """Call user code; sends back an Outcome (the driver catches Exception, and throws
    anything else, such as a suspension or a KeyboardInterrupt, into the generator).
    `scope`: the step the code runs as (None: the workflow's own body, a compensation or
    a reconcile function). `timeout`: an attempt running longer is cancelled and fails
    with StepTimeoutError (async code only). `body`: the workflow function itself, whose
    task waits on its branches rather than running a durable call of its own (see Park).
    """

    fn: Callable[..., Any]
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    scope: StepScope | None = None
    timeout: float | None = None
    body: bool = False


# How many times a transaction step runs when the database reports a serialization
# failure or a deadlock (SQLSTATE 40001, 40P01) before the error is the step's outcome.
CONFLICT_ATTEMPTS = 10


def conflict_backoff(attempt: int) -> float:
    """Seconds to wait before attempt `attempt + 1` after a conflict: 2 ms doubling to
    0.2 s, with jitter so that two transactions that collided do not collide again."""
    return min(0.2, 0.002 * 2.0 ** (attempt - 1)) * (0.5 + random.random())


@dataclass(slots=True)
class Pause:
    """Wait in place (a retry's backoff, a sleep too short to suspend for)."""

    seconds: float


@dataclass(slots=True)
class RunChild:
    """Run (or resume, or wait for) a child workflow to its end; sends back an Outcome."""

    defn: WorkflowDef
    workflow_id: str
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    parent: tuple[str, int]


@dataclass(slots=True)
class AppBegin:
    """Open a transaction on the application database (for a @transaction step)."""

    isolation_level: str | None


@dataclass(slots=True)
class AppExecute:
    """Run a named statement inside the open application transaction."""

    name: str
    params: dict[str, Any]
    fetch: Fetch = "count"


@dataclass(slots=True)
class AppCall:
    """Call the user's transaction function with the open connection first; sends back an
    Outcome."""

    fn: Callable[..., Any]
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    scope: StepScope | None = None


ABORTED = "aborted"  # AppEnd's answer for a transaction found in error


@dataclass(slots=True)
class AppEnd:
    """Commit (or roll back) the open application transaction. A rollback with nothing
    open does nothing.

    `last`: a statement sent in one pipeline with the COMMIT (one round trip for both);
    if it fails, nothing commits and its error is raised. Sends back its row count; None
    when no transaction was open any more (the step's code ended it, through SQLAlchemy
    or with a COMMIT or ROLLBACK of its own); ABORTED, rolled back and nothing sent, when
    the transaction was in error (the step's code caught a database error and went on)."""

    commit: bool
    last: AppExecute | None = None


@dataclass(slots=True)
class Park:
    """Before a branch parks the workflow (a gate, a sleep or a wait for a message that
    suspends): wait until no other branch of the run is inside a durable call and no
    other branch is parking. A suspension ends the run: a sibling still running a step
    would have its record refused and its code run again on resume (a model call paid
    twice). Sends back True when a sibling parked the run meanwhile: this branch's wait
    then joins that suspension instead of writing one. A sync run has one branch: the
    driver sends back False at once."""


@dataclass(slots=True)
class Join:
    """Wait until every other branch of this run has ended: the tasks an async workflow
    started (asyncio.gather) that are still making durable calls after its body returned.
    A sync run has none."""


Op = (
    Execute
    | WriteSteps
    | Enqueue
    | AwaitWriter
    | Call
    | Pause
    | RunChild
    | AppBegin
    | AppExecute
    | AppCall
    | AppEnd
    | Park
    | Join
)
Gen = Generator[Op, Any, T]


@dataclass(slots=True)
class Outcome:
    """What user code did: returned `value`, or raised `error`, in `seconds`."""

    value: Any = None
    error: Exception | None = None
    seconds: float = 0.0


# -- the run's state -----------------------------------------------------------------------------


@dataclass
class Journal:
    """The recorded steps of one workflow run and the position of the next call."""

    workflow_id: str
    records: dict[int, StepRecord] = field(default_factory=dict)
    next_seq: int = 0

    @classmethod
    def from_records(cls, workflow_id: str, records: Iterable[StepRecord]) -> Journal:
        return cls(workflow_id, {r.step_seq: r for r in records})

    @property
    def is_fresh(self) -> bool:
        """True when nothing is recorded, so no call can replay (no lookups needed)."""
        return not self.records

    def next_call(self, step_name: str) -> tuple[int, StepRecord | None]:
        """Assign the next position; return the record to replay there, if any."""
        seq = self.next_seq
        self.next_seq += 1
        if not self.records:
            return seq, None
        record = self.records.get(seq)
        if record is not None and record.step_name != step_name:
            raise NondeterminismError(self.workflow_id, seq, record.step_name, step_name)
        return seq, record


def _never_crash(name: str) -> None:
    return None


def _no_request(workflow_id: str, epoch: int) -> str | None:
    return None


def _no_fault(exc: BaseException) -> str | None:
    return None


def _no_compensation(effect_name: str) -> Callable[..., Any] | None:
    return None


@dataclass(frozen=True)
class Settings:
    """What every run of one engine shares. Everything here is injected, so the core reads
    no environment, owns no clock and knows no database driver.

    clock: where time is read (a durable.Clock).
    app_separate: the application database is not the system database, so a transaction
        step's record goes to the app database first (and is adopted from there).
    compensation_of: the undo registered for an effect name, if any.
    crash_point: called at the worst moments of a run; crash tests arm it to SIGKILL.
    cancel_request: the reason this executor was asked to stop a run (a workflow at an
        epoch: a request for an earlier run of a resumed workflow is not this run's).
    classify_app_error: how the driver sees an application-database error: "lost" (the
        connection), "conflict" (a serialization failure or deadlock: retry the
        transaction), "unique:<constraint>", or None.
    stream_channel: the NOTIFY channel that wakes stream readers.
    executor_id: the executor running the runs (an attribute of their spans).
    lease_seconds: how long a claim holds without renewal (see reclaim).
    """

    serializer: Serializer
    max_payload_bytes: int
    clock: Clock
    app_separate: bool = False
    compensation_of: Callable[[str], Callable[..., Any] | None] = _no_compensation
    crash_point: Callable[[str], None] = _never_crash
    cancel_request: Callable[[str, int], str | None] = _no_request
    classify_app_error: Callable[[BaseException], str | None] = _no_fault
    stream_channel: str = "durable_streams"
    executor_id: str = ""
    lease_seconds: float = 30.0


@dataclass
class Run:
    """The state of one executing workflow run. `conn` and `host` belong to the driver."""

    settings: Settings
    workflow_id: str
    name: str
    epoch: int
    journal: Journal
    mode: str = "sync"
    conn: Any = None
    host: Any = None
    # True only for the run that created the workflow: nothing can have been written for
    # it before, so lookups of half-finished work (an app-side transaction record, an
    # effect's intent) are skipped. A claimed run, even with an empty journal, looks.
    first_run: bool = False
    # An async def workflow, run by the async driver on an event loop; `branches` is the
    # driver's record of the tasks making durable calls for it.
    is_async: bool = False
    branches: Any = None
    # Set once a branch of this run parked the workflow (Park): the run is over, and a
    # branch that reaches user code after it stops instead (its record would be refused).
    parked: bool = False
    # Exit mode: step records not yet written.
    pending: list[dict[str, Any]] = field(default_factory=list)
    # Undo actions of applied effects, in the order they were registered (a saga). Rebuilt
    # deterministically on replay, because replayed effects register them again.
    compensations: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = field(
        default_factory=list
    )
    approvals_asked: dict[str, int] = field(default_factory=dict)
    # Per stream key: the offset of the next value, and the keys closed (rebuilt by replay).
    stream_offsets: dict[str, int] = field(default_factory=dict)
    closed_streams: set[str] = field(default_factory=set)
    # When the workflow times out (from its first start), and why it was asked to stop if
    # it was when claimed. `stopping` is set while compensations of a cancel run, so that
    # they are not interrupted in turn.
    deadline: dt.datetime | None = None
    cancel_reason: str | None = None
    stopping: bool = False
    # The budget this run draws from (its root's id), the run's copy of that ledger, and
    # the steps of this run executing now (their charges and reservations count against
    # the cap before they are recorded; parallel async steps are several).
    budget_id: str | None = None
    ledger: Ledger | None = None
    inflight: list[StepScope] = field(default_factory=list)
    # The working state (durable.state) and the conversation turns, as of this point of
    # the run: rebuilt by replay, since every update is a journaled call.
    state: str | None = None
    turns: list[Any] = field(default_factory=list)
    # When this run's claim was last proven (see reclaim): the count of doubts on this
    # process's claims then (Outage.doubts), and the time (time.monotonic()).
    doubts_seen: int = 0
    proven_at: float = 0.0
    # The trace the workflow belongs to (stored when it was created), and whether this run
    # has a recording span (then each step attempt gets one too).
    trace_context: str | None = None
    traced: bool = False

    def dumps(self, value: Any, what: str) -> str:
        s = self.settings
        return dumps_checked(s.serializer, value, what, s.max_payload_bytes)

    def loads(self, text: str | None) -> Any:
        return None if text is None else self.settings.serializer.loads(text)

    def keep(self, value: Any, what: str, fn: Callable[..., Any]) -> tuple[str, Any]:
        """Serialize what `fn` returned, and the value a replay will see (handed out now
        too, so a first run and a replay never differ). Raises before anything is written
        if it cannot be stored, or would not read back the same."""
        s = self.settings
        text = dumps_checked(s.serializer, value, what, s.max_payload_bytes)
        return text, faithful(s.serializer, value, text, return_type(fn), what)


# -- errors as stored ------------------------------------------------------------------------------


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a __str__ that raises must not lose the failure itself
        return f"<{type(exc).__qualname__} whose str() raised>"


def _trace(exc: BaseException) -> str:
    try:
        return "".join(tb.format_exception(exc))
    except Exception:
        return (
            "".join(tb.format_tb(exc.__traceback__)) + f"{type(exc).__qualname__}: {_text(exc)}\n"
        )


def encode_error(exc: BaseException) -> str:
    """Errors are always stored as JSON, whatever the value serializer is. An exception
    whose str() raises is still recorded (with a stand-in message)."""
    cls = type(exc)
    return json.dumps(
        {
            "type": f"{cls.__module__}.{cls.__qualname__}",
            "message": _text(exc),
            "traceback": _trace(exc),
        }
    )


def decode_error(text: str) -> tuple[str, str, str]:
    data = json.loads(text)
    return str(data.get("type", "")), str(data.get("message", "")), str(data.get("traceback", ""))


def rebuild_error(step_name: str, text: str) -> BaseException:
    """The exception to raise when replaying a failed step.

    Built-in exception types are rebuilt (they take a message and run no user code);
    anything else becomes a StepError carrying the recorded type, message and traceback.
    """
    error_type, message, trace = decode_error(text)
    module, _, qualname = error_type.rpartition(".")
    if module == "builtins":
        cls = getattr(builtins, qualname, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                rebuilt = cls(message)
            except Exception:
                pass
            else:
                rebuilt.__cause__ = StepError(step_name, error_type, message, trace)
                return rebuilt
    return StepError(step_name, error_type, message, trace)


def replay(run: Run, record: StepRecord, fn: Callable[..., Any] | None = None) -> Any:
    """Return (or raise) what a journaled call returned (or raised) the first time: the
    stored value, rebuilt as `fn`'s return type when it declares one (see Run.keep)."""
    if record.error is not None:
        raise rebuild_error(record.step_name, record.error)
    return restore(run, record.output, fn)


def restore(run: Run, text: str | None, fn: Callable[..., Any] | None) -> Any:
    """A stored value as a replay sees it (the same value Run.keep handed out)."""
    if text is None:
        return None
    value = run.settings.serializer.loads(text)
    if fn is None:
        return value
    annotation = return_type(fn)
    if annotation is None:
        return value
    try:
        return rebuild(value, annotation)
    except Exception:
        # Journaled by code with another annotation: the stored value, as it is.
        return value


# -- stopping ------------------------------------------------------------------------------------

TIMEOUT_REASON = "timeout"


def stop_reason(run: Run) -> str | None:
    """Why this run must stop at its next new call (a cancel or the timeout), or None."""
    if run.stopping:
        return None
    reason = run.settings.cancel_request(run.workflow_id, run.epoch) or run.cancel_reason
    if reason is not None:
        return reason
    if run.deadline is not None and run.settings.clock.now() >= run.deadline:
        return TIMEOUT_REASON
    return None


def check_interrupt(run: Run) -> None:
    """Stop here if the workflow was cancelled or is past its timeout.

    Called before every new (unjournaled) step or wait, so cancellation is seen at the next
    boundary; replayed calls never stop, so a resumed run reaches the same point first. The
    cancel request is one lookup (the engine polls for requests); the timeout a clock read.
    """
    reason = stop_reason(run)
    if reason is not None:
        raise WorkflowInterrupted(run.workflow_id, reason, reason == TIMEOUT_REASON)


def reclaim(run: Run, doubts: int, renewed_at: float, now: float) -> Execute | None:
    """The statement that proves a run still holds its workflow before its code runs, when
    its lease may have lapsed since the claim was last proven; None otherwise (the cost in
    the common case is two comparisons).

    A lease lapses when nobody renews it: while the database is down, or while the
    heartbeat is starved or late. A run that waited meanwhile (queued behind busy
    threads, or blocked on a connection) may have lost its workflow to another worker,
    which may even have finished it. Its fenced writes would be refused, but only after
    its next step's code had run again, in the world; and an effect's call could overlap
    the new owner's. So it renews its lease by its epoch first: no row means it is no
    longer the owner.

    doubts: how many outages ended and heartbeat gaps of half a lease were seen in this
    process (Outage.doubts); renewed_at: when the heartbeat last renewed every held lease;
    now: time.monotonic(). The driver raises StaleOwnerError on no row."""
    fresh = max(run.proven_at, renewed_at)
    if doubts == run.doubts_seen and now - fresh < run.settings.lease_seconds / 2:
        return None
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "lease_seconds": run.settings.lease_seconds,
    }
    return Execute("renew_claim", params, "one")


def _fenced(count: int, run: Run) -> None:
    if count == 0:
        raise StaleOwnerError(run.workflow_id, run.epoch)


# -- journal writes and durability barriers --------------------------------------------------------


def barrier(run: Run) -> Gen[None]:
    """Write every record the run still holds: the barrier before an effect, transaction,
    child, wait or final status, in every durability mode."""
    if run.mode == "exit":
        if not run.pending:
            return
        rows, run.pending = run.pending, []
        written = yield WriteSteps(rows)
        if len(written) < len(rows):
            raise StaleOwnerError(run.workflow_id, run.epoch)
    elif run.mode == "async":
        yield AwaitWriter()


def record(
    run: Run,
    seq: int,
    name: str,
    kind: StepKind,
    output: str | None,
    error: str | None = None,
    attempts: int = 1,
    started: dt.datetime | None = None,
    child_id: str | None = None,
    *,
    lazy: bool = False,
) -> Gen[None]:
    """Journal one call. `lazy` (plain steps, state and turns) lets the run's durability
    mode defer the write; every other record is a barrier and first writes what the run
    still holds."""
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "step_seq": seq,
        "step_name": name,
        "kind": kind.value,
        "output": output,
        "error": error,
        "attempts": attempts,
        "child_workflow_id": child_id,
        "started_at": started,
    }
    if run.mode != "sync":
        if lazy:
            if run.mode == "exit":
                run.pending.append(params)
            else:
                yield Enqueue(params)
            return
        yield from barrier(run)
    _fenced((yield Execute("record_step", params)), run)


# -- @step and @durable.tool -----------------------------------------------------------------


def step(run: Run, defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Gen[Any]:
    """A step: replay its record, or run it (retrying as its policy says) and journal it."""
    seq, found = run.journal.next_call(defn.name)
    if found is not None:
        return replay(run, found, defn.fn)
    check_interrupt(run)
    settings = run.settings
    scope = StepScope(defn.name, charging=True, seq=seq, kind=defn.kind.value)
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
            outcome: Outcome = yield Call(defn.fn, args, kwargs, scope, defn.timeout)
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
        run.inflight = [s for s in run.inflight if s is not scope]
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
    charged = bool(scope.dollars or scope.tokens)
    if run.budget_id is None and arguments is None and not charged:
        yield from record(
            run, seq, defn.name, defn.kind, output, error, attempts, started, lazy=True
        )
        return
    yield from barrier(run)  # this write is synchronous, so earlier records go first
    row = yield Execute(
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
            "dollars": scope.dollars,
            "tokens": scope.tokens,
            "steps": 1 if run.budget_id is not None else 0,
            "arguments": arguments,
            "latency_ms": seconds * 1000.0,
        },
        "one",
        serial=True,
    )
    if row is None or not row["written"]:
        scope.dollars, scope.tokens = Decimal(0), 0
        raise StaleOwnerError(run.workflow_id, run.epoch)
    if row["budget_id"] is not None:
        run.ledger = Ledger.from_row(row)  # first: see over_cap for the order
    scope.dollars, scope.tokens = Decimal(0), 0


# -- @transaction ----------------------------------------------------------------------------------

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
        yield AppBegin(defn.isolation_level)
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
            if fault == "read_only":
                # A standby mid-failover refuses writes with the same error as a
                # transaction the step's code made read-only: ask the server which.
                if (yield from _app_refuses_writes()):
                    fault = "lost"
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
            if fault == "conflict" and attempt < CONFLICT_ATTEMPTS:
                # A serialization failure or a deadlock (SERIALIZABLE isolation, or
                # CockroachDB's default): everything rolled back, the user's writes and
                # the record alike, so the whole transaction runs again, as the database
                # asks. Nothing of the failed attempt was journaled.
                yield Pause(conflict_backoff(attempt))
                continue
            if fault == "fence" or (separate and fault == "unique:transaction_outputs_pkey"):
                # Another owner recorded this position first: our writes rolled back.
                raise StaleOwnerError(run.workflow_id, run.epoch) from exc
            if fault == "lost":
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


# -- child workflows -------------------------------------------------------------------------------


def child(run: Run, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Gen[Any]:
    """A workflow called from a workflow: a child with a deterministic id, whose outcome is
    journaled as one call of the parent."""
    seq, found = run.journal.next_call(defn.name)
    if found is not None:
        return replay(run, found, defn.fn)
    check_interrupt(run)
    child_id = labels.child_id(run.workflow_id, seq)
    yield from barrier(run)
    started = run.settings.clock.now()
    outcome: Outcome = yield RunChild(defn, child_id, args, kwargs, (run.workflow_id, seq))
    exc = outcome.error
    if exc is not None:
        if isinstance(exc, StaleOwnerError | DatabaseUnavailableError):
            raise exc
        if isinstance(exc, WorkflowCancelledError):
            # Cancelled with its parent: the parent stops too, without journaling the
            # child's outcome, so a resume of the parent runs the child again.
            yield from _stop_if_asked(run)
        yield from record(
            run, seq, defn.name, StepKind.CHILD, None, encode_error(exc), 1, started, child_id
        )
        raise exc
    output, value = run.keep(outcome.value, f"the output of child workflow {defn.name!r}", defn.fn)
    yield from record(run, seq, defn.name, StepKind.CHILD, output, None, 1, started, child_id)
    if run.ledger is not None:
        yield from refresh_ledger(run)  # the child spent from the same ledger
    return value


def child_started(run: Run, name: str) -> tuple[int, str | None]:
    """A child started (or enqueued) without waiting for it: its position, and the id
    journaled there if this is a replay."""
    seq, found = run.journal.next_call(name)
    if found is None:
        return seq, None
    return seq, found.child_workflow_id


def record_child_started(run: Run, seq: int, name: str, workflow_id: str) -> Gen[None]:
    output = run.settings.serializer.dumps(workflow_id)
    yield from record(run, seq, name, StepKind.CHILD, output, None, 1, None, workflow_id)


def _stop_if_asked(run: Run) -> Gen[None]:
    """Read this run's cancel request from the database now (not waiting for the poll)."""
    row = yield Execute("get_cancel_request", {"workflow_id": run.workflow_id}, "one")
    if row is not None and row["cancel_reason"] is not None:
        run.cancel_reason = row["cancel_reason"]
        check_interrupt(run)


# -- one run: the workflow function, then its outcome ----------------------------------------------


def workflow(
    run: Run, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Gen[Any]:
    """Run the workflow function under this claim and write its outcome.

    Returns the function's value or raises its exception (after recording it). A
    StaleOwnerError, a DatabaseUnavailableError or a BaseException such as a suspension
    leaves the status alone: its owner (or recovery) decides what happens next."""
    yield from open_ledger(run, defn.budget)
    try:
        outcome: Outcome = yield Call(defn.fn, args, kwargs, body=True)
    except WorkflowInterrupted as stop:
        yield Join()  # branches still running stop at their next step or wait
        raise (yield from _stop(run, defn, stop)) from None
    except WorkflowSuspended:
        yield Join()  # the other branches waiting to park join the suspension
        raise
    # The outcome is written once nothing of the run is still running: a branch that
    # applies an effect after a sibling failed is compensated with the rest.
    yield Join()
    exc = outcome.error
    if exc is not None:
        if isinstance(exc, StaleOwnerError):
            logger.warning(
                "workflow %s: lost ownership (epoch %d), stopping", run.workflow_id, run.epoch
            )
            raise exc
        if isinstance(exc, DatabaseUnavailableError):
            raise exc  # interrupted, not failed: handed back once the database answers
        if run.compensations:
            run.stopping = True  # a cancel or deadline now must not cut the undo short
            yield from compensate(run, exc)
        else:
            yield from finish(run, WorkflowStatus.ERROR, None, encode_error(exc))
        raise exc
    try:
        output, value = run.keep(outcome.value, f"the output of workflow {defn.name!r}", defn.fn)
    except SerializationError as error:
        yield from finish(run, WorkflowStatus.ERROR, None, encode_error(error))
        raise
    run.settings.crash_point("before_workflow_finish")
    yield from finish(run, WorkflowStatus.SUCCESS, output, None)
    return value


def _stop(run: Run, defn: WorkflowDef, stop: WorkflowInterrupted) -> Gen[WorkflowCancelledError]:
    """Finish a run that was asked to stop: cancel its descendants, undo what it did (its
    compensations, in reverse), then record CANCELLED. Returns the error for the caller."""
    error: WorkflowCancelledError = (
        WorkflowTimeoutError(run.workflow_id, defn.timeout)
        if stop.timed_out
        else WorkflowCancelledError(run.workflow_id, stop.reason)
    )
    run.stopping = True
    text = encode_error(error)
    # Children still running stop too (a timeout is a cancel of the whole tree).
    yield from cancel_tree(run.workflow_id, stop.reason, text)
    if run.compensations:
        yield from compensate(run, error, WorkflowStatus.CANCELLED)
    else:
        yield from finish(run, WorkflowStatus.CANCELLED, None, text)
    logger.info("workflow %s stopped: %s", run.workflow_id, stop.reason)
    return error


# How many times a cancel asks again for workflows whose row changed between its read and
# its write (each time, another claim, suspend or finish won the race; a few rounds settle).
CANCEL_ROUNDS = 10


def cancel_tree(workflow_id: str, reason: str, error: str) -> Gen[list[dict[str, Any]]]:
    """Cancel a workflow and its descendants; returns the rows written (id, status after,
    epoch). The tree is walked down a level per statement, as a schema sharded by workflow
    id cannot run a recursive query over parent_id; the cancel itself is a compare-and-set
    per workflow (cancel_workflows), asked again for those whose row changed meanwhile."""
    tree, level = [workflow_id], [workflow_id]
    seen = {workflow_id}
    while level:
        rows = yield Execute("children_of", {"workflow_ids": level}, "all")
        level = [r["workflow_id"] for r in rows if r["workflow_id"] not in seen]
        seen.update(level)
        tree += level
    done: list[dict[str, Any]] = []
    todo = tree
    for _ in range(CANCEL_ROUNDS):
        rows = yield Execute(
            "cancel_workflows", {"workflow_ids": todo, "reason": reason, "error": error}, "all"
        )
        done += [r for r in rows if r["settled"]]
        todo = [r["workflow_id"] for r in rows if not r["settled"]]
        if not todo:
            break
    return done


def finish(run: Run, status: WorkflowStatus, output: str | None, error: str | None) -> Gen[None]:
    """Write the outcome and release ownership (a barrier first). In exit mode the records
    the run still holds go with the outcome, in one statement and one commit: a crash
    before it loses both (the pure steps run again), after it neither."""
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "status": status.value,
        "output": output,
        "error": error,
    }
    if run.mode == "exit" and run.pending:
        rows, run.pending = run.pending, []
        written = yield WriteSteps(rows, params)
        if len(written) < len(rows):
            raise StaleOwnerError(run.workflow_id, run.epoch)
        return
    yield from barrier(run)
    _fenced((yield Execute("finish_workflow", params)), run)


def compensate(
    run: Run, failure: Exception, final: WorkflowStatus = WorkflowStatus.COMPENSATED
) -> Gen[None]:
    """Undo applied effects in reverse order, each an effect with its own key, then finish.

    A crash here is safe: on recovery the workflow replays to the same failure, the
    compensations already applied replay from the journal, and the rest run."""
    failed_step: str | None = None
    error: Exception | None = None
    for undo, args, kwargs in reversed(run.compensations):
        outcome: Outcome = yield Call(undo, args, kwargs)
        exc = outcome.error
        if exc is None:
            continue
        if isinstance(exc, StaleOwnerError | DatabaseUnavailableError):
            raise exc
        failed_step = getattr(getattr(undo, "__durable_step__", None), "name", repr(undo))
        error = exc
        break
    run.compensations.clear()
    if error is None:
        text = encode_error(failure)
        if final is WorkflowStatus.CANCELLED:
            # Resume refuses a workflow whose undo ran (it would replay the effects on top
            # of their undo); the stored error says so.
            text = json.dumps({**json.loads(text), "compensated": True})
        yield from finish(run, final, None, text)
        return
    detail = json.loads(encode_error(error))
    detail["message"] = f"compensation {failed_step!r} failed: {detail['message']}"
    detail["failed_compensation"] = failed_step
    detail["original_error"] = json.loads(encode_error(failure))
    yield from finish(run, WorkflowStatus.COMPENSATION_FAILED, None, json.dumps(detail))


def register_compensation(run: Run, undo: Callable[..., Any], args: Any, kwargs: Any) -> None:
    run.compensations.append((undo, tuple(args), dict(kwargs)))


# -- @effect: intent -> pending -> applied ---------------------------------------------------------


def effect(run: Run, defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Gen[Any]:
    """Run an effect exactly once per workflow position (or per user key), write-ahead."""
    options = defn.effect
    assert options is not None
    if options.requires_approval:
        # The n-th call of this effect in the workflow: the same on every replay.
        nth = run.approvals_asked.get(defn.name, 0)
        run.approvals_asked[defn.name] = nth + 1
        decision = yield from approval(
            run, labels.effect_approval(defn.name, nth), {"args": list(args)}
        )
        if not decision.approved:
            raise ApprovalDeniedError(defn.name, decision.comment)
    seq, found = run.journal.next_call(defn.name)
    undo = run.settings.compensation_of(defn.name)
    if found is not None:
        value = replay(run, found, defn.fn)
        if undo is not None:
            register_compensation(run, undo, args, kwargs)
        return value
    if not run.first_run and stop_reason(run) is not None:
        # Asked to stop where this effect may have been in flight when a process died: a
        # pending call is settled first (reconciled, or called again with its key), so
        # the money that moved is recorded and its undo runs with the others.
        key, _, _ = _effect_key(run, seq, defn, args, kwargs)
        row = yield Execute(
            "get_effect", {"workflow_id": run.workflow_id, "idempotency_key": key}, "one"
        )
        if row is not None and row["status"] == EffectStatus.PENDING:
            value, here = yield from _apply_effect(run, seq, defn, args, kwargs)
            if undo is not None and here:
                register_compensation(run, undo, args, kwargs)
    check_interrupt(run)
    if run.ledger is not None:
        yield from budget_gate(run, seq, defn.name)
    value, here = yield from _apply_effect(run, seq, defn, args, kwargs)
    if undo is not None and here:
        register_compensation(run, undo, args, kwargs)
    return value


def _effect_key(
    run: Run, seq: int, defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[str, str, str | None]:
    """The effect's idempotency key, its parameters' fingerprint, and the user part."""
    options = defn.effect
    assert options is not None
    params_text = run.dumps(
        {"args": list(args), "kwargs": dict(kwargs)}, f"the parameters of effect {defn.name!r}"
    )
    fingerprint = hashlib.sha256(params_text.encode("utf-8")).hexdigest()
    user_part = options.key(*args, **kwargs) if options.key is not None else None
    check_name(f"the key of effect {defn.name!r}", user_part, optional=True)
    return labels.effect_key(run.workflow_id, seq, user_part), fingerprint, user_part


def _apply_effect(
    run: Run, seq: int, defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Gen[tuple[Any, bool]]:
    """The effect's value, and whether it moved the world at this position (False when a
    user key found it applied by an earlier call, whose undo is registered already)."""
    options = defn.effect
    assert options is not None
    settings = run.settings
    yield from barrier(run)  # an effect's intent is never written before earlier steps
    key, fingerprint, user_part = _effect_key(run, seq, defn, args, kwargs)
    started = settings.clock.now()
    ids = {"workflow_id": run.workflow_id, "idempotency_key": key}
    existing = None
    written_pending = False  # the write-ahead row went in already marked pending
    if not run.first_run or user_part is not None:
        existing = yield Execute("get_effect", ids, "one")
    if existing is None:
        intent = {
            **ids,
            "epoch": run.epoch,
            "step_seq": seq,
            "effect_name": defn.name,
            "params_fingerprint": fingerprint,
        }
        if (yield Execute("effect_intent", intent)) == 0:
            existing = yield Execute("get_effect", ids, "one")
            if existing is None:
                raise StaleOwnerError(run.workflow_id, run.epoch)
        else:
            written_pending = True
        settings.crash_point("effect_after_intent")
    if existing is not None:
        if existing["effect_name"] != defn.name:
            raise IdempotencyKeyReusedError(
                key, f"{existing['effect_name']}:{existing['params_fingerprint']}", defn.name
            )
        if existing["params_fingerprint"] != fingerprint:
            raise IdempotencyKeyReusedError(key, existing["params_fingerprint"], fingerprint)
        status = EffectStatus(existing["status"])
        if status is EffectStatus.APPLIED:
            # The same key already moved the world (e.g. an earlier position with this key).
            yield from record(
                run, seq, defn.name, StepKind.EFFECT, existing["result"], None, 1, started
            )
            return restore(run, existing["result"], defn.fn), existing["step_seq"] == seq
        if status is EffectStatus.FAILED:
            yield from record(
                run, seq, defn.name, StepKind.EFFECT, None, existing["error"], 1, started
            )
            raise rebuild_error(defn.name, existing["error"])
        if status is EffectStatus.PENDING and options.reconcile is not None:
            # The process died after the call started: ask the outside world, don't guess.
            asked: Outcome = yield Call(options.reconcile, (key, *args), kwargs)
            if asked.error is not None:
                raise asked.error
            if asked.value is not None:
                result, found_value = run.keep(
                    asked.value, f"the reconciled result of effect {defn.name!r}", defn.fn
                )
                yield from _settle(
                    run, seq, defn, key, EffectStatus.APPLIED, result, None, started, True
                )
                return found_value, True
            logger.info("effect %s key %s: never landed, calling again", defn.name, key)
    attempt = 0
    call_kwargs = {**kwargs, "idempotency_key": key}
    while True:
        attempt += 1
        if not (written_pending and attempt == 1):  # the first is marked by the intent row
            _fenced((yield Execute("effect_pending", {**ids, "epoch": run.epoch})), run)
        settings.crash_point("effect_after_pending")
        scope = StepScope(defn.name, seq=seq, kind="effect", attempt=attempt)
        outcome: Outcome = yield Call(defn.fn, args, call_kwargs, scope)
        exc = outcome.error
        if exc is None:
            break
        if defn.retry.should_retry(exc, attempt):
            yield Pause(defn.retry.delay(attempt))
            continue
        yield from _settle(
            run, seq, defn, key, EffectStatus.FAILED, None, encode_error(exc), started, False
        )
        raise exc
    settings.crash_point("effect_after_call")
    result, value = run.keep(outcome.value, f"the result of effect {defn.name!r}", defn.fn)
    yield from _settle(run, seq, defn, key, EffectStatus.APPLIED, result, None, started, False)
    settings.crash_point("effect_after_applied")
    return value, True


def _settle(
    run: Run,
    seq: int,
    defn: StepDef,
    key: str,
    status: EffectStatus,
    result: str | None,
    error: str | None,
    started: dt.datetime,
    reconciled: bool,
) -> Gen[None]:
    """The effect's outcome and its journal row, in one statement fenced by epoch."""
    written = yield Execute(
        "settle_effect",
        {
            "workflow_id": run.workflow_id,
            "epoch": run.epoch,
            "idempotency_key": key,
            "status": status.value,
            "result": result,
            "error": error,
            "reconciled": reconciled,
            "step_seq": seq,
            "step_name": defn.name,
            "started_at": started,
        },
    )
    if not written:
        raise StaleOwnerError(run.workflow_id, run.epoch)


# -- the one gate: approvals and the budget --------------------------------------------------------


def gate(
    run: Run,
    name: str,
    seq: int,
    payload: str,
    default: bool = False,
    timeout_seconds: float | None = None,
) -> Gen[Decision]:
    """Wait for a decision on gate `name` (asked at position `seq`): returns it once
    decided, else records the request and suspends the workflow (WorkflowSuspended).

    The request and the suspension are separate fenced writes; a decision that lands
    between them is seen, because a suspension refuses to park a decided gate."""
    yield from barrier(run)  # suspending writes what the run still holds
    ids = {"workflow_id": run.workflow_id, "name": name}
    row = yield Execute("get_approval", ids, "one")
    if row is None:
        asked = {
            **ids,
            "epoch": run.epoch,
            "step_seq": seq,
            "payload": payload,
            "default_approved": default,
            "timeout_seconds": timeout_seconds,
        }
        _fenced((yield Execute("approval_request", asked)), run)
    elif row["status"] != ApprovalStatus.WAITING:
        return Decision.from_row(row)
    if (yield Park()):
        # A sibling parked the run: this gate's request is written, and any decision
        # wakes the workflow; one made before the sibling parked it is looked for now.
        yield Execute("wake_if_decided", ids)
        raise WorkflowSuspended(run.workflow_id)
    check_interrupt(run)  # asked to stop while the siblings finished
    if (yield Execute("suspend_for_approval", {**ids, "epoch": run.epoch})):
        run.parked = True
        yield Execute("wake_if_decided", ids)  # a decision made during the suspension
        logger.info(
            "workflow %s waits at gate %s",
            run.workflow_id,
            name,
            extra={"event": "gate", "workflow_id": run.workflow_id, "gate": name},
        )
        raise WorkflowSuspended(run.workflow_id)
    # Not suspended: either decided meanwhile, or this run lost ownership.
    row = yield Execute("get_approval", ids, "one")
    if row is not None and row["status"] != ApprovalStatus.WAITING:
        return Decision.from_row(row)
    raise StaleOwnerError(run.workflow_id, run.epoch)


def approval(
    run: Run,
    name: str,
    payload: Any = None,
    *,
    timeout: float | None = None,
    default: bool = False,
) -> Gen[Decision]:
    """durable.approval(): a journaled gate; the decision is the call's output."""
    label = labels.approval(name)
    seq, found = run.journal.next_call(label)
    if found is not None:
        return Decision(**run.loads(found.output))
    check_interrupt(run)
    text = run.dumps(payload, f"the payload of approval {name!r}")
    decision = yield from gate(run, name, seq, text, default, timeout)
    output = run.settings.serializer.dumps(asdict(decision))
    yield from record(run, seq, label, StepKind.APPROVAL, output)
    return decision


# -- the budget ------------------------------------------------------------------------------------


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


def refresh_ledger(run: Run) -> Gen[None]:
    """Re-read the ledger (after a child, which spends from the same row, returns)."""
    if run.ledger is None:
        return
    row = yield Execute("get_budget", {"budget_id": run.ledger.budget_id}, "one", serial=True)
    if row is not None:
        run.ledger = Ledger.from_row(row)


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
    scope.dollars, scope.tokens, scope.refused = Decimal(0), 0, None
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


def charge(run: Run, scope: StepScope, dollars: Decimal, tokens: int) -> None:
    """Add to what the step spent, unless it would pass a limit: then nothing is added and
    BudgetExceededError is raised in the step (the hard cap)."""
    why = over_cap(run, scope, dollars, tokens)
    if why is not None:
        scope.refused = why
        raise BudgetExceededError(run.workflow_id, scope.name, why)
    scope.dollars += dollars
    scope.tokens += tokens


def reserve(run: Run, scope: StepScope, dollars: Decimal, tokens: int) -> None:
    """Set aside an estimate before an expensive call; BudgetExceededError (and the call is
    not made) if it does not fit."""
    why = over_cap(run, scope, reserve_dollars=dollars, reserve_tokens=tokens)
    if why is not None:
        scope.refused = why
        raise BudgetExceededError(run.workflow_id, scope.name, why)
    scope.reserved_dollars += dollars
    scope.reserved_tokens += tokens


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


# -- durable sleep, messages and events ------------------------------------------------------------

SLEEP_IN_PLACE = 1.0  # seconds: shorter waits sleep in place instead of suspending


def _wake_time(
    run: Run, label: str, seconds: float, position: tuple[int, StepRecord | None] | None = None
) -> Gen[dt.datetime]:
    """Journal (or replay) the time a wait ends, so a resume never waits again for the part
    already waited. `position`: the one its caller took for it (see recv)."""
    seq, found = run.journal.next_call(label) if position is None else position
    if found is not None:
        return dt.datetime.fromisoformat(run.loads(found.output))
    wake_at = run.settings.clock.now() + dt.timedelta(seconds=seconds)
    output = run.settings.serializer.dumps(wake_at.isoformat())
    yield from record(run, seq, label, StepKind.SLEEP, output)
    return wake_at


def _suspend(run: Run, wake_at: dt.datetime | None, topic: str | None) -> Gen[None]:
    """Park the workflow (WorkflowSuspended); returns if a message it waits for arrived
    meanwhile."""
    # A cancel or timeout seen while waiting ends the wait (workers wake a suspended
    # workflow at its deadline, whatever it waits for).
    check_interrupt(run)
    yield from barrier(run)
    if (yield Park()):
        # A sibling parked the run: wake it by this wait's time too, and by a message on
        # this topic sent before the sibling parked it (any later message wakes it).
        ids = {"workflow_id": run.workflow_id, "epoch": run.epoch}
        yield Execute("join_suspension", {**ids, "wake_at": wake_at})
        if topic is not None:
            yield Execute("wake_if_message", {"workflow_id": run.workflow_id, "topic": topic})
        raise WorkflowSuspended(run.workflow_id)
    check_interrupt(run)  # asked to stop while the siblings finished
    suspended = yield Execute(
        "suspend_until",
        {"workflow_id": run.workflow_id, "epoch": run.epoch, "wake_at": wake_at, "topic": topic},
    )
    if suspended:
        run.parked = True
        if topic is not None:
            # A message sent while this suspension waited for the row lock is invisible to
            # its snapshot: look again, now that it is committed, and wake up if it is here.
            yield Execute("wake_if_message", {"workflow_id": run.workflow_id, "topic": topic})
        raise WorkflowSuspended(run.workflow_id)
    if topic is None:
        raise StaleOwnerError(run.workflow_id, run.epoch)


def sleep(run: Run, seconds: float) -> Gen[None]:
    """The wake-up time is journaled first; a long sleep suspends (no slot, no thread)."""
    wake_at = yield from _wake_time(run, labels.SLEEP, seconds)
    clock = run.settings.clock
    remaining = (wake_at - clock.now()).total_seconds()
    if remaining <= 0:
        return
    if remaining <= SLEEP_IN_PLACE and clock.is_system:
        check_interrupt(run)
        yield Pause(remaining)
        return
    yield from _suspend(run, wake_at, None)


def recv(run: Run, topic: str | None, timeout: float | None) -> Gen[Any]:
    """The oldest message on `topic`, consumed in the statement that journals it; or None
    once the timeout passed. Suspends while nothing is there."""
    topic_key = topic or ""
    label = labels.recv(topic_key)
    # Both positions are taken before the deadline is written: branches of a gather
    # start calls while it is, and would take the message's position on this run but not
    # on a replay, where the deadline returns without a write.
    waits = None if timeout is None else run.journal.next_call(labels.recv_deadline(topic_key))
    seq, found = run.journal.next_call(label)
    deadline = None
    if timeout is not None:
        deadline = yield from _wake_time(run, labels.recv_deadline(topic_key), timeout, waits)
    if found is not None:
        return run.loads(found.output)
    check_interrupt(run)
    yield from barrier(run)
    refused = False
    while True:
        row = yield Execute(
            "consume_message",
            {
                "workflow_id": run.workflow_id,
                "epoch": run.epoch,
                "topic": topic_key,
                "step_seq": seq,
                "step_name": label,
            },
            "one",
        )
        if row is not None:
            run.settings.crash_point("after_recv")
            return run.loads(row["output"])
        if refused:
            # The suspend was refused and yet no message is there: the fence refused both,
            # so another run owns the workflow now.
            raise StaleOwnerError(run.workflow_id, run.epoch)
        if deadline is not None and run.settings.clock.now() >= deadline:
            yield from record(run, seq, label, StepKind.RECV, None)
            return None
        yield from _suspend(run, deadline, topic_key)
        # Still here: a message arrived between the check and the suspend (or the run lost
        # ownership, which the next round tells apart).
        refused = True


def set_event(run: Run, key: str, value: Any) -> Gen[None]:
    """Publish `value` under `key`, journaled with its call in one statement."""
    label = labels.event(key)
    seq, found = run.journal.next_call(label)
    if found is not None:
        return
    check_interrupt(run)
    text = run.dumps(value, f"the value of event {key!r}")
    yield from barrier(run)
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "step_seq": seq,
        "step_name": label,
        "key": key,
        "value": text,
    }
    _fenced((yield Execute("set_event", params)), run)


def write_stream(run: Run, key: str, value: Any, closing: bool = False) -> Gen[int | None]:
    """Append `value` to stream `key` (or close it), journaled with its call in one
    statement: the n-th write of a key has offset n on every run, and a replay writes
    nothing. Returns the offset written (None for the close)."""
    if key in run.closed_streams:
        raise StreamClosedError(run.workflow_id, key)
    label = labels.stream(key, closing)
    seq, found = run.journal.next_call(label)
    offset = run.stream_offsets.get(key, 0)
    text = None
    if found is None:
        check_interrupt(run)
        if not closing:
            text = run.dumps(value, f"a value of stream {key!r}")  # refused: nothing counts
    if closing:
        run.closed_streams.add(key)
    else:
        run.stream_offsets[key] = offset + 1
    if found is not None:
        return None if closing else offset
    yield from barrier(run)
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "step_seq": seq,
        "step_name": label,
        "key": key,
        "offset": offset,
        "value": text,
        "closed": closing,
        "channel": run.settings.stream_channel,
    }
    _fenced((yield Execute("write_stream", params)), run)
    run.settings.crash_point("after_stream_write")
    return None if closing else offset


# -- working state and conversation turns ----------------------------------------------------------


def set_state(run: Run, value: Any) -> Gen[None]:
    seq, found = run.journal.next_call(labels.STATE)
    if found is not None:
        run.state = found.output
        return
    text = run.dumps(value, "the workflow's durable.state")
    yield from record(run, seq, labels.STATE, StepKind.STATE, text, lazy=True)
    run.state = text


def append_turn(run: Run, role: str, content: Any) -> Gen[None]:
    seq, found = run.journal.next_call(labels.TURN)
    if found is not None:
        run.turns.append(run.loads(found.output or "null"))
        return
    text = run.dumps({"role": role, "content": content}, f"a {role!r} turn of the conversation")
    yield from record(run, seq, labels.TURN, StepKind.TURN, text, lazy=True)
    run.turns.append(run.loads(text))
