"""Frozen records of what the database holds, built from rows by `from_row`."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class WorkflowStatus(StrEnum):
    """Mirror of the CHECK constraint on workflows.status (see 0001_initial.sql)."""

    ENQUEUED = "ENQUEUED"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
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
    """Mirror of the CHECK constraint on steps.kind."""

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
        )
