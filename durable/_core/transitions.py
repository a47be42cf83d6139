"""The status machines of effects and workflows, as tables: which status may follow which.

Statuses are moved by SQL statements (`_io/sql/queries.sql`) that the core names; what those
statements may do is written here once, so that the core can check a move before it asks
for it, and the tests can hold the statements to the table (tests/unit/test_transitions.py
reads each statement's `SET status` and `WHERE ... status` against it). A row that does
not exist yet is the start, `None`. A statement that writes the status a row already has
(`CASE WHEN status = 'SUSPENDED' THEN 'PENDING' ELSE status END` on a running workflow)
moves nothing, so no table lists a status as following itself.

Two statuses of the schema's CHECK constraints are never written by this version:
`intent`, which effects written before the intent row went in already pending may still
hold (it is settled like `pending`), and COMPENSATING, which no statement sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from durable._base.models import EffectStatus, WorkflowStatus

S = TypeVar("S", EffectStatus, WorkflowStatus)


class TransitionError(RuntimeError):
    """The core asked for a status move its table does not allow: a bug in the core, not a
    condition of the run (a lost claim is a StaleOwnerError, decided by the database)."""


# -- effects: write-ahead, then settled --------------------------------------------------------

EFFECT_EVENTS: Mapping[EffectStatus | None, Mapping[str, EffectStatus]] = {
    # effect_intent: the intent row goes in already marked pending (its first attempt).
    None: {"write_ahead": EffectStatus.PENDING},
    # A row written before that change: its call may not have started yet.
    EffectStatus.INTENT: {
        "attempt": EffectStatus.PENDING,  # effect_pending
        "applied": EffectStatus.APPLIED,  # settle_effect
        "failed": EffectStatus.FAILED,  # settle_effect
    },
    # The call may have started: settled by its outcome, or by asking the outside world.
    # Another attempt (effect_pending) keeps it pending.
    EffectStatus.PENDING: {
        "applied": EffectStatus.APPLIED,  # settle_effect, reconciled or not
        "failed": EffectStatus.FAILED,  # settle_effect
    },
    EffectStatus.APPLIED: {},
    EffectStatus.FAILED: {},
}

# Statuses a table lists that no statement of this version writes (see the docstring).
EFFECT_NEVER_WRITTEN: frozenset[EffectStatus] = frozenset({EffectStatus.INTENT})

# -- workflows: claimed, suspended, finished ---------------------------------------------------

_W = WorkflowStatus
WORKFLOW_EVENTS: Mapping[WorkflowStatus | None, Mapping[str, WorkflowStatus]] = {
    None: {
        "start": _W.RUNNING,  # insert_workflow: created by the run that owns it
        "submit": _W.PENDING,  # insert_workflow_pending, fork_workflow
        "enqueue": _W.ENQUEUED,  # enqueue_workflow
    },
    _W.ENQUEUED: {
        "dequeue": _W.RUNNING,  # dequeue, dequeue_cas, dequeue_partitioned
        "cancel": _W.CANCELLED,  # cancel_workflows: nothing ran, nothing to undo
        "cancel_by_a_run": _W.PENDING,  # cancel_workflows: a run stops it (undo, children)
        "pause": _W.PAUSED,  # pause_workflow
        "terminate": _W.CANCELLED,  # terminate_workflows: nothing is undone
    },
    _W.PENDING: {
        "claim": _W.RUNNING,  # claim_batch, claim_batch_cas
        "cancel": _W.CANCELLED,  # cancel_workflows
        "pause": _W.PAUSED,  # pause_workflow
        "terminate": _W.CANCELLED,  # terminate_workflows
    },
    _W.RUNNING: {
        # finish_workflow, finish_workflows, finish_with_steps (fenced by epoch):
        "succeed": _W.SUCCESS,
        "fail": _W.ERROR,
        "stop": _W.CANCELLED,
        "compensate": _W.COMPENSATED,
        "compensation_fails": _W.COMPENSATION_FAILED,
        # suspend_until, suspend_for_any, suspend_for_approval; PENDING when a cancel
        # arrived meanwhile.
        "suspend": _W.SUSPENDED,
        "suspend_cancelled": _W.PENDING,
        # release_workflow, release_owned: the owner gives it back; cancel_workflows
        # when the owner's lease lapsed (a run stops it).
        "release": _W.PENDING,
        # release_workflow, release_owned, suspend_*: given back (at a step boundary, or
        # as it waits) while a pause was asked; pause_workflow when the lease lapsed.
        "pause": _W.PAUSED,
        # move_workflow: an operator moves a run whose lease lapsed to another version.
        "move": _W.PENDING,
        # cancel_workflows when the owner's lease lapsed and nothing was journaled.
        "cancel": _W.CANCELLED,
        # claim_batch, claim_batch_cas: the lease lapsed too often.
        "give_up": _W.MAX_RECOVERY_ATTEMPTS_EXCEEDED,
        # terminate_workflows: an operator ends it now, its owner fenced by the epoch.
        "terminate": _W.CANCELLED,
    },
    _W.SUSPENDED: {
        # wake_due, wake_if_message, wake_if_decided, wake_if_any, wake_workflow,
        # send_message, adopt_early_messages, decide_approval, expire_approvals;
        # cancel_workflows when a run must stop it.
        "wake": _W.PENDING,
        "cancel": _W.CANCELLED,  # cancel_workflows
        "pause": _W.PAUSED,  # pause_workflow: no wake-up moves it until it is unpaused
        "terminate": _W.CANCELLED,  # terminate_workflows
    },
    # Held by an operator: unpause_workflow makes it runnable where it stopped (ENQUEUED
    # when it never left its queue; a suspended one replays and waits again if it must);
    # cancel_workflows cancels it (a run stops one that started: undo, children).
    _W.PAUSED: {
        "unpause": _W.PENDING,
        "unpause_queued": _W.ENQUEUED,
        "cancel": _W.CANCELLED,
        "cancel_by_a_run": _W.PENDING,
        "terminate": _W.CANCELLED,  # terminate_workflows
    },
    # Finished. A failed, cancelled or given-up workflow can be resumed by an operator
    # (resume_workflow): it starts over from its journal. A cancelled workflow whose
    # compensations ran is not (its stored error says so), nor any other.
    _W.ERROR: {"resume": _W.PENDING},
    _W.CANCELLED: {"resume": _W.PENDING},
    _W.MAX_RECOVERY_ATTEMPTS_EXCEEDED: {"resume": _W.PENDING},
    _W.SUCCESS: {},
    _W.COMPENSATED: {},
    _W.COMPENSATION_FAILED: {},
    _W.COMPENSATING: {},
}

WORKFLOW_NEVER_WRITTEN: frozenset[WorkflowStatus] = frozenset({_W.COMPENSATING})

# The statuses a run's outcome (finish_workflow and its batched forms) may write.
FINISHED_BY_A_RUN: frozenset[WorkflowStatus] = frozenset(
    {_W.SUCCESS, _W.ERROR, _W.CANCELLED, _W.COMPENSATED, _W.COMPENSATION_FAILED}
)


def _targets(events: Mapping[S | None, Mapping[str, S]]) -> dict[S | None, frozenset[S]]:
    return {state: frozenset(moves.values()) for state, moves in events.items()}


EFFECT_TRANSITIONS: Mapping[EffectStatus | None, frozenset[EffectStatus]] = _targets(EFFECT_EVENTS)
WORKFLOW_TRANSITIONS: Mapping[WorkflowStatus | None, frozenset[WorkflowStatus]] = _targets(
    WORKFLOW_EVENTS
)


def allowed(table: Mapping[S | None, frozenset[S]], source: S | None, target: S) -> bool:
    """Whether `table` lets `target` follow `source` (None: the row does not exist yet)."""
    return target in table.get(source, frozenset())


def assert_transition(table: Mapping[S | None, frozenset[S]], source: S | None, target: S) -> None:
    """Raise TransitionError unless `table` lets `target` follow `source`. Called where
    the core asks for a move, so a move outside the machine fails before its statement
    is sent instead of leaving a row in a status nothing expects."""
    if not allowed(table, source, target):
        what = "a new row" if source is None else str(getattr(source, "value", source))
        raise TransitionError(f"no transition from {what} to {target.value}")


def is_settled(status: EffectStatus) -> bool:
    """An effect status that nothing follows: its outcome is the effect's for good."""
    return not EFFECT_TRANSITIONS[status]
