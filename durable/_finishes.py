"""Outcomes of runs that finish at the same moment, written in one statement (one commit).

A worker finishing many runs at once waits mostly for commits, one per finished run;
`FinishGroup` lets runs finishing together share one. It runs no SQL of its own: it hands
the named statements `finish_workflow` and `finish_workflows` to its SystemDB (`run_on`),
which it knows only as a `Finisher` (the SystemDB imports this module: importing it back
would close a cycle).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import psycopg

from durable.errors import DatabaseUnavailableError


class Finisher(Protocol):
    """What a FinishGroup uses of its SystemDB."""

    @property
    def distributed(self) -> bool: ...

    def run_on(
        self, conn: psycopg.Connection[Any], name: str, params: dict[str, Any], fetch: str
    ) -> Any: ...


class FinishGroup:
    """Writes the outcomes of runs that finish at the same moment in one statement.

    A run's outcome is one fenced UPDATE and one commit; a worker recovering thousands of
    workflows spends most of its time waiting for those commits, one per workflow. Here
    the first run to finish writes its outcome at once; runs finishing while that write is
    in flight queue up, and the next of them writes them all in one statement. Nobody
    waits for a timer: a lone finish costs what it did, concurrent ones share commits.
    Each caller gets its own fenced row count (1 written, 0 refused) or its own error, and
    returns only after the commit that holds its outcome.
    """

    def __init__(self, db: Finisher) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._queue: list[_Finish] = []
        self._writing = False

    def finish(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        if self._db.distributed:
            # On Citus a batch of outcomes is one statement over every shard, committed in
            # two phases; each outcome alone is one statement on its workflow's shard.
            return int(self._db.run_on(conn, "finish_workflow", params, "count"))
        mine = _Finish(params)
        with self._lock:
            self._queue.append(mine)
            lead = not self._writing
            self._writing = True
        if not lead:
            mine.done.wait()
        else:
            self._lead(conn)
        if mine.error is not None:
            raise mine.error
        return mine.count

    def _lead(self, conn: psycopg.Connection[Any]) -> None:
        """Write queued outcomes until none are left (the leader's own comes first)."""
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._writing = False
                    return
            try:
                if len(batch) == 1:
                    batch[0].count = self._db.run_on(
                        conn, "finish_workflow", batch[0].params, "count"
                    )
                else:
                    batch.sort(key=lambda f: f.params["workflow_id"])  # one lock order
                    rows = self._db.run_on(conn, "finish_workflows", _finish_params(batch), "all")
                    written = {r["workflow_id"] for r in rows}
                    for f in batch:
                        f.count = 1 if f.params["workflow_id"] in written else 0
            except Exception as exc:
                for f in batch:
                    f.error = exc
            except BaseException:
                # The leader's thread is going down (KeyboardInterrupt, SystemExit): those
                # waiting on it and behind it are not left waiting; their runs end
                # unfinished and are recovered like any interrupted run.
                with self._lock:
                    stranded, self._queue, self._writing = batch + self._queue, [], False
                for f in stranded:
                    f.error = DatabaseUnavailableError("the run writing this outcome stopped")
                    f.done.set()
                raise
            for f in batch:
                f.done.set()


class _Finish:
    __slots__ = ("count", "done", "error", "params")

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.done = threading.Event()
        self.count = 0
        self.error: Exception | None = None


def _finish_params(batch: Sequence[_Finish]) -> dict[str, list[Any]]:
    return {
        "workflow_ids": [f.params["workflow_id"] for f in batch],
        "epochs": [f.params["epoch"] for f in batch],
        "statuses": [f.params["status"] for f in batch],
        "outputs": [f.params["output"] for f in batch],
        "errors": [f.params["error"] for f in batch],
    }
