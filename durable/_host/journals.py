"""Loading the journals of a batch of claimed workflows: one query, rows kept as tuples.

A recovery claims workflows by the batch and loads their journals in one statement; the
rows stay as they came (tuples, no dict per row) and each becomes a StepRecord only when
its run reaches its position (see _core.JournalRows), on the run's own thread. The worker
loop that claims (one thread for every run of its process) does the least it can.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable._base.models import StepKind
from durable._core import Journal

if TYPE_CHECKING:
    from collections.abc import Sequence

    from durable._io.systemdb import SystemDB

_KINDS = frozenset(kind.value for kind in StepKind)


def load_journals(
    db: SystemDB, workflow_ids: list[str]
) -> tuple[dict[str, Journal], dict[str, Exception]]:
    """The journals of `workflow_ids`, and for a journal that cannot be read (a record of
    a kind this code does not know) the error its workflow fails with (never started)."""
    rows: dict[str, dict[int, Sequence[Any]]] = {w: {} for w in workflow_ids}
    broken: dict[str, Exception] = {}
    for row in db.fetch_rows("load_journals", {"workflow_ids": workflow_ids}):
        # (workflow_id, step_seq, step_name, kind, ...): see StepRecord.from_journal_row.
        if row[3] not in _KINDS:
            broken[row[0]] = ValueError(f"{row[3]!r} is not a valid StepKind")
            continue
        rows[row[0]][row[1]] = row
    return {w: Journal.from_rows(w, r) for w, r in rows.items()}, broken
