"""Bulk actions: one operator action (cancel, resume, retry, move to a version) on every
run a RunFilter matches.

A dry run counts the runs the action would act on and lists a sample; nothing is
written. A real run walks the matches newest first in pages of `batch_size` (a keyset:
each page is read again from the database after the one before, so a page costs the same
at any depth and a run the action changed is not met twice) and applies the action to
each run in a transaction of its own, through the same calls as one run's action, so each
is recorded in the audit log (migration 0028) as if asked alone.

Interrupted and run again, a bulk action does nothing twice: it acts only on the statuses
it can change (a cancelled run is no longer matched by a cancel, a resumed one no longer
by a resume), and what a status cannot tell is checked per run: a run already asked to
stop is not asked again; a run already on the target version is not moved; a retry is a
fork from the start under an id derived from the original's (`<id>:retry`), so a second
retry of the same run finds its fork and starts nothing. A run the action refuses (a
resume of a run whose undo ran, a move of a run whose lease is live) is counted as
refused with the reason, and the walk goes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from durable._base import labels
from durable._base.models import WorkflowInfo, WorkflowStatus
from durable._base.names import check_text, check_version
from durable._client import audit
from durable._io.systemdb import SystemDB
from durable._run.filter import RunFilter
from durable.errors import ConfigurationError, DurableError


class Client(Protocol):
    """What a bulk action uses of a Client: its reads and one run's actions."""

    actor: str | None

    @property
    def db(self) -> SystemDB: ...

    def count_workflows(self, *, cap: int, filter: RunFilter | None) -> int: ...

    def list_workflows(
        self, *, limit: int, filter: RunFilter | None, after: tuple[Any, str] | None = None
    ) -> list[WorkflowInfo]: ...

    def cancel_tree(self, workflow_id: str, reason: str) -> dict[str, WorkflowStatus]: ...

    def _resume(self, workflow_id: str, *, version: str | None = None) -> dict[str, Any] | None: ...

    def fork(self, workflow_id: str, *, from_step: int, new_id: str | None = None) -> Any: ...


_W = WorkflowStatus
#: The statuses each action can change; a filter's statuses are cut to these.
ACTIONS: dict[str, tuple[WorkflowStatus, ...]] = {
    "cancel": (_W.ENQUEUED, _W.PENDING, _W.RUNNING, _W.SUSPENDED),
    "resume": (_W.CANCELLED, _W.ERROR, _W.MAX_RECOVERY_ATTEMPTS_EXCEEDED),
    "retry": (_W.ERROR, _W.CANCELLED, _W.MAX_RECOVERY_ATTEMPTS_EXCEEDED),
    "move": (
        _W.ENQUEUED,
        _W.PENDING,
        _W.SUSPENDED,
        _W.RUNNING,
        _W.CANCELLED,
        _W.ERROR,
        _W.MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    ),
}
#: A retry named by status may also run a finished run again (a success, an undone one).
_RETRY_NAMED = (*ACTIONS["retry"], _W.SUCCESS, _W.COMPENSATED, _W.COMPENSATION_FAILED)

MAX_BATCH = 1000
MAX_REFUSED = 100  # reasons kept in a result (the count goes on)

#: progress(done, total): after each batch (total: the dry count, capped).
BulkProgress = Callable[[int, int], None]


@dataclass(frozen=True)
class BulkResult:
    """What a bulk action matched and did.

    action: "cancel", "resume", "retry" or "move". dry_run: nothing was written.
    matched: the runs matching the filter in the statuses the action changes (a dry run:
      counted up to `cap`, so a result equal to it means "at least"; a real run: met).
    changed: the runs this call acted on (0 in a dry run). unchanged: met but already done
      (asked to stop, on the version, retried). refused: {workflow_id: why} (at most 100).
    sample: some matching runs, newest first (a dry run's list to check).
    started: the ids of the runs a retry started.
    """

    action: str
    dry_run: bool
    matched: int
    changed: int = 0
    unchanged: int = 0
    refused: dict[str, str] = field(default_factory=dict)
    sample: tuple[WorkflowInfo, ...] = ()
    started: tuple[str, ...] = ()


def selection(action: str, chosen: RunFilter) -> RunFilter | None:
    """The filter of the runs `action` changes among `chosen`'s (None: none can be)."""
    if action not in ACTIONS:
        raise ConfigurationError(
            f"bulk action {action!r}: use one of {', '.join(ACTIONS)} (retry: fork from the "
            "start; move: resume under another version)"
        )
    if not isinstance(chosen, RunFilter):
        raise ConfigurationError(f"filter={chosen!r}: give a durable.RunFilter")
    allowed = _RETRY_NAMED if action == "retry" and chosen.status else ACTIONS[action]
    return chosen.narrowed(allowed)


def run(
    client: Client,
    action: str,
    chosen: RunFilter,
    *,
    dry_run: bool,
    version: str | None = None,
    reason: str = "cancelled in bulk",
    batch_size: int = 100,
    sample: int = 10,
    cap: int = 100_000,
    progress: BulkProgress | None = None,
) -> BulkResult:
    """Client.bulk (see there)."""
    selected = selection(action, chosen)
    if action == "move":
        if version is None:
            raise ConfigurationError('bulk move needs version= ("" for no version)')
        check_version("version", version)
    elif version is not None:
        raise ConfigurationError(f"version= is for a bulk move, not {action}")
    check_text("reason", reason)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ConfigurationError(f"batch_size={batch_size!r}: give a whole number")
    if not 1 <= batch_size <= MAX_BATCH:
        raise ConfigurationError(f"batch_size={batch_size}: give 1 to {MAX_BATCH}")
    if selected is None:
        return BulkResult(action, dry_run, 0)
    total = client.count_workflows(filter=selected, cap=cap)
    shown = tuple(client.list_workflows(filter=selected, limit=sample)) if sample > 0 else ()
    if dry_run:
        return BulkResult(action, True, total, sample=shown)
    met = changed = unchanged = 0
    refused: dict[str, str] = {}
    started: list[str] = []
    after: tuple[Any, str] | None = None
    while True:
        page = client.list_workflows(filter=selected, limit=batch_size, after=after)
        if not page:
            break
        for info in page:
            met += 1
            try:
                outcome = _act(client, action, info, version, reason)
            except DurableError as exc:
                if len(refused) < MAX_REFUSED:
                    refused[info.workflow_id] = str(exc)
                continue
            if outcome is None:
                unchanged += 1
            else:
                changed += 1
                if action == "retry":
                    started.append(outcome)
        after = (page[-1].created_at, page[-1].workflow_id)
        if progress is not None:
            progress(met, max(total, met))
    if changed:
        audit.bulk(client, action, " ".join(_described(chosen)) or "every run", changed)
    return dataclasses.replace(
        BulkResult(action, False, met, changed, unchanged, refused, shown),
        started=tuple(started),
    )


def _act(
    client: Client, action: str, info: WorkflowInfo, version: str | None, reason: str
) -> str | None:
    """Apply `action` to one run: what it did (the run's id, a retry's new id), or None
    when it was already done."""
    workflow_id = info.workflow_id
    if action == "cancel":
        request = client.db.fetch_one("get_cancel_request", {"workflow_id": workflow_id})
        if request is not None and request["cancel_reason"] is not None:
            return None  # already asked to stop
        asked = client.cancel_tree(workflow_id, reason)
        return workflow_id if workflow_id in asked else None
    if action == "resume":
        return workflow_id if client._resume(workflow_id) is not None else None
    if action == "move":
        if (info.version or "") == version:
            return None
        return workflow_id if client._resume(workflow_id, version=version) is not None else None
    new_id = labels.retry_id(workflow_id)
    if client.db.fetch_one("get_workflow_status", {"workflow_id": new_id}) is not None:
        return None  # retried before
    try:
        client.fork(workflow_id, from_step=0, new_id=new_id)
    except ConfigurationError:
        if client.db.fetch_one("get_workflow_status", {"workflow_id": new_id}) is not None:
            return None  # another retry made it meanwhile
        raise
    return new_id


def _described(chosen: RunFilter) -> list[str]:
    """The filter as text, for the audit row."""
    out = []
    if chosen.status:
        out.append("status=" + ",".join(str(s) for s in chosen.status))
    for name in ("name", "version", "parent_id", "id_prefix", "created_from", "created_to"):
        value = getattr(chosen, name)
        if value is not None:
            out.append(f"{name}={value}")
    if chosen.top_level:
        out.append("top_level")
    return out + chosen.expressions()
