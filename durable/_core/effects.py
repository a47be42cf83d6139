"""@effect: exactly once per workflow position (or per user key), write-ahead.

An effect writes its intent before it calls the outside world, marks itself pending for
each attempt, and settles as applied or failed in the same statement as its journal row.
On a resumed run the stored state decides: applied replays, failed raises again, pending
is reconciled (the user's function asks the outside world) or called again with the same
idempotency key; a key reused with another effect or other parameters is refused. The
statuses and the moves between them are the table in `transitions.py`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durable._base import labels
from durable._base.models import EffectStatus, StepKind
from durable._base.names import check_name
from durable._core.budget import budget_gate
from durable._core.gates import approval
from durable._core.journal import barrier, encode_error, rebuild_error, record, replay, restore
from durable._core.ops import Call, Execute, Gen, Outcome, Pause, StepScope
from durable._core.run import Run, _fenced, check_interrupt, stop_reason
from durable._core.transitions import EFFECT_TRANSITIONS, assert_transition
from durable._core.workflow import register_compensation
from durable.errors import ApprovalDeniedError, IdempotencyKeyReusedError, StaleOwnerError

if TYPE_CHECKING:
    from durable._base.registry import StepDef

logger = logging.getLogger("durable.protocol")


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
            # A call a fork copied is recorded in the ledger of the workflow it came from.
            where = found.applied_in or run.workflow_id
            register_compensation(run, undo, args, kwargs, where, seq)
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
                register_compensation(run, undo, args, kwargs, run.workflow_id, seq)
    check_interrupt(run)
    if run.ledger is not None:
        yield from budget_gate(run, seq, defn.name)
    value, here = yield from _apply_effect(run, seq, defn, args, kwargs)
    if undo is not None and here:
        register_compensation(run, undo, args, kwargs, run.workflow_id, seq)
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
    """The effect's outcome and its journal row, in one statement fenced by epoch. An
    effect is settled from pending: its intent row is written pending, and a pending row
    is what reconciliation settles."""
    assert_transition(EFFECT_TRANSITIONS, EffectStatus.PENDING, status)
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
