"""Claims: which workflows this executor takes, and the runs it has launched.

A claim bumps a workflow's epoch and leases it to this executor (FOR UPDATE SKIP LOCKED,
or compare-and-set on Citus); the claim's journal is loaded with it, and its inputs are
decoded. A round of claims RETURNS them: whoever asked (the worker loop, the keeper of an
engine that is not a worker, `resume`, `fork`, a caller that waits for a suspended run)
hands them to the runner to launch. Claiming and running are apart, so the worker loop
knows the claims and the slots and nothing of how a run is hosted.

`Slots` counts what is running: runs on the engine's threads, async runs on its event
loops (which hold no thread), and says when one ends.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from durable._base import labels
from durable._base.models import StepRecord, WorkflowStatus
from durable._core import Journal, encode_error
from durable._host.journals import load_journals
from durable._io.local import Claimed
from durable._run.context import current_run
from durable.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    SerializationError,
    UnknownInstanceError,
    UnknownWorkflowError,
)

if TYPE_CHECKING:
    from durable._base.registry import Registry, WorkflowDef
    from durable._client.inputs import Inputs
    from durable._client.queues import Queue
    from durable._io.config import Config
    from durable._io.ownership import Ownership
    from durable._io.systemdb import SystemDB

logger = logging.getLogger("durable.runner")

# While every claim round comes back full, how often one wakes the due sleepers.
_WAKE_EVERY = 0.05


class Slots:
    """The futures of the runs this process launched and has not seen end: sync ones hold
    a thread of the pool, async ones only a task of an event loop (counted apart, against
    max_async)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sync: set[concurrent.futures.Future[Any]] = set()
        self._async: set[concurrent.futures.Future[Any]] = set()
        # Set whenever a run ends (once wait_for_room was called: when one leaves room).
        self.freed = threading.Event()
        self._room_at = -1
        # Set too when a run ends, while the worker loop waits with queue entries left.
        self.wake_on_free: threading.Event | None = None

    def add(self, future: concurrent.futures.Future[Any], asynchronous: bool) -> None:
        with self._lock:
            (self._async if asynchronous else self._sync).add(future)
        future.add_done_callback(self._ended)

    def _ended(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._sync.discard(future)
            self._async.discard(future)
            room = len(self._sync) <= self._room_at or self._room_at < 0
        if room:
            self.freed.set()
        wake = self.wake_on_free
        if wake is not None:
            wake.set()

    def wait_for_room(self, most: int, timeout: float) -> None:
        """Until at most `most` runs hold threads, or `timeout` seconds: woken once, when
        the run that makes room ends (not by each run that ends before it)."""
        with self._lock:
            self._room_at = most
            if len(self._sync) <= most:
                return
            self.freed.clear()
        self.freed.wait(timeout)

    def threads_running(self) -> int:
        """Runs on this executor's threads (what max_workers bounds)."""
        with self._lock:
            return len(self._sync)

    def tasks_running(self) -> int:
        """Async runs, tasks of this executor's event loops (what max_async bounds)."""
        with self._lock:
            return len(self._async)

    def threads(self) -> list[concurrent.futures.Future[Any]]:
        """The futures of the runs on threads (what a clean shutdown waits for)."""
        with self._lock:
            return list(self._sync)


@contextmanager
def _keeping(claimed: list[Claimed]) -> Iterator[None]:
    """A round that fails after it claimed some workflows still returns those claims (they
    are leased to this executor: unlaunched, they would wait for their leases to run out);
    with none claimed, the error is raised. Said at WARNING either way: a half of the round
    that keeps failing (the async one, say) would otherwise starve its workflows silently."""
    try:
        yield
    except Exception as exc:
        if not claimed:
            raise
        logger.warning(
            "a claim round failed after %d claims (those are run): %s",
            len(claimed),
            exc,
            exc_info=True,
            extra={"event": "claim_round_failed", "claimed": len(claimed)},
        )


class Claims:
    """Claims runnable workflows this registry has the code of, for one executor."""

    def __init__(
        self,
        config: Config,
        registry: Registry,
        inputs: Inputs,
        ownership: Ownership,
        db: Callable[[], SystemDB],
    ) -> None:
        self.config = config
        self.registry = registry
        self.inputs = inputs
        self.ownership = ownership
        self._db = db
        self._wake_after = 0.0  # (see _rows)

    @property
    def db(self) -> SystemDB:
        return self._db()

    def round(self, workflow_ids: list[str] | None, limit: int, async_limit: int) -> list[Claimed]:
        """Claim what there is room for: sync workflows up to `limit` (threads), async ones
        up to `async_limit` (0 when there is no event loop to run them)."""
        defs = self.registry.workflows()
        claimed: list[Claimed] = []
        with _keeping(claimed):
            if limit > 0 and any(not d.is_async for d in defs):
                self._load(self._rows(workflow_ids, limit, False), claimed)
            if async_limit > 0 and any(d.is_async for d in defs):
                self._load(self._rows(workflow_ids, async_limit, True), claimed)
        return claimed

    def dequeue(
        self, limit: int, only: list[str] | None = None, asynchronous: bool = True
    ) -> list[Claimed]:
        """Dequeue up to `limit` entries from the queues of this registry, as far as each
        queue's limits allow (`only`: among these ids; `asynchronous=False`: no async def
        workflows, for want of an event loop)."""
        config = self.config
        claimed: list[Claimed] = []
        defs = [d for d in self.registry.workflows() if asynchronous or not d.is_async]
        with _keeping(claimed):
            for queue in self.queues():
                if len(claimed) >= limit:
                    break
                params = queue.dequeue_params(
                    schema=config.schema,
                    owner=config.executor_id,
                    lease_seconds=config.lease_seconds,
                    defs=defs,
                    limit=limit - len(claimed),
                    only=only,
                )
                params["incarnation"] = self.ownership.incarnation
                doubts, claimed_at = self.db.outage.doubts, time.monotonic()  # (Claimed.doubts)
                rows = self.db.dequeue(params)
                for row in rows:
                    row["doubts"], row["claimed_at"] = doubts, claimed_at
                self._load(rows, claimed)
        return claimed

    def queues(self) -> list[Queue]:
        """The queues whose entries this executor runs: those of its registry that its
        `queues=` names (every one when it names none)."""
        routed = self.config.queues
        queues: list[Queue] = self.registry.queues()
        if routed is None:
            return queues
        return [q for q in queues if q.name in routed]

    def check_queues(self) -> None:
        """ConfigurationError unless every queue `queues=` names is one of the registry's:
        a misspelt name would leave a worker idle, and that queue's entries waiting."""
        routed = self.config.queues or ()
        known = sorted(q.name for q in self.registry.queues())
        unknown = [name for name in routed if name not in known]
        if unknown:
            raise ConfigurationError(
                f"queues={list(routed)!r}: no queue named {', '.join(map(repr, unknown))} is "
                f"declared in this application (its queues: {', '.join(known) or 'none'}); "
                "name queues declared with durable.Queue(...), or give no queues= to run them all"
            )

    def one(self, workflow_id: str) -> Claimed | None:
        """Claim one runnable workflow and load its journal, or None if someone holds it."""
        rows = self._rows([workflow_id], 1)
        if not rows or rows[0]["status"] != WorkflowStatus.RUNNING:
            return None
        row = rows[0]
        records = [
            StepRecord.from_row(r)
            for r in self.db.fetch_all("load_journal", {"workflow_id": row["workflow_id"]})
        ]
        try:
            return self._claimed(row, records)
        except Exception as exc:
            self._fail_unstartable(row, exc)
            return None

    def insert_params(
        self, defn: WorkflowDef, workflow_id: str, inputs: str, parent: tuple[str, int] | None
    ) -> tuple[dict[str, Any], int, float]:
        """insert_workflow's parameters, and the doubts and time before it (see Claimed);
        each driver sends the statement its own way."""
        config = self.config
        if current_run.get() is None:
            # A process that lost its id starts nothing new under it. (A child of a run in
            # flight is left to that run's epoch fence: failing the call would fail the run.)
            self.ownership.check_id()
        params = self.inputs.row(defn, workflow_id, inputs, parent, config.durability)
        params["owner"] = config.executor_id
        params["lease_seconds"] = config.lease_seconds
        return params, self.db.outage.doubts, time.monotonic()

    @staticmethod
    def inserted(
        defn: WorkflowDef,
        params: dict[str, Any],
        row: dict[str, Any] | None,
        doubts: int,
        claimed_at: float,
    ) -> Claimed | None:
        """The claim insert_workflow's row makes (None: the id exists)."""
        if row is None:
            return None
        return Claimed(
            defn,
            params["workflow_id"],
            int(row["epoch"]),
            [],
            {},
            Journal(params["workflow_id"]),
            row["deadline_at"],
            None,
            params["budget_id"],
            True,
            params["trace_context"],
            doubts,
            claimed_at,
            params["parent_id"],
        )

    def _rows(
        self, workflow_ids: list[str] | None, limit: int, asynchronous: bool | None = None
    ) -> list[dict[str, Any]]:
        """Claim up to `limit` runnable workflows this registry has the code of (only the
        async def ones, or only the others, when `asynchronous` says so)."""
        config = self.config
        # Sleepers whose time has come become claimable here, by whoever claims next (on
        # Citus, a round over a few shards wakes theirs).
        every = workflow_ids is None
        if not every or time.monotonic() >= self._wake_after:
            self.db.wake_due(workflow_ids)
        doubts, claimed_at = self.db.outage.doubts, time.monotonic()  # before the claim
        defs = [
            d
            for d in self.registry.workflows()
            if asynchronous is None or d.is_async == asynchronous
        ]
        rows = self.db.claim_batch(
            {
                "workflow_ids": workflow_ids,
                "owner": config.executor_id,
                "incarnation": self.ownership.incarnation,
                "lease_seconds": config.lease_seconds,
                "max_attempts": config.max_recovery_attempts,
                "names": [d.name for d in defs],
                "versions": [d.version or "" for d in defs],
                "journal_version": labels.JOURNAL_VERSION,
                "limit": limit,
                # Entries of other queues are left to the workers that run those queues.
                "queues": None if config.queues is None else list(config.queues),
            },
        )
        for row in rows:
            row["doubts"], row["claimed_at"] = doubts, claimed_at
        if every:
            # A full batch: a backlog is being worked through (a recovery), its rounds a
            # few milliseconds apart; sleepers are woken once per _WAKE_EVERY meanwhile.
            self._wake_after = claimed_at + _WAKE_EVERY if len(rows) >= limit else 0.0
        return rows

    def _load(self, rows: list[dict[str, Any]], claimed: list[Claimed]) -> None:
        """Load the journals of claimed rows in one query and add their claims to
        `claimed` (a row that gave up, or cannot start, is said and left out)."""
        runnable = [row for row in rows if self._runnable(row)]
        if not runnable:
            return
        journals, broken = load_journals(self.db, [r["workflow_id"] for r in runnable])
        for row in runnable:
            try:
                if row["workflow_id"] in broken:
                    raise broken[row["workflow_id"]]
                claim = self._claimed(row, journals[row["workflow_id"]])
            except DatabaseUnavailableError:
                raise
            except Exception as exc:
                self._fail_unstartable(row, exc)
                continue
            claimed.append(claim)

    def _runnable(self, row: dict[str, Any]) -> bool:
        """Whether a claimed row is to run (not one given up after too many crashes); the
        claim is logged either way."""
        fields = {"workflow_id": row["workflow_id"], "workflow": row["name"]}
        if row["status"] != WorkflowStatus.RUNNING:
            logger.error(
                "workflow %s crashed its worker %d times; it is left as %s for an "
                "operator (`durable workflows resume` retries it)",
                row["workflow_id"],
                row.get("max_recovery_attempts") or self.config.max_recovery_attempts,
                row["status"],
                extra={"event": "gave_up", "status": row["status"], **fields},
            )
            return False
        attempts = int(row.get("recovery_attempts") or 0)
        # A crash's recovery, not a workflow that was waiting (a sleep, a message, a
        # queue slot) and is due: recovery_attempts counts every crash of its life.
        if row.get("lease_expired"):
            logger.info(
                "recovering workflow %s (its lease expired; attempt %d)",
                row["workflow_id"],
                attempts,
                extra={"event": "recover", "attempt": attempts, "epoch": row["epoch"], **fields},
            )
        else:
            logger.info(
                "claimed workflow %s",
                row["workflow_id"],
                extra={"event": "claim", "epoch": row["epoch"], **fields},
            )
        return True

    def _fail_unstartable(self, row: dict[str, Any], exc: Exception) -> None:
        """A claimed workflow that cannot even start (its stored inputs do not decode, its
        journal is corrupt): it ends ERROR with the reason, instead of failing every
        worker that claims it (a poison pill)."""
        workflow_id = row["workflow_id"]
        if isinstance(exc, UnknownInstanceError):
            # Its instance is missing here, not broken: this worker has not created it (or
            # not yet). The claim is not held, so its lease runs out and a worker that has
            # the instance takes it; should none come, its recovery attempts run out and it
            # waits as MAX_RECOVERY_ATTEMPTS_EXCEEDED for `durable workflows resume`.
            logger.warning(
                "workflow %s needs an instance this worker does not have, left for a worker "
                "that has it: %s",
                workflow_id,
                exc,
                extra={"event": "instance_missing", "workflow_id": workflow_id},
            )
            return
        logger.error("workflow %s cannot be started, marking it ERROR: %s", workflow_id, exc)
        error = SerializationError(
            f"workflow {workflow_id!r} cannot be started: its stored inputs (or journal) "
            f"cannot be decoded: {exc}",
            what="the stored inputs",
            type_name=type(exc).__qualname__,
        )
        try:
            self.db.execute(
                "finish_workflow",
                {
                    "workflow_id": workflow_id,
                    "epoch": int(row["epoch"]),
                    "status": WorkflowStatus.ERROR.value,
                    "output": None,
                    "error": encode_error(error),
                },
            )
        except DatabaseUnavailableError:
            raise
        except Exception:
            logger.exception("could not mark workflow %s as failed", workflow_id)

    def _claimed(self, row: dict[str, Any], records: list[StepRecord] | Journal) -> Claimed:
        defn = self.registry.get_workflow(row["name"], row["version"])
        if defn is None:
            raise UnknownWorkflowError(row["name"], row["version"])
        args, kwargs = self.inputs.decode(row["inputs"], defn, self.registry)
        return Claimed(
            defn,
            row["workflow_id"],
            int(row["epoch"]),
            args,
            kwargs,
            records
            if isinstance(records, Journal)
            else Journal.from_records(row["workflow_id"], records),
            row["deadline_at"],
            row["cancel_reason"],
            row["budget_id"],
            trace_context=row.get("trace_context"),
            doubts=row.get("doubts", -1),
            claimed_at=row.get("claimed_at", 0.0),
            parent_id=row.get("parent_id"),
            pause_requested=bool(row.get("pause_requested", False)),
        )
