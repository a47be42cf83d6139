"""Durability modes: when a plain step's record reaches the database.

- sync: before the step returns (one statement, one commit per step).
- async: a background writer batches records of all running workflows into one statement
  and one commit; a bounded queue gives back-pressure; one writer keeps each workflow's
  records in order.
- exit: records stay in memory until the workflow finishes, fails, suspends or reaches a
  barrier.

In every mode an effect, a transaction step, a child workflow, an approval gate and the
final status are barriers: every record still unwritten for that workflow is written
before them. So a lazy mode can lose only the records of pure steps since the last
barrier, and those steps simply run again on resume; never an effect. (The decision is
`_core.barrier`; this module is the async mode's writer.)
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from durable.errors import DatabaseUnavailableError, StaleOwnerError

if TYPE_CHECKING:
    from durable._io.systemdb import SystemDB

logger = logging.getLogger("durable.writer")

_Key = tuple[str, int]


class AsyncWriter:
    """Writes queued step records in batches from one background thread."""

    def __init__(self, db: SystemDB, *, max_queue: int = 10_000, batch: int = 1_000) -> None:
        self._db = db
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(max_queue)
        self._batch = batch
        self._cond = threading.Condition()
        self._enqueued: Counter[_Key] = Counter()
        self._written: Counter[_Key] = Counter()
        self._refused: set[_Key] = set()
        # Records the database refused for a reason other than the fence (a statement
        # error): their run's next barrier raises it instead of waiting forever.
        self._failed: dict[_Key, Exception] = {}
        # Set once the thread has ended (stopped, or gone down with the process): a record
        # not written by then never will be, and nobody waits for it.
        self._gone = False
        self._thread = threading.Thread(target=self._loop, name="durable-writer", daemon=True)
        self._thread.start()

    def put(self, record: dict[str, Any]) -> None:
        """Queue a record; blocks while the queue is full (back-pressure)."""
        key = (record["workflow_id"], record["epoch"])
        with self._cond:
            if self._gone:
                raise self._stopped()
            self._enqueued[key] += 1
        self._queue.put(record)

    def wait(self, workflow_id: str, epoch: int) -> None:
        """Block until every record this run queued is written; StaleOwnerError if the
        database refused them (the run lost ownership); DatabaseUnavailableError if the
        writer stopped before writing them (the run is interrupted, as by an outage, and
        recovered: its plain steps since the last barrier run again)."""
        key = (workflow_id, epoch)
        with self._cond:
            while self._written[key] < self._enqueued[key]:
                if self._gone:
                    self._enqueued.pop(key, None)
                    self._written.pop(key, None)
                    self._refused.discard(key)
                    self._failed.pop(key, None)
                    raise self._stopped()
                self._cond.wait(0.5)
            refused = key in self._refused
            failed = self._failed.pop(key, None)
            self._refused.discard(key)
            self._enqueued.pop(key, None)
            self._written.pop(key, None)
        if failed is not None:
            raise failed
        if refused:
            raise StaleOwnerError(workflow_id, epoch)

    def flush(self) -> None:
        """Block until everything queued so far is written; DatabaseUnavailableError if
        the writer stopped before writing it all."""
        with self._cond:
            while any(self._written[k] < n for k, n in self._enqueued.items()):
                if self._gone:
                    raise self._stopped()
                self._cond.wait(0.5)

    def stop(self, flush: bool = True) -> None:
        """Stop the writer thread; with `flush`, after writing everything queued."""
        if flush:
            with contextlib.suppress(DatabaseUnavailableError):  # it stopped on its own
                self.flush()
        if not self._gone:  # (nobody takes from the queue of a writer gone: it may be full)
            self._queue.put(None)
        self._thread.join(timeout=30 if flush else 5)

    @staticmethod
    def _stopped() -> DatabaseUnavailableError:
        return DatabaseUnavailableError("the async writer stopped before writing the records")

    def _loop(self) -> None:
        """Write batches until stopped. However the thread ends (stopped, or a BaseException
        such as SystemExit going through it), the runs waiting on it are told, not left
        waiting for records nothing will write."""
        try:
            self._serve()
        finally:
            with self._cond:
                self._gone = True
                self._cond.notify_all()

    def _serve(self) -> None:
        failing = False
        while True:
            first = self._queue.get()
            if first is None:
                return
            rows = [first]
            while len(rows) < self._batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                rows.append(item)
            error: Exception | None = None
            while True:
                try:
                    written = Counter(self._db.write_steps(None, rows))
                    break
                except DatabaseUnavailableError as exc:
                    # Keep the batch: it is written once the database answers.
                    if not failing:
                        logger.debug("async writer: database unavailable, retrying: %s", exc)
                    failing = True
                    time.sleep(0.5)
                except Exception as exc:
                    # Not an outage: retrying cannot help. Every run in the batch hears of
                    # it at its next barrier; the writer itself goes on.
                    logger.error("async writer: the database refused a batch: %s", exc)
                    written, error = Counter(), exc
                    break
            if failing:
                logger.debug("async writer: database is back")
            failing = False
            per_key = Counter((r["workflow_id"], r["epoch"]) for r in rows)
            with self._cond:
                for key, n in per_key.items():
                    self._written[key] += n
                    if error is not None:
                        self._failed[key] = error
                    elif written[key[0]] < n:
                        self._refused.add(key)
                self._cond.notify_all()
