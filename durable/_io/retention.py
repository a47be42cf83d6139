"""Retention: what is deleted, when, and what is never touched.

Journals of finished workflows are deleted after `finished_after`, oldest first, in
batches of `batch_size` (each its own short transaction, rows locked with SKIP LOCKED so
pruning never waits on, or blocks, a worker). The effect ledger is an audit trail of what
moved the outside world; it has its own, longer window (`effects_after`) and outlives the
journals it came from. Workflows that can still run (enqueued, pending, running,
suspended, compensating) or that wait for an operator (max recovery attempts exceeded)
are never pruned, nor are the effects of such workflows. Callback URLs (durable.callback_url)
are deleted once expired for longer than `finished_after`, whatever their workflow's state:
a POST to one answers 410 until then, 404 after.

Messages sent with `send(..., before_start=True)` to an id no workflow has are kept for the
workflow that starts under it; those no workflow took within `early_messages_after` are
deleted too (a workflow that starts later does not get them).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from durable._io.bounded import unbounded
from durable.errors import ConfigurationError

if TYPE_CHECKING:
    from durable._io.systemdb import SystemDB


def _seconds(name: str, value: dt.timedelta | float) -> float:
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ConfigurationError(
            f"RetentionPolicy({name}={value!r}): give a timedelta (or seconds) of zero or more"
        )
    return float(seconds)


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished journals and the effect ledger are kept (see module docstring).

    Give it to `Engine(retention=...)` (or `durable worker --prune-finished-after ...`)
    and the worker loop applies it every `interval`; `engine.client.prune()` applies it once."""

    finished_after: dt.timedelta = dt.timedelta(days=7)
    effects_after: dt.timedelta = dt.timedelta(days=90)
    batch_size: int = 500
    interval: dt.timedelta = dt.timedelta(minutes=5)
    # How long a message sent before its workflow existed waits for it (send(...,
    # before_start=True)): after that, retention deletes it.
    early_messages_after: dt.timedelta = dt.timedelta(days=7)

    def __post_init__(self) -> None:
        _seconds("finished_after", self.finished_after)
        _seconds("effects_after", self.effects_after)
        _seconds("early_messages_after", self.early_messages_after)
        _seconds("interval", self.interval)
        if (
            isinstance(self.batch_size, bool)
            or not isinstance(self.batch_size, int)
            or (self.batch_size < 1)
        ):
            raise ConfigurationError(
                f"RetentionPolicy(batch_size={self.batch_size!r}): give a whole number >= 1"
            )

    @property
    def interval_seconds(self) -> float:
        return _seconds("interval", self.interval)


@dataclass(frozen=True)
class PruneReport:
    """What one prune deleted (or, with dry_run, would delete)."""

    workflows: int
    steps: int
    effects: int
    dry_run: bool
    # Messages kept for a workflow that did not start within early_messages_after.
    early_messages: int = 0


# What a long prune reports after each batch: ("workflows" or "effects", done, total), the
# totals counted before it began (rows finishing meanwhile may add a few).
PruneProgress = Callable[[str, int, int], None]


@unbounded()  # long by right: see _io/bounded.py
def prune(
    db: SystemDB,
    policy: RetentionPolicy,
    *,
    dry_run: bool = False,
    progress: PruneProgress | None = None,
) -> PruneReport:
    """Apply `policy` once: bounded batches until nothing old is left."""
    finished = _seconds("finished_after", policy.finished_after)
    effects = _seconds("effects_after", policy.effects_after)
    counts = db.fetch_one("count_prunable", {"finished_after": finished, "effects_after": effects})
    assert counts is not None
    early = _seconds("early_messages_after", policy.early_messages_after)
    if dry_run:
        kept = db.fetch_one("count_early_messages", {"older_than": early})
        assert kept is not None
        return PruneReport(
            counts["workflows"], counts["steps"], counts["effects"], True, kept["messages"]
        )
    deleted_workflows = deleted_steps = deleted_effects = 0
    while True:
        row = db.fetch_one("prune_finished", {"older_than": finished, "batch": policy.batch_size})
        assert row is not None
        batch = int(row["workflows"])
        deleted_workflows += batch
        deleted_steps += int(row["steps"])
        if progress is not None:
            progress("workflows", deleted_workflows, max(counts["workflows"], deleted_workflows))
        if batch < policy.batch_size:
            break
    while True:
        n = db.execute("prune_effects", {"older_than": effects, "batch": policy.batch_size})
        deleted_effects += n
        if progress is not None:
            progress("effects", deleted_effects, max(counts["effects"], deleted_effects))
        if n < policy.batch_size:
            break
    # Expired callback URLs: no workflow's data, so not in the report (nor in a dry run).
    expired = {"older_than": finished, "batch": policy.batch_size}
    while db.execute("prune_callbacks", expired) >= policy.batch_size:
        pass
    deleted_early = 0
    while True:
        n = db.execute("prune_early_messages", {"older_than": early, "batch": policy.batch_size})
        deleted_early += n
        if n < policy.batch_size:
            break
    return PruneReport(deleted_workflows, deleted_steps, deleted_effects, False, deleted_early)
