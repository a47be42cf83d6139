"""Writes of runs made at the same moment, sent in one statement (one commit): outcomes
(`FinishGroup`) and sync-mode step records (`StepGroup`).

A worker running many workflows at once waits mostly for commits, one per write; these
groups let writes made together share one, a group commit across workflows that keeps
each write's guarantee (its caller returns after the commit that holds it). They run no
SQL of their own: they hand named statements to their SystemDB (`run_on`), which they
know only as a `Finisher` (the SystemDB imports this module: importing it back would
close a cycle).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import psycopg

from durable._runio_base import steps_params
from durable.errors import DatabaseUnavailableError


class Finisher(Protocol):
    """What a FinishGroup uses of its SystemDB."""

    @property
    def distributed(self) -> bool: ...

    def run_on(
        self, conn: psycopg.Connection[Any], name: str, params: dict[str, Any], fetch: str
    ) -> Any: ...


class _Group:
    """Writes that runs make at the same moment, sent in one statement and one commit.

    The first run to write sends its own at once; runs writing while that statement is in
    flight queue up, and the next of them sends them all in one statement. Nobody waits for
    a timer: a lone write costs what it did, concurrent ones share commits. Each caller
    gets its own fenced row count (1 written, 0 refused) or its own error, and returns only
    after the commit that holds its write: the durability of each write is unchanged.
    """

    single = ""  # the statement that writes one (also on Citus, and for a lone write)

    def __init__(self, db: Finisher) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._queue: list[_Finish] = []
        self._writing = False
        # Called with "after_group_commit" once a shared commit is done and before anyone
        # sharing it returns (the runner hands its crash_point in: crash tests SIGKILL here).
        self.crash_point: Callable[[str], None] = _never

    def write(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        if self._db.distributed:
            # On Citus a batch is one statement over every shard, committed in two phases;
            # each write alone is one statement on its workflow's shard.
            return int(self._db.run_on(conn, self.single, params, "count"))
        with self._lock:
            lead = not self._writing
            if lead:
                self._writing = True
            else:
                mine = _Finish(params)
                self._queue.append(mine)
        if not lead:
            mine.done.wait()
            if mine.error is not None:
                raise mine.error
            return mine.count
        # The leader writes its own at once, alone (a lone write costs what it did: no
        # event, no batch), then what queued behind it meanwhile.
        try:
            count = int(self._db.run_on(conn, self.single, params, "count"))
        except Exception:
            self._lead(conn)
            raise
        except BaseException:
            self._strand([])
            raise
        self._lead(conn)
        return count

    def _strand(self, batch: list[_Finish]) -> None:
        """The leader's thread is going down (KeyboardInterrupt, SystemExit): those waiting
        on it and behind it are not left waiting; their runs end unfinished and are
        recovered like any interrupted run."""
        with self._lock:
            stranded, self._queue, self._writing = batch + self._queue, [], False
        for f in stranded:
            f.error = DatabaseUnavailableError("the run writing this stopped")
            f.done.set()

    def _lead(self, conn: psycopg.Connection[Any]) -> None:
        """Write queued writes until none are left. A batch holds one write per workflow
        (a zombie's and its owner's are told apart by their rows, which the statement does
        not return): a second waits for the next batch."""
        while True:
            with self._lock:
                batch: list[_Finish] = []
                rest: list[_Finish] = []
                seen: set[str] = set()
                for f in self._queue:
                    wid = f.params["workflow_id"]
                    (rest if wid in seen else batch).append(f)
                    seen.add(wid)
                self._queue = rest
                if not batch:
                    self._writing = False
                    return
            try:
                if len(batch) == 1:
                    batch[0].count = self._db.run_on(conn, self.single, batch[0].params, "count")
                else:
                    batch.sort(key=lambda f: f.params["workflow_id"])  # one lock order
                    written = self._together(conn, batch)
                    for f in batch:
                        f.count = 1 if f.params["workflow_id"] in written else 0
                    self.crash_point("after_group_commit")
            except DatabaseUnavailableError as exc:
                for f in batch:
                    f.error = exc
            except Exception as exc:
                if len(batch) == 1:
                    batch[0].error = exc
                else:
                    # One write the database refused (a bad value, a key taken) fails the
                    # statement for all: each is sent alone, to get its own answer.
                    for f in batch:
                        try:
                            f.count = self._db.run_on(conn, self.single, f.params, "count")
                        except Exception as own:
                            f.error = own
            except BaseException:
                self._strand(batch)
                raise
            for f in batch:
                f.done.set()

    def _together(self, conn: psycopg.Connection[Any], batch: Sequence[_Finish]) -> set[str]:
        """Send the batch in one statement; the workflow ids whose write it made."""
        raise NotImplementedError


class FinishGroup(_Group):
    """Outcomes of runs that finish at the same moment (finish_workflow): a worker
    recovering thousands of workflows spends most of its time waiting for their commits."""

    single = "finish_workflow"

    def finish(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        return self.write(conn, params)

    def _together(self, conn: psycopg.Connection[Any], batch: Sequence[_Finish]) -> set[str]:
        rows = self._db.run_on(conn, "finish_workflows", _finish_params(batch), "all")
        return {r["workflow_id"] for r in rows}


class StepGroup(_Group):
    """Step records of sync-mode runs written at the same moment (record_step, each fenced
    by its own run's epoch): many workflows stepping at once on one worker share commits,
    and each step still returns only once its record is committed."""

    single = "record_step"

    def record(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        if params["child_workflow_id"] is not None:  # record_steps has no such column
            return int(self._db.run_on(conn, self.single, params, "count"))
        return self.write(conn, params)

    def _together(self, conn: psycopg.Connection[Any], batch: Sequence[_Finish]) -> set[str]:
        rows = self._db.run_on(conn, "record_steps", steps_params([f.params for f in batch]), "all")
        return {r["workflow_id"] for r in rows}


def _never(point: str) -> None:
    return None


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
