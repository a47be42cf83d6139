"""One attempt at a workflow: replay what the journal holds, execute the rest, finish.

The decisions come from `_protocol`; this module does the I/O around them through the
engine's SystemDB. Every write carries the run's epoch, so once another worker has claimed
the workflow, this run's writes match no row and it stops with StaleOwnerError.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import sqlalchemy.exc

from durable import _budget
from durable._budget import Ledger
from durable._context import RunContext, current_engine, current_run
from durable._durability import flush_run
from durable._models import StepKind, StepRecord
from durable._protocol import Journal, child_workflow_id, encode_error, rebuild_error
from durable._registry import StepDef, WorkflowDef
from durable._systemdb import is_unique_violation
from durable.errors import (
    ApprovalDeniedError,
    DatabaseUnavailableError,
    EffectOutsideWorkflowError,
    IdempotencyKeyReusedError,
    NoEngineError,
    SerializationError,
    StaleOwnerError,
    WorkflowCancelledError,
    WorkflowInterrupted,
    WorkflowTimeoutError,
)
from durable.serialization import dumps_checked

if TYPE_CHECKING:
    from durable._engine import Engine

logger = logging.getLogger("durable.executor")


# -- entry points used by the decorators -------------------------------------------------------


def call_workflow(defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    run = current_run.get()
    if run is not None and not run.in_step:
        return call_child(run, defn, args, kwargs)
    engine = run.engine if run is not None else current_engine.get()
    if engine is None:
        raise NoEngineError(
            f"workflow {defn.name!r} was called with no active engine: wrap the call in "
            "`with durable.Engine(...) as engine:` or use engine.start(fn, ...)"
        )
    return engine.run_direct(defn, args, kwargs)


def call_step(defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    run = current_run.get()
    if run is None or run.in_step:
        return defn.fn(*args, **kwargs)
    seq, record = run.journal.next_call(defn.name)
    if record is not None:
        return replay(run, record)
    check_interrupt(run)
    engine = run.engine
    if run.ledger is not None:
        _budget.gate(run, seq, defn.name)
    arguments = None
    if defn.kind is StepKind.TOOL:
        # A tool call's arguments are part of its record; checked before it runs.
        arguments = dumps_checked(
            engine.serializer,
            {"args": list(args), "kwargs": dict(kwargs)},
            f"the arguments of tool {defn.name!r}",
            engine.max_payload_bytes,
        )
    engine.crash_point("before_step")
    started = run.engine.clock.now()
    began = time.perf_counter()
    run.step_dollars, run.step_tokens = Decimal(0), 0
    attempt = 0
    while True:
        attempt += 1
        run.in_step = run.charging = True
        try:
            value = defn.fn(*args, **kwargs)
        except Exception as exc:
            run.in_step = run.charging = False
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
                time.sleep(delay)
                continue
            _record_call(
                run, seq, defn, None, encode_error(exc), attempt, started, arguments, began
            )
            raise
        finally:
            run.in_step = run.charging = False
        break
    output = dumps_checked(
        engine.serializer, value, f"the output of step {defn.name!r}", engine.max_payload_bytes
    )
    engine.crash_point("before_step_record")
    _record_call(run, seq, defn, output, None, attempt, started, arguments, began)
    engine.crash_point("after_step_record")
    return value


def _record_call(
    run: RunContext,
    seq: int,
    defn: StepDef,
    output: str | None,
    error: str | None,
    attempts: int,
    started: dt.datetime,
    arguments: str | None,
    began: float,
) -> None:
    """Journal a step; with what it charged and (a tool) its call record, when there is one.

    A plain step of an unbudgeted run is an ordinary (lazy) record. Otherwise the journal
    row, the charge, the tool call and the budget's new totals are one fenced statement:
    a crash keeps all of them or none, so a charge is never lost nor counted twice."""
    charged = bool(run.step_dollars or run.step_tokens)
    if run.budget_id is None and arguments is None and not charged:
        record_step(run, seq, defn.name, defn.kind, output, error, attempts, started, lazy=True)
        return
    flush_run(run)  # barrier: this write is synchronous, so earlier records go first
    row = run.engine.db.fetch_one_on(
        run.conn,
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
            "dollars": run.step_dollars,
            "tokens": run.step_tokens,
            "steps": 1 if run.budget_id is not None else 0,
            "arguments": arguments,
            "latency_ms": (time.perf_counter() - began) * 1000.0,
        },
    )
    run.step_dollars, run.step_tokens = Decimal(0), 0
    if row is None or not row["written"]:
        raise StaleOwnerError(run.workflow_id, run.epoch)
    if row["budget_id"] is not None:
        run.ledger = Ledger.from_row(row)


def call_transaction(defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    run = current_run.get()
    if run is None or run.in_step:
        engine = run.engine if run is not None else current_engine.get()
        if engine is None:
            raise NoEngineError(
                f"transaction {defn.name!r} needs a database connection: call it inside "
                "`with durable.Engine(...):`"
            )
        with engine.app_connection(defn.isolation_level) as conn, conn.begin():
            return defn.fn(conn, *args, **kwargs)
    seq, record = run.journal.next_call(defn.name)
    if record is not None:
        return replay(run, record)
    check_interrupt(run)
    return execute_transaction(run, seq, defn, args, kwargs)


# -- stopping ----------------------------------------------------------------------------------


def check_interrupt(run: RunContext) -> None:
    """Stop here if the workflow was cancelled or is past its timeout.

    Called before every new (unjournaled) step or wait, so cancellation is seen at the next
    boundary; replayed calls never stop, so a resumed run reaches the same point first. The
    cancel request is a dict lookup (the engine polls for requests); the timeout a clock read.
    """
    if run.stopping:
        return
    reason = run.engine.cancel_requests.get(run.workflow_id, run.cancel_reason)
    if reason is not None:
        raise WorkflowInterrupted(run.workflow_id, reason, reason == TIMEOUT_REASON)
    if run.deadline is not None and run.engine.clock.now() >= run.deadline:
        raise WorkflowInterrupted(run.workflow_id, TIMEOUT_REASON, True)


TIMEOUT_REASON = "timeout"


# -- replay ------------------------------------------------------------------------------------


def replay(run: RunContext, record: StepRecord) -> Any:
    """Return (or raise) what a journaled step returned (or raised) the first time."""
    if record.error is not None:
        raise rebuild_error(record.step_name, record.error)
    if record.output is None:
        return None
    return run.engine.serializer.loads(record.output)


def record_step(
    run: RunContext,
    seq: int,
    name: str,
    kind: StepKind,
    output: str | None,
    error: str | None,
    attempts: int,
    started: dt.datetime | None,
    child_id: str | None = None,
    *,
    lazy: bool = False,
) -> None:
    """Journal one step. `lazy` (plain steps only) lets the run's durability mode defer the
    write; every other record is a barrier and first writes what the run still holds."""
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
    if lazy and run.mode != "sync":
        if run.mode == "exit":
            run.pending.append(params)
        else:
            writer = run.engine.writer
            assert writer is not None
            writer.put(params)
        return
    flush_run(run)
    db = run.engine.db
    if run.conn is not None:
        count = db.execute_on(run.conn, "record_step", params)
    else:
        count = db.execute("record_step", params)
    if count == 0:
        raise StaleOwnerError(run.workflow_id, run.epoch)


# -- @transaction ------------------------------------------------------------------------------


def execute_transaction(
    run: RunContext, seq: int, defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    engine = run.engine
    flush_run(run)  # barrier: what the run still holds is written before the transaction
    started = run.engine.clock.now()
    separate = not engine.app_is_system_db
    params: dict[str, Any] = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "step_seq": seq,
        "step_name": defn.name,
        "kind": StepKind.TRANSACTION.value,
        "error": None,
        "attempts": 1,
        "child_workflow_id": None,
        "started_at": started,
    }
    try:
        with engine.app_connection(defn.isolation_level) as conn, conn.begin():
            if separate and not run.journal.is_fresh:
                # The app database may hold this step's record although the system journal
                # does not (a crash between the two commits): adopt it.
                found = conn.exec_driver_sql(
                    engine.app_statement("app_get_transaction"),
                    {"workflow_id": run.workflow_id, "step_seq": seq},
                ).first()
                if found is not None:
                    if found.step_name != defn.name:
                        from durable.errors import NondeterminismError

                        raise NondeterminismError(run.workflow_id, seq, found.step_name, defn.name)
                    params["output"] = found.output
                    record_step(
                        run, seq, defn.name, StepKind.TRANSACTION, found.output, None, 1, started
                    )
                    return replay(run, StepRecord.from_row({**params, "output": found.output}))
            run.in_step = True
            try:
                value = defn.fn(conn, *args, **kwargs)
            finally:
                run.in_step = False
            output = dumps_checked(
                engine.serializer,
                value,
                f"the output of transaction {defn.name!r}",
                engine.max_payload_bytes,
            )
            params["output"] = output
            if separate:
                conn.exec_driver_sql(engine.app_statement("app_record_transaction"), params)
            else:
                result = conn.exec_driver_sql(engine.db.statement("record_step"), params)
                engine.db.counters.statements += 1
                if result.rowcount == 0:
                    raise StaleOwnerError(run.workflow_id, run.epoch)
            engine.crash_point("before_transaction_commit")
    except sqlalchemy.exc.IntegrityError as exc:
        if separate and is_unique_violation(exc.orig, "transaction_outputs_pkey"):
            # Another owner recorded this position first: our writes rolled back with it.
            raise StaleOwnerError(run.workflow_id, run.epoch) from exc
        _record_transaction_error(run, seq, defn, exc, started)
        raise
    except (StaleOwnerError, SerializationError, DatabaseUnavailableError):
        raise
    except sqlalchemy.exc.OperationalError as exc:
        if not separate:
            raise DatabaseUnavailableError(f"lost the database in a transaction: {exc}") from exc
        _record_transaction_error(run, seq, defn, exc, started)
        raise
    except Exception as exc:
        _record_transaction_error(run, seq, defn, exc, started)
        raise
    engine.crash_point("after_transaction_commit")
    if separate:
        record_step(run, seq, defn.name, StepKind.TRANSACTION, params["output"], None, 1, started)
    return value


def _record_transaction_error(
    run: RunContext, seq: int, defn: StepDef, exc: BaseException, started: dt.datetime
) -> None:
    # The user's transaction rolled back; the failure itself is journaled so a replay raises
    # the same error instead of running the transaction again.
    record_step(run, seq, defn.name, StepKind.TRANSACTION, None, encode_error(exc), 1, started)


# -- child workflows ---------------------------------------------------------------------------


def call_child(
    run: RunContext, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """A workflow called from a workflow: a child with a deterministic id, whose outcome is
    journaled as one step of the parent."""
    seq, record = run.journal.next_call(defn.name)
    if record is not None:
        return replay(run, record)
    check_interrupt(run)
    child_id = child_workflow_id(run.workflow_id, seq)
    flush_run(run)
    started = run.engine.clock.now()
    engine = run.engine
    try:
        value = engine.run_here(defn, child_id, args, kwargs, parent=(run.workflow_id, seq))
    except (StaleOwnerError, DatabaseUnavailableError):
        raise
    except WorkflowCancelledError as exc:
        # Cancelled with its parent: the parent stops too, without journaling the child's
        # outcome, so a resume of the parent runs the child again.
        _raise_if_asked_to_stop(run)
        record_step(
            run, seq, defn.name, StepKind.CHILD, None, encode_error(exc), 1, started, child_id
        )
        raise
    except Exception as exc:
        record_step(
            run, seq, defn.name, StepKind.CHILD, None, encode_error(exc), 1, started, child_id
        )
        raise
    output = dumps_checked(
        engine.serializer,
        value,
        f"the output of child workflow {defn.name!r}",
        engine.max_payload_bytes,
    )
    record_step(run, seq, defn.name, StepKind.CHILD, output, None, 1, started, child_id)
    if run.ledger is not None:
        _budget.refresh(run)  # the child spent from the same ledger
    return value


def _raise_if_asked_to_stop(run: RunContext) -> None:
    """Read this run's cancel request from the database now (not waiting for the poll)."""
    row = run.engine.db.fetch_one("get_cancel_request", {"workflow_id": run.workflow_id})
    if row is not None and row["cancel_reason"] is not None:
        run.cancel_reason = row["cancel_reason"]
        check_interrupt(run)


# -- one run -----------------------------------------------------------------------------------


def execute_run(
    engine: Engine,
    defn: WorkflowDef,
    workflow_id: str,
    epoch: int,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    journal: Journal,
    deadline: dt.datetime | None = None,
    cancel_reason: str | None = None,
    budget_id: str | None = None,
) -> Any:
    """Run the workflow function under this claim and write its outcome.

    Returns the function's value or raises its exception (after recording it). A
    StaleOwnerError, or a BaseException such as KeyboardInterrupt or a suspension, leaves
    the workflow's status alone: its owner (or recovery) decides what happens next.
    """
    outer = current_run.get()
    if outer is not None and outer.conn is not None:
        # A child called inline shares its parent's connection (one per thread, so nested
        # runs cannot exhaust the pool).
        conn = outer.conn
        return _execute_run(
            engine,
            defn,
            workflow_id,
            epoch,
            args,
            kwargs,
            journal,
            conn,
            deadline,
            cancel_reason,
            budget_id,
        )
    with engine.db.connection() as conn:
        return _execute_run(
            engine,
            defn,
            workflow_id,
            epoch,
            args,
            kwargs,
            journal,
            conn,
            deadline,
            cancel_reason,
            budget_id,
        )


def _execute_run(
    engine: Engine,
    defn: WorkflowDef,
    workflow_id: str,
    epoch: int,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    journal: Journal,
    conn: Any,
    deadline: dt.datetime | None,
    cancel_reason: str | None,
    budget_id: str | None,
) -> Any:
    ctx = RunContext(
        engine,
        workflow_id,
        defn.name,
        epoch,
        journal,
        conn=conn,
        mode=defn.durability or engine.durability,
        deadline=deadline,
        cancel_reason=cancel_reason,
        budget_id=budget_id,
    )
    run_token = current_run.set(ctx)
    engine_token = current_engine.set(engine)
    try:
        _budget.open_ledger(ctx, defn.budget)
        try:
            value = defn.fn(*args, **kwargs)
        except StaleOwnerError:
            logger.warning("workflow %s: lost ownership (epoch %d), stopping", workflow_id, epoch)
            raise
        except DatabaseUnavailableError:
            # Interrupted, not failed: the worker hands it back once the database answers.
            raise
        except WorkflowInterrupted as stop:
            raise _stop(engine, ctx, defn, stop) from None
        except Exception as exc:
            if ctx.compensations:
                _run_compensations(engine, ctx, exc)
            else:
                finish(engine, workflow_id, epoch, "ERROR", None, encode_error(exc), conn, ctx)
            raise
        try:
            output = dumps_checked(
                engine.serializer,
                value,
                f"the output of workflow {defn.name!r}",
                engine.max_payload_bytes,
            )
        except SerializationError as exc:
            finish(engine, workflow_id, epoch, "ERROR", None, encode_error(exc), conn, ctx)
            raise
        engine.crash_point("before_workflow_finish")
        finish(engine, workflow_id, epoch, "SUCCESS", output, None, conn, ctx)
        return value
    finally:
        current_run.reset(run_token)
        current_engine.reset(engine_token)


def _stop(
    engine: Engine, ctx: RunContext, defn: WorkflowDef, stop: WorkflowInterrupted
) -> WorkflowCancelledError:
    """Finish a run that was asked to stop: cancel its descendants, undo what it did (its
    compensations, in reverse), then record CANCELLED. Returns the error for the caller."""
    error: WorkflowCancelledError = (
        WorkflowTimeoutError(ctx.workflow_id, defn.timeout)
        if stop.timed_out
        else WorkflowCancelledError(ctx.workflow_id, stop.reason)
    )
    ctx.stopping = True
    text = encode_error(error)
    # Children still running stop too (a timeout is a cancel of the whole tree).
    engine.db.fetch_all(
        "cancel_workflow", {"workflow_id": ctx.workflow_id, "reason": stop.reason, "error": text}
    )
    if ctx.compensations:
        _run_compensations(engine, ctx, error, final_status="CANCELLED")
    else:
        finish(engine, ctx.workflow_id, ctx.epoch, "CANCELLED", None, text, ctx.conn, ctx)
    logger.info("workflow %s stopped: %s", ctx.workflow_id, stop.reason)
    return error


def finish(
    engine: Engine,
    workflow_id: str,
    epoch: int,
    status: str,
    output: str | None,
    error: str | None,
    conn: Any = None,
    run: RunContext | None = None,
) -> None:
    if run is not None:
        flush_run(run)
    params = {
        "workflow_id": workflow_id,
        "epoch": epoch,
        "status": status,
        "output": output,
        "error": error,
    }
    if conn is not None:
        count = engine.db.execute_on(conn, "finish_workflow", params)
    else:
        count = engine.db.execute("finish_workflow", params)
    if count == 0:
        raise StaleOwnerError(workflow_id, epoch)


# -- @effect -----------------------------------------------------------------------------------


def call_effect(defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """Run an effect exactly once per workflow position (or per user key), write-ahead."""
    run = current_run.get()
    if run is None or run.in_step:
        if "idempotency_key" not in kwargs:
            raise EffectOutsideWorkflowError(
                f"effect {defn.name!r} was called outside a workflow without a key: call it "
                "from a workflow, or pass idempotency_key=... yourself"
            )
        return defn.fn(*args, **kwargs)
    assert defn.effect is not None
    if defn.effect.requires_approval:
        from durable._waits import approval

        # The n-th call of this effect in the workflow: the same on every replay.
        nth = run.approvals_asked.get(defn.name, 0)
        run.approvals_asked[defn.name] = nth + 1
        decision = approval(f"{defn.name}#{nth}", payload={"args": list(args)})
        if not decision.approved:
            raise ApprovalDeniedError(defn.name, decision.comment)
    seq, record = run.journal.next_call(defn.name)
    if record is not None:
        value = replay(run, record)
        _register_compensation(run, defn, args, kwargs)
        return value
    check_interrupt(run)
    if run.ledger is not None:
        _budget.gate(run, seq, defn.name)
    value = _call_effect(run, seq, defn, args, kwargs)
    _register_compensation(run, defn, args, kwargs)
    return value


def _register_compensation(
    run: RunContext, defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    undo = run.engine.registry.compensation(defn.name)
    if undo is not None:
        run.compensations.append((undo, tuple(args), dict(kwargs)))


def compensate(undo: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Register an undo (an @effect) for what the workflow just did; it runs, in reverse
    order with the others, if the workflow fails."""
    run = current_run.get()
    if run is None:
        raise NoEngineError("durable.compensate() is only meaningful inside a workflow")
    run.compensations.append((undo, args, kwargs))


def _call_effect(
    run: RunContext, seq: int, defn: StepDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    assert defn.effect is not None
    options = defn.effect
    engine = run.engine
    flush_run(run)  # barrier: an effect's intent is never written before earlier steps
    params_text = dumps_checked(
        engine.serializer,
        {"args": list(args), "kwargs": dict(kwargs)},
        f"the parameters of effect {defn.name!r}",
        engine.max_payload_bytes,
    )
    fingerprint = hashlib.sha256(params_text.encode("utf-8")).hexdigest()
    user_part = options.key(*args, **kwargs) if options.key is not None else None
    key = f"{run.workflow_id}:{seq}" if user_part is None else f"{run.workflow_id}:{user_part}"
    started = run.engine.clock.now()
    ids = {"workflow_id": run.workflow_id, "idempotency_key": key}
    existing = None
    if not run.journal.is_fresh or user_part is not None:
        existing = engine.db.fetch_one("get_effect", ids)
    if existing is None:
        written = engine.db.execute_on(
            run.conn,
            "effect_intent",
            {
                **ids,
                "epoch": run.epoch,
                "step_seq": seq,
                "effect_name": defn.name,
                "params_fingerprint": fingerprint,
            },
        )
        if written == 0:
            existing = engine.db.fetch_one("get_effect", ids)
            if existing is None:
                raise StaleOwnerError(run.workflow_id, run.epoch)
        engine.crash_point("effect_after_intent")
    if existing is not None:
        if existing["params_fingerprint"] != fingerprint:
            raise IdempotencyKeyReusedError(key, existing["params_fingerprint"], fingerprint)
        if existing["status"] == "applied":
            # The same key already moved the world (e.g. an earlier position with this key).
            record_step(run, seq, defn.name, StepKind.EFFECT, existing["result"], None, 1, started)
            return _loads(engine, existing["result"])
        if existing["status"] == "failed":
            record_step(run, seq, defn.name, StepKind.EFFECT, None, existing["error"], 1, started)
            raise rebuild_error(defn.name, existing["error"])
        if existing["status"] == "pending" and options.reconcile is not None:
            # The process died after the call started: ask the outside world, don't guess.
            found = options.reconcile(key, *args, **kwargs)
            if found is not None:
                result = dumps_checked(
                    engine.serializer,
                    found,
                    f"the reconciled result of effect {defn.name!r}",
                    engine.max_payload_bytes,
                )
                _settle(run, seq, defn, key, "applied", result, None, started, True)
                return found
            logger.info("effect %s key %s: never landed, calling again", defn.name, key)
    attempt = 0
    while True:
        attempt += 1
        if engine.db.execute_on(run.conn, "effect_pending", {**ids, "epoch": run.epoch}) == 0:
            raise StaleOwnerError(run.workflow_id, run.epoch)
        engine.crash_point("effect_after_pending")
        run.in_step = True
        try:
            value = defn.fn(*args, **kwargs, idempotency_key=key)
        except Exception as exc:
            run.in_step = False
            if defn.retry.should_retry(exc, attempt):
                time.sleep(defn.retry.delay(attempt))
                continue
            _settle(run, seq, defn, key, "failed", None, encode_error(exc), started, False)
            raise
        finally:
            run.in_step = False
        break
    engine.crash_point("effect_after_call")
    result = dumps_checked(
        engine.serializer, value, f"the result of effect {defn.name!r}", engine.max_payload_bytes
    )
    _settle(run, seq, defn, key, "applied", result, None, started, False)
    engine.crash_point("effect_after_applied")
    return value


def _loads(engine: Engine, text: str | None) -> Any:
    return None if text is None else engine.serializer.loads(text)


def _settle(
    run: RunContext,
    seq: int,
    defn: StepDef,
    key: str,
    status: str,
    result: str | None,
    error: str | None,
    started: dt.datetime,
    reconciled: bool,
) -> None:
    """The effect's outcome and its journal row, in one transaction, fenced by epoch."""
    ok = run.engine.db.all_or_nothing(
        run.conn,
        [
            (
                "effect_settle",
                {
                    "workflow_id": run.workflow_id,
                    "idempotency_key": key,
                    "status": status,
                    "result": result,
                    "error": error,
                    "reconciled": reconciled,
                },
            ),
            (
                "record_step",
                {
                    "workflow_id": run.workflow_id,
                    "epoch": run.epoch,
                    "step_seq": seq,
                    "step_name": defn.name,
                    "kind": StepKind.EFFECT.value,
                    "output": result,
                    "error": error,
                    "attempts": 1,
                    "child_workflow_id": None,
                    "started_at": started,
                },
            ),
        ],
    )
    if not ok:
        raise StaleOwnerError(run.workflow_id, run.epoch)


def _run_compensations(
    engine: Engine, ctx: RunContext, failure: Exception, final_status: str = "COMPENSATED"
) -> None:
    """Undo applied effects in reverse order, each an effect with its own key.

    A crash here is safe: on recovery the workflow replays to the same failure, the
    compensations already applied replay from the journal, and the rest run.
    """
    failed_step: str | None = None
    error: Exception | None = None
    for undo, args, kwargs in reversed(ctx.compensations):
        try:
            undo(*args, **kwargs)
        except (StaleOwnerError, DatabaseUnavailableError):
            raise
        except Exception as exc:
            failed_step = getattr(getattr(undo, "__durable_step__", None), "name", repr(undo))
            error = exc
            break
    ctx.compensations.clear()
    conn = ctx.conn
    if error is None:
        finish(
            engine,
            ctx.workflow_id,
            ctx.epoch,
            final_status,
            None,
            encode_error(failure),
            conn,
            ctx,
        )
    else:
        import json

        detail = json.loads(encode_error(error))
        detail["message"] = f"compensation {failed_step!r} failed: {detail['message']}"
        detail["failed_compensation"] = failed_step
        detail["original_error"] = json.loads(encode_error(failure))
        finish(
            engine,
            ctx.workflow_id,
            ctx.epoch,
            "COMPENSATION_FAILED",
            None,
            json.dumps(detail),
            conn,
            ctx,
        )
