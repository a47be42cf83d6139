"""A scripted driver for the protocol's generators: no database, no threads, no sleeping.

`Script.run(gen)` drives one of `durable._core`'s generators the way `_driver.drive`
does: it sends each operation's answer back into the generator, or throws an exception into
it, until the generator returns (its value is returned) or raises (the error propagates).
Every operation the generator yielded is kept in `script.ops`, so a test asserts on the
protocol's decisions: which statements it asked for, in what order, with what parameters,
and what it made of the answers.

Answers come, in this order, from:

1. `answer(op)`, a function the test gives; it may return `DEFAULT` to fall through. If it
   raises, the exception is thrown into the generator (as the real driver does when
   performing an operation fails).
2. `statements[name]` for an `Execute` / `AppExecute` of that name: a value, a `Then(...)`
   of successive values, a `Raise(error)`, or a function of the operation.
3. The defaults: a statement writes one row (fetch "count"), finds nothing ("one") or no
   rows ("all"); a `WriteSteps` writes every row; a `Call` /
   `AppCall` calls the function like the driver does; `Park` sends back False (no sibling
   parked the run); `LeaseClock` sends back (0.0, 0.0) (a run proven at 0.0, the
   default, holds its lease); `Pause` and the writer operations do nothing. A `RunChild`
   has no default: script it.

Nothing here pretends to run SQL: the answers are whatever the test says the database did.
But every statement asked for must be one of queries.sql, given a value for each of its
parameters (`check_statement`): a misspelt name or key is a ScriptError, as it would be an
error from the real driver.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Callable, Generator, Iterable, Mapping
from decimal import Decimal
from typing import Any

from durable import _core as protocol
from durable._base.models import EffectStatus, Ledger, RetryPolicy, StepKind, StepRecord
from durable._base.registry import EffectOptions, StepDef, WorkflowDef
from durable._core import (
    AppBegin,
    AppCall,
    AppEnd,
    AppExecute,
    AppFault,
    AwaitWriter,
    Call,
    Enqueue,
    Execute,
    Fault,
    Join,
    Journal,
    LeaseClock,
    Outcome,
    Park,
    Pause,
    Run,
    RunChild,
    Settings,
    WriteSteps,
    encode_error,
)
from durable._io.systemdb import load_queries
from durable.errors import BudgetExceededError
from durable.serialization import JSONSerializer

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
WORKFLOW_ID = "wf-1"
EPOCH = 3
APP_CONN = "<app connection>"  # what an AppCall's function receives as its connection

DEFAULT: Any = object()  # returned by an answer function: "use the script or the default"


class ScriptError(AssertionError):
    """The script cannot answer (a test mistake, or the protocol asked for something the
    test did not expect). Raised to the test, never thrown into the generator."""


class TooManyOperations(ScriptError):
    """The generator kept asking: most likely a loop that never ends."""


class Raise:
    """Answer an operation by throwing `error` into the generator."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"Raise({self.error!r})"


class Then:
    """Successive answers to a statement asked more than once (the last one is not
    repeated: asking once more is a ScriptError)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)

    def next(self, op: Any) -> Any:
        if not self.answers:
            raise ScriptError(f"no scripted answer left for {label(op)}")
        return self.answers.pop(0)


class FixedClock:
    """A clock that only moves when told to (durable.Clock)."""

    def __init__(self, now: dt.datetime = T0, *, is_system: bool = False) -> None:
        self._now = now
        self.is_system = is_system

    def now(self) -> dt.datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += dt.timedelta(seconds=seconds)


QUERIES = load_queries()
PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def check_statement(op: Any) -> None:
    """A ScriptError unless `op` (an Execute or AppExecute) names a statement of
    queries.sql, fetches a count, one row or all rows, and gives every parameter the
    statement binds; for a WriteSteps, unless each
    row binds record_step's parameters and `finish` finish_workflow's."""
    if isinstance(op, WriteSteps):
        for row in op.rows:
            _check_params(op, "record_step", row)
        if op.finish is not None:
            _check_params(op, "finish_workflow", op.finish)
        return
    if op.name not in QUERIES:
        raise ScriptError(f"{label(op)}: no such statement in queries.sql")
    if op.fetch not in SHAPES:
        raise ScriptError(f"{label(op)}: no such fetch {op.fetch!r}")
    _check_params(op, op.name, op.params)


SHAPES: dict[str, tuple[type, ...]] = {
    "count": (int,),  # a row count (or the bool of a statement the driver tests)
    "one": (Mapping, type(None)),
    "all": (list,),
}


def check_answer(op: Any, answer: Any) -> None:
    """A ScriptError unless a scripted answer has the shape of what the driver sends back
    for the statement's `fetch`: a count, one row or None, a list of rows."""
    if isinstance(answer, Raise):
        return
    if not isinstance(answer, SHAPES[op.fetch]):
        raise ScriptError(f"{label(op)} fetches {op.fetch!r}, not {answer!r}")


def _check_params(op: Any, name: str, params: Mapping[str, Any]) -> None:
    missing = set(PLACEHOLDER.findall(QUERIES[name])) - set(params)
    if missing:
        raise ScriptError(f"{label(op)}: no value for {sorted(missing)} of {name}")


def label(op: Any) -> str:
    """A short, readable name for an operation (what `Script.labels` lists)."""
    if isinstance(op, Execute):  # RecordStep and Finish too: the statement is the label
        return f"Execute {op.name}"
    if isinstance(op, AppExecute):
        return f"AppExecute {op.name}"
    if isinstance(op, Call | AppCall):
        return f"{type(op).__name__} {getattr(op.fn, '__name__', repr(op.fn))}"
    if isinstance(op, Pause):
        return f"Pause {op.seconds:g}"
    if isinstance(op, WriteSteps):
        return f"WriteSteps {len(op.rows)}"
    if isinstance(op, Enqueue):
        return f"Enqueue {op.row['step_name']}"
    if isinstance(op, RunChild):
        return f"RunChild {op.workflow_id}"
    if isinstance(op, AppEnd):
        if op.last is not None:
            return f"AppEnd commit with {op.last.name}"
        return "AppEnd commit" if op.commit else "AppEnd rollback"
    return type(op).__name__  # AwaitWriter, AppBegin, Park, Join, LeaseClock


def call_like_driver(fn: Callable[..., Any], args: Iterable[Any], kwargs: Mapping[str, Any]) -> Any:
    """What `_driver._call` does: an Exception becomes the Outcome's error; anything else
    (a suspension, an interrupt) propagates, and is thrown into the generator."""
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return Outcome(None, exc, 0.0)
    return Outcome(value, None, 0.0)


class Script:
    def __init__(
        self,
        answer: Callable[[Any], Any] | None = None,
        *,
        statements: Mapping[str, Any] | None = None,
        limit: int = 100,
    ) -> None:
        self.answer = answer
        self.statements = dict(statements or {})
        self.limit = limit
        self.ops: list[Any] = []

    # -- driving -------------------------------------------------------------------------

    def run(self, gen: Generator[Any, Any, Any]) -> Any:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = gen.send(value) if error is None else gen.throw(error)
            except StopIteration as stop:
                return stop.value
            value = error = None
            self.ops.append(op)
            asked = op.last if isinstance(op, AppEnd) and op.last is not None else op
            if isinstance(asked, Execute | AppExecute | WriteSteps):
                try:
                    check_statement(asked)
                except ScriptError:
                    gen.close()
                    raise
            if len(self.ops) > self.limit:
                gen.close()
                raise TooManyOperations(f"more than {self.limit} operations: {self.labels[-5:]}")
            try:
                result = self._resolve(op)
            except ScriptError:
                gen.close()
                raise
            except BaseException as exc:
                error = exc
                continue
            if isinstance(result, Raise):
                error = result.error
            else:
                value = result

    def _resolve(self, op: Any) -> Any:
        if self.answer is not None:
            result = self.answer(op)
            if result is not DEFAULT:
                return result
        commit = isinstance(op, AppEnd) and op.last is not None
        if commit:
            op = op.last  # the statement sent with the COMMIT answers for both
        if isinstance(op, Execute | AppExecute) and op.name in self.statements:
            scripted = self.statements[op.name]
            if isinstance(scripted, Then):
                result = scripted.next(op)
            elif callable(scripted):
                result = scripted(op)
            else:
                result = scripted
            if not commit:  # a COMMIT's answer is the AppEnd's (None, or ABORTED)
                check_answer(op, result)
            return result
        return self._default(op)

    def _default(self, op: Any) -> Any:
        if isinstance(op, Execute | AppExecute):
            return {"count": 1, "one": None, "all": []}[op.fetch]
        if isinstance(op, WriteSteps):
            return [row["workflow_id"] for row in op.rows]
        if isinstance(op, Call):
            return call_like_driver(op.fn, op.args, op.kwargs)
        if isinstance(op, AppCall):
            return call_like_driver(op.fn, (APP_CONN, *op.args), op.kwargs)
        if isinstance(op, Pause | Enqueue | AwaitWriter | AppBegin | AppEnd | Join):
            return None
        if isinstance(op, Park):
            return False  # no sibling parked the run
        if isinstance(op, LeaseClock):
            return (0.0, 0.0)  # now, and when the heartbeat last renewed every lease
        raise ScriptError(f"no answer scripted for {label(op)}")

    # -- what was asked ------------------------------------------------------------------

    @property
    def labels(self) -> list[str]:
        return [label(op) for op in self.ops]

    def executed(self, name: str) -> list[dict[str, Any]]:
        """The parameters of every statement `name` asked for (Execute or AppExecute), in
        order."""
        found: list[dict[str, Any]] = []
        for op in self.ops:
            if isinstance(op, AppEnd) and op.last is not None:
                op = op.last
            if isinstance(op, Execute | AppExecute) and op.name == name:
                found.append(op.params)
        return found

    def only(self, name: str) -> dict[str, Any]:
        """The parameters of statement `name`, asked for exactly once."""
        found = self.executed(name)
        assert len(found) == 1, f"{name} asked {len(found)} times: {self.labels}"
        return found[0]

    def of_type(self, kind: type) -> list[Any]:
        return [op for op in self.ops if isinstance(op, kind)]


# -- building runs, definitions and journal records -------------------------------------------

SERIALIZER = JSONSerializer()


def make_run(
    *,
    records: Iterable[StepRecord] = (),
    mode: str = "sync",
    clock: Any = None,
    max_payload_bytes: int = 1_000_000,
    app_separate: bool = False,
    cancel: str | None = None,
    handing_over: Callable[[], bool] | None = None,
    pause_request: Callable[[str, int], bool] | None = None,
    compensation_of: Callable[[str], Any] | None = None,
    classify_app_error: Callable[[BaseException], AppFault | None] | None = None,
    crash_point: Callable[[str], None] | None = None,
    workflow_id: str = WORKFLOW_ID,
    first_run: bool | None = None,
    **fields: Any,
) -> Run:
    """A Run of workflow `wf-1` at epoch 3, on a fixed clock, with the given journal.

    `first_run` (the run that created the workflow) defaults to "no records": pass False
    for a claimed run whose journal happens to be empty."""
    options: dict[str, Any] = {}
    if compensation_of is not None:
        options["compensation_of"] = compensation_of
    if classify_app_error is not None:
        options["classify_app_error"] = classify_app_error
    if crash_point is not None:
        options["crash_point"] = crash_point
    if cancel is not None:
        options["cancel_request"] = lambda wid, epoch: cancel
    if handing_over is not None:
        options["handing_over"] = handing_over
    if pause_request is not None:
        options["pause_request"] = pause_request
    settings = Settings(
        serializer=SERIALIZER,
        max_payload_bytes=max_payload_bytes,
        clock=clock if clock is not None else FixedClock(),
        app_separate=app_separate,
        **options,
    )
    journal = Journal.from_records(workflow_id, records)
    if first_run is None:
        first_run = journal.is_fresh
    return Run(
        settings, workflow_id, "order", EPOCH, journal, mode=mode, first_run=first_run, **fields
    )


def step_def(
    fn: Callable[..., Any],
    name: str | None = None,
    *,
    kind: StepKind = StepKind.STEP,
    retry: RetryPolicy | None = None,
    effect: EffectOptions | None = None,
    isolation_level: str | None = None,
) -> StepDef:
    return StepDef(
        name or fn.__name__,
        fn,
        kind=kind,
        retry=retry if retry is not None else RetryPolicy(),
        isolation_level=isolation_level,
        effect=effect,
    )


def effect_def(
    fn: Callable[..., Any],
    name: str | None = None,
    *,
    retry: RetryPolicy | None = None,
    **options: Any,
) -> StepDef:
    return step_def(fn, name, kind=StepKind.EFFECT, retry=retry, effect=EffectOptions(**options))


def workflow_def(fn: Callable[..., Any], name: str | None = None, **options: Any) -> WorkflowDef:
    return WorkflowDef(name or fn.__name__, fn, **options)


def held(seq: int, name: str) -> dict[str, Any]:
    """A record a lazy durability mode still holds (what journal.record puts in
    run.pending): a plain step of `name` at `seq` that returned null."""
    return {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "step_seq": seq,
        "step_name": name,
        "kind": StepKind.STEP.value,
        "output": "null",
        "error": None,
        "attempts": 1,
        "child_workflow_id": None,
        "started_at": T0,
    }


def done(seq: int, name: str, value: Any, kind: StepKind = StepKind.STEP) -> StepRecord:
    """A journaled call that returned `value`."""
    return StepRecord(seq, name, kind, SERIALIZER.dumps(value), None, 1)


def failed(seq: int, name: str, error: BaseException, kind: StepKind = StepKind.STEP) -> StepRecord:
    """A journaled call that raised `error`."""
    return StepRecord(seq, name, kind, None, encode_error(error), 1)


def effect_row(
    status: EffectStatus,
    fingerprint: str,
    *,
    result: Any = None,
    error: BaseException | None = None,
    name: str = "charge_card",
    step_seq: int = 0,
) -> dict[str, Any]:
    """What get_effect would send back for an effect ledger row."""
    return {
        "effect_name": name,
        "step_seq": step_seq,
        "status": status.value,
        "params_fingerprint": fingerprint,
        "result": None if result is None else SERIALIZER.dumps(result),
        "error": None if error is None else encode_error(error),
    }


def approval_row(
    status: str,
    *,
    comment: str | None = None,
    decided_by: str | None = None,
    default_approved: bool = False,
) -> dict[str, Any]:
    """What get_approval would send back for a gate."""
    return {
        "status": status,
        "comment": comment,
        "decided_by": decided_by,
        "default_approved": default_approved,
    }


def ledger_row(
    *,
    limit_steps: int | None = None,
    spent_steps: int = 0,
    limit_dollars: str | None = None,
    spent_dollars: str = "0",
    limit_tokens: int | None = None,
    spent_tokens: int = 0,
    budget_id: str = WORKFLOW_ID,
    **extra: Any,
) -> dict[str, Any]:
    """What a budget statement would send back for the ledger row."""
    return {
        "budget_id": budget_id,
        "limit_dollars": None if limit_dollars is None else Decimal(limit_dollars),
        "limit_tokens": limit_tokens,
        "limit_steps": limit_steps,
        "spent_dollars": Decimal(spent_dollars),
        "spent_tokens": spent_tokens,
        "spent_steps": spent_steps,
        **extra,
    }


def ledger(**row: Any) -> Ledger:
    return Ledger.from_row(ledger_row(**row))


# -- what several tests call ------------------------------------------------------------------

KEY0 = f"{WORKFLOW_ID}:0"  # the idempotency key of an effect at position 0
KEY1 = f"{WORKFLOW_ID}:1"

CONFLICT = AppFault(Fault.CONFLICT)
READ_ONLY = AppFault(Fault.READ_ONLY)
FENCE = AppFault(Fault.FENCE)
LOST = AppFault(Fault.LOST)


def after_one_step(**options: Any) -> Run:
    """A run that replayed the one step its journal holds: the next call comes at position 1,
    and the journal is not fresh. `options` go to make_run."""
    run = make_run(records=[done(0, "fetch", 1)], **options)
    run.journal.next_call("fetch")
    return run


def charge_card(cents: int, *, idempotency_key: str) -> dict[str, Any]:
    return {"charged": cents, "key": idempotency_key}


def refund(cents: int, *, idempotency_key: str) -> None:
    return None


def fingerprint(*args: Any, **kwargs: Any) -> str:
    """An effect's params fingerprint, as the ledger row holds it."""
    text = SERIALIZER.dumps({"args": list(args), "kwargs": kwargs})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def run_effect(run: Run, script: Script, defn: StepDef | None = None, cents: int = 500) -> Any:
    """Run an effect (charge_card, idempotent, by default) of `cents` on the script."""
    defn = defn if defn is not None else effect_def(charge_card, idempotent=True)
    return script.run(protocol.effect(run, defn, (cents,), {}))


def fails_once(calls: list[str]) -> Callable[..., str]:
    """An effect `flaky` that times out on its first attempt, then returns "ok"; each
    attempt's idempotency key goes into `calls`."""

    def flaky(cents: int, *, idempotency_key: str) -> str:
        calls.append(idempotency_key)
        if len(calls) == 1:
            raise TimeoutError("slow vendor")
        return "ok"

    return flaky


def over_the_cap(approvals: int, calls: list[int] | None = None) -> tuple[Run, Script]:
    """A run at $0.9 of a $1 cap whose every model call costs $0.3 (each call appends to
    `calls`), and a script that approves the first `approvals` budget gates, then finds the
    next one undecided (the run suspends there)."""
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.9"))

    def answer(op: Any) -> Any:
        if isinstance(op, Call) and op.scope is not None:
            if calls is not None:
                calls.append(1)
            try:
                protocol.charge(run, op.scope, Decimal("0.3"), 0)
            except BudgetExceededError as exc:
                return Outcome(error=exc)
            return Outcome("ok")
        return DEFAULT

    approved = approval_row("approved")
    script = Script(
        answer,
        statements={
            "get_approval": Then(*[approved] * approvals, None),
            "get_budget": ledger_row(limit_dollars="1", spent_dollars="0.9"),
            "suspend_for_approval": 1,
        },
    )
    return run, script


def llm() -> str:
    return "reply"


def body() -> str:
    return "done"
