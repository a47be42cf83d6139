"""Frozen records of what the database holds (built from rows by `from_row`), the
statuses as StrEnums, and the small option and value classes the pure core works with."""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

from durable.errors import InvalidBudgetError, JournalVersionError


class WorkflowStatus(StrEnum):
    """Mirror of the CHECK constraint on workflows.status (see 0001_initial.sql)."""

    ENQUEUED = "ENQUEUED"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    # Held by an operator (Client.pause): nothing claims, wakes or dequeues it until it is
    # unpaused, and it holds no slot. Not finished: it goes on where it stopped.
    PAUSED = "PAUSED"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    MAX_RECOVERY_ATTEMPTS_EXCEEDED = "MAX_RECOVERY_ATTEMPTS_EXCEEDED"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        WorkflowStatus.SUCCESS,
        WorkflowStatus.ERROR,
        WorkflowStatus.CANCELLED,
        WorkflowStatus.COMPENSATED,
        WorkflowStatus.COMPENSATION_FAILED,
        WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    }
)


class StepKind(StrEnum):
    """What a journal row is (steps.kind). The table has no CHECK on it (0041): every kind
    durable writes is one of these, and an import refuses any other."""

    STEP = "step"
    TRANSACTION = "transaction"
    CHILD = "child"
    EFFECT = "effect"
    SLEEP = "sleep"
    RECV = "recv"
    SEND = "send"
    EVENT = "event"
    APPROVAL = "approval"
    TOOL = "tool"
    STATE = "state"
    TURN = "turn"
    STREAM = "stream"
    PATCH = "patch"


@dataclass(frozen=True)
class WorkflowInfo:
    """One workflow as stored. `inputs`, `output` and `error` are the stored text."""

    workflow_id: str
    name: str
    version: str | None
    status: WorkflowStatus
    inputs: str
    output: str | None
    error: str | None
    serializer: str
    durability: str
    parent_id: str | None
    owner: str | None
    epoch: int
    recovery_attempts: int
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    journal_version: int = 1
    """The journal format the workflow is written in (see durable/_base/labels.py)."""
    # Runnable (or interrupted) and no live executor has its (name, version): it waits for
    # a worker with that code. Read by list_workflows; None where it was not read. Not
    # stored but seen (workers come and go), so two reads of one row still compare equal.
    waiting_for_worker: bool | None = field(default=None, compare=False)
    # Its attributes (attributes= at its start, durable.set_attributes): {} where none.
    attributes: dict[str, Any] = field(default_factory=dict, hash=False)
    # A pause was asked (Client.pause): a PAUSED workflow, or a RUNNING one that stops at
    # its next step boundary. Read by get_workflow only (False elsewhere).
    pause_requested: bool = field(default=False, compare=False)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> WorkflowInfo:
        return cls(
            workflow_id=row["workflow_id"],
            name=row["name"],
            version=row["version"],
            status=WorkflowStatus(row["status"]),
            inputs=row["inputs"],
            output=row["output"],
            error=row["error"],
            serializer=row["serializer"],
            durability=row["durability"],
            parent_id=row["parent_id"],
            owner=row["owner"],
            epoch=int(row["epoch"]),
            recovery_attempts=int(row["recovery_attempts"]),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            finished_at=row["finished_at"],
            journal_version=int(row.get("journal_version", 1)),
            waiting_for_worker=row.get("waiting_for_worker"),
            attributes=dict(row.get("attributes") or {}),
            pause_requested=bool(row.get("pause_requested", False)),
        )

    def check_journal(self) -> None:
        """JournalVersionError when this workflow's journal is of a newer format than this
        code reads (durable/_base/labels.py, JOURNAL_VERSION): running it could misread its
        names, so it is left for code that knows its version."""
        from durable._base.labels import JOURNAL_VERSION

        if self.journal_version > JOURNAL_VERSION:
            raise JournalVersionError(
                f"the journal of workflow {self.workflow_id!r}",
                self.journal_version,
                JOURNAL_VERSION,
                self.workflow_id,
            )


@dataclass(frozen=True)
class StepRecord:
    """One journaled step call."""

    step_seq: int
    step_name: str
    kind: StepKind
    output: str | None
    error: str | None
    attempts: int
    child_workflow_id: str | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    # On an effect call a fork copied: the workflow whose ledger records that call (the
    # fork shares the effect and its one undo with it). None on a workflow's own calls.
    applied_in: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StepRecord:
        return cls(
            step_seq=int(row["step_seq"]),
            step_name=row["step_name"],
            kind=StepKind(row["kind"]),
            output=row["output"],
            error=row["error"],
            attempts=int(row["attempts"]),
            child_workflow_id=row.get("child_workflow_id"),
            started_at=row.get("started_at"),
            finished_at=row.get("finished_at"),
            applied_in=row.get("applied_in"),
        )

    @classmethod
    def from_journal_row(cls, row: Sequence[Any]) -> StepRecord:
        """A record from a row of load_journals as a tuple: the workflow id, then the
        fields in their order (no dict per row: a recovery reads thousands at once)."""
        _, seq, name, kind, output, error, attempts, *rest = row
        return cls(int(seq), name, _KINDS[kind], output, error, int(attempts), *rest)


# A stored kind's member (StepKind(kind), without the call; KeyError for no kind).
_KINDS = {kind.value: kind for kind in StepKind}


class EffectStatus(StrEnum):
    """Mirror of the CHECK constraint on effects.status: the write-ahead states of an effect.

    intent: recorded before anything happened (the key is reserved).
    pending: the call to the outside world may have started.
    applied: the call returned; its result is recorded.
    failed: the call raised; its error is recorded.
    """

    INTENT = "intent"
    PENDING = "pending"
    APPLIED = "applied"
    FAILED = "failed"


class ApprovalStatus(StrEnum):
    """Mirror of the CHECK constraint on approvals.status."""

    WAITING = "waiting"
    APPROVED = "approved"
    DENIED = "denied"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class Decision:
    """The outcome of an approval gate.

    approved: whether the action may go ahead.
    comment: what the person wrote (None if nothing, or on timeout).
    decided_by: who decided (None on timeout).
    timed_out: True when nobody decided in time and the gate's default decided.
    """

    approved: bool
    comment: str | None = None
    decided_by: str | None = None
    timed_out: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Decision:
        status = ApprovalStatus(row["status"])
        if status is ApprovalStatus.TIMED_OUT:
            return cls(bool(row["default_approved"]), None, None, True)
        return cls(status is ApprovalStatus.APPROVED, row["comment"], row["decided_by"], False)


@dataclass(frozen=True)
class Winner:
    """What durable.wait_first() returns: the position of the condition that won in the
    list given, and its value (the message, the Decision, None for a timer, the child's
    value). Unpacks as `index, value = durable.wait_first([...])`."""

    index: int
    value: Any

    def __iter__(self) -> Iterator[Any]:
        return iter((self.index, self.value))


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing step is retried.

    retries: extra attempts after the first (default 0: no retry).
    initial_delay: seconds before the first retry (default 0.1).
    backoff: multiplier per retry (default 2.0).
    max_delay: cap on one delay, in seconds (default 30.0).
    jitter: fraction of each delay randomised, so retries of many workflows spread out
        (default 0.1).
    retry_on: exception types that are retried (default: Exception); others fail at once.
    """

    retries: int = 0
    initial_delay: float = 0.1
    backoff: float = 2.0
    max_delay: float = 30.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        base = min(self.max_delay, self.initial_delay * self.backoff ** (attempt - 1))
        spread = base * self.jitter
        r = (rng or random).uniform(-spread, spread)
        return max(0.0, base + r)

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        return attempt <= self.retries and isinstance(exc, self.retry_on)


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


def check_amount(name: str, value: object, whole: bool) -> None:
    """Raise InvalidBudgetError unless `value` is None or an amount of zero or more."""
    _check_amount(name, value, whole)


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
    # Wall-clock seconds from the budget's creation (the root's first start), across
    # crashes, restarts and waits.
    seconds: float | None = None

    def __post_init__(self) -> None:
        _check_amount("dollars", self.dollars, whole=False)
        _check_amount("tokens", self.tokens, whole=True)
        _check_amount("steps", self.steps, whole=True)
        _check_amount("seconds", self.seconds, whole=False)


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
    limit_seconds: Decimal | None = None
    started_at: dt.datetime | None = None

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
            row.get("limit_seconds"),
            row.get("started_at"),
        )

    def elapsed(self, now: dt.datetime) -> float:
        """Seconds since the budget was created (its tree's first start)."""
        if self.started_at is None:
            return 0.0
        return max(0.0, (now - self.started_at).total_seconds())

    def exhausted(self, now: dt.datetime | None = None) -> str | None:
        """What is used up (for the next step to be refused), or None."""
        if self.limit_seconds is not None and now is not None:
            elapsed = self.elapsed(now)
            if elapsed >= self.limit_seconds:
                return f"seconds: {elapsed:.1f} of {self.limit_seconds} elapsed"
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
                "seconds": None if self.limit_seconds is None else float(self.limit_seconds),
            },
            "spent": {
                "dollars": float(self.spent_dollars),
                "tokens": self.spent_tokens,
                "steps": self.spent_steps,
            },
            "started_at": None if self.started_at is None else self.started_at.isoformat(),
        }
