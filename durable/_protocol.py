"""Pure replay-or-execute decisions. No I/O and no psycopg here.

A run of a workflow walks its journal in call order: the n-th step call gets position n.
If the journal has a record at n, the call replays it (after checking the step's name, so
changed code cannot silently read another step's output); if not, the call executes. The
drivers in `_executor.py` do the I/O around these decisions, which is what lets an async
driver be added without a second copy of the logic.
"""

from __future__ import annotations

import json
import random
import traceback as tb
from collections.abc import Iterable
from dataclasses import dataclass, field

from durable._models import StepRecord
from durable.errors import NondeterminismError, StepError


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


def child_workflow_id(parent_id: str, step_seq: int) -> str:
    """Deterministic id of the child started at a parent's position."""
    return f"{parent_id}:child:{step_seq}"


def encode_error(exc: BaseException) -> str:
    """Errors are always stored as JSON, whatever the value serializer is."""
    cls = type(exc)
    return json.dumps(
        {
            "type": f"{cls.__module__}.{cls.__qualname__}",
            "message": str(exc),
            "traceback": "".join(tb.format_exception(exc)),
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
        import builtins

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
