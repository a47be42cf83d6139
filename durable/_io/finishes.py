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

from durable._io.runio_base import steps_params
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

    name = ""  # the statement that writes one (on Citus, alone, and for a lone write)

    def __init__(self, db: Finisher) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._queue: list[_Write] = []
        self._writing = False
        # Called with "after_group_commit" once a shared commit is done and before anyone
        # sharing it returns (the runner hands its crash_point in: crash tests SIGKILL here).
        self.crash_point: Callable[[str], None] = _never

    def write(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        if self._db.distributed:
            # On Citus a batch is one statement over every shard, committed in two phases;
            # each write alone is one statement on its workflow's shard.
            return int(self._db.run_on(conn, self.name, params, "count"))
        mine: _Write | None = None
        with self._lock:
            if self._writing:
                mine = _Write(params)
                self._queue.append(mine)
            else:
                self._writing = True
        if mine is not None:
            try:
                mine.done.wait()
                lead = mine.lead
                if lead:
                    # Handed the lead: its own write heads the queue, and goes in the batch
                    # it sends now, on its own connection.
                    mine.done.clear()
            except BaseException:
                self._abandon(mine)  # (a Ctrl-C while waiting: the lead must not stop here)
                raise
            if lead:
                self._lead(conn)
            if mine.error is not None:
                raise mine.error
            return mine.count
        # The leader writes its own at once, alone (a lone write costs what it did: no
        # event, no batch), then one batch of what queued behind it meanwhile.
        try:
            count = int(self._db.run_on(conn, self.name, params, "count"))
        except BaseException:
            # Its connection may be what failed: the next writer leads, on its own.
            self._hand_on()
            raise
        with self._lock:
            if not self._queue:  # nobody wrote meanwhile (a lone writer): the lead lapses
                self._writing = False
                return count
        self._lead(conn)
        return count

    def _lead(self, conn: psycopg.Connection[Any]) -> None:
        """Send one batch of what is queued, then hand the lead to the next queued writer:
        a leader writes its own and at most one batch of others', so its run is not held up
        writing theirs. A batch holds one write per workflow (a zombie's and its owner's
        are told apart by their rows, which the statement does not return): a second goes
        in a later batch."""
        batch: list[_Write] = []
        try:
            with self._lock:
                rest: list[_Write] = []
                seen: set[str] = set()
                for f in self._queue:
                    wid = f.params["workflow_id"]
                    (rest if wid in seen else batch).append(f)
                    seen.add(wid)
                self._queue = rest
            if batch:
                if self._send(conn, batch) and len(batch) > 1:
                    self.crash_point("after_group_commit")
                for f in batch:
                    f.done.set()
        except BaseException:
            self._strand(batch)
            raise
        self._hand_on()

    def _send(self, conn: psycopg.Connection[Any], batch: list[_Write]) -> bool:
        """Write the batch, giving each its count or error; whether it went in one piece.
        A batch that fails as an outage is not sent again elsewhere: it may have committed
        (a lost reply), and each run, interrupted, is resumed as after any outage."""
        try:
            if len(batch) == 1:
                batch[0].count = self._db.run_on(conn, self.name, batch[0].params, "count")
            else:
                batch.sort(key=lambda f: f.params["workflow_id"])  # one lock order
                written = self._together(conn, batch)
                for f in batch:
                    f.count = 1 if f.params["workflow_id"] in written else 0
            return True
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
                        f.count = self._db.run_on(conn, self.name, f.params, "count")
                    except Exception as alone:
                        f.error = alone
        return False

    def _hand_on(self) -> None:
        """The lead passes to the first queued writer (woken to send a batch on its own
        connection), or lapses if nobody waits."""
        with self._lock:
            if not self._queue:
                self._writing = False
                return
            following = self._queue[0]
            following.lead = True
        following.done.set()

    def _abandon(self, mine: _Write) -> None:
        """A queued writer's thread is going down while it waits: it leaves the queue, and
        passes on the lead if it was just handed it (its write, if already in a batch in
        flight, may still be committed: its run's replay then finds it)."""
        with self._lock:
            self._queue = [f for f in self._queue if f is not mine]
            handed, mine.lead = mine.lead, False
        if handed:
            self._hand_on()

    def _strand(self, batch: list[_Write]) -> None:
        """The leader's thread is going down (KeyboardInterrupt, SystemExit): those waiting
        on it and behind it are not left waiting; their runs end unfinished and are
        recovered like any interrupted run (a record written meanwhile is replayed)."""
        with self._lock:
            stranded, self._queue, self._writing = batch + self._queue, [], False
        for f in stranded:
            if not f.done.is_set():  # (those its batch answered already are told)
                f.error = DatabaseUnavailableError("the run writing this stopped")
                f.done.set()

    def _together(self, conn: psycopg.Connection[Any], batch: Sequence[_Write]) -> set[str]:
        """Send the batch in one statement; the workflow ids whose write it made."""
        raise NotImplementedError


class FinishGroup(_Group):
    """Outcomes of runs that finish at the same moment (finish_workflow): a worker
    recovering thousands of workflows spends most of its time waiting for their commits."""

    name = "finish_workflow"

    def finish(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        return self.write(conn, params)

    def _together(self, conn: psycopg.Connection[Any], batch: Sequence[_Write]) -> set[str]:
        rows = self._db.run_on(conn, "finish_workflows", _finish_params(batch), "all")
        return {r["workflow_id"] for r in rows}


class StepGroup(_Group):
    """Step records of sync-mode runs written at the same moment (record_step, each fenced
    by its own run's epoch): many workflows stepping at once on one worker share commits,
    and each step still returns only once its record is committed."""

    name = "record_step"

    def record(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        if params["child_workflow_id"] is not None:  # record_steps has no such column
            return int(self._db.run_on(conn, self.name, params, "count"))
        return self.write(conn, params)

    def _together(self, conn: psycopg.Connection[Any], batch: Sequence[_Write]) -> set[str]:
        rows = self._db.run_on(conn, "record_steps", steps_params([f.params for f in batch]), "all")
        return {r["workflow_id"] for r in rows}


def _never(point: str) -> None:
    return None


class _Signal:
    """A one-waiter event on a bare lock (held until set): what threading.Event does for a
    writer waiting on its group's commit, at a fraction of its cost (no Condition, no
    waiter list, no notify): a worker hands off one of these per step."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def wait(self) -> None:
        """Until set; only its one waiter calls it (then clear() before it waits again)."""
        self._lock.acquire()

    def clear(self) -> None:
        self._set = False  # the lock is held again: the waiter took it

    def is_set(self) -> bool:
        return self._set


class _Write:
    __slots__ = ("count", "done", "error", "lead", "params")

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.done = _Signal()
        self.count = 0
        self.error: Exception | None = None
        self.lead = False  # handed the lead (woken to send a batch itself)


def _finish_params(batch: Sequence[_Write]) -> dict[str, list[Any]]:
    return {
        "workflow_ids": [f.params["workflow_id"] for f in batch],
        "epochs": [f.params["epoch"] for f in batch],
        "statuses": [f.params["status"] for f in batch],
        "outputs": [f.params["output"] for f in batch],
        "errors": [f.params["error"] for f in batch],
    }
