"""The worker loop, the keeper and the heartbeat: recover interrupted workflows, run
runnable ones, renew leases.

Recovery is a claim like any other: a workflow whose owner stopped renewing its lease (the
process died, or is paused, or lost its network) is claimed with FOR UPDATE SKIP LOCKED,
which bumps its epoch so the old owner's writes are refused, and it is re-invoked with its
saved inputs. Journaled steps replay; the first unjournaled one runs for real. Workers
find work by LISTEN/NOTIFY and fall back to polling, so a lost notification only delays.

The loops ask the claims for work and hand what they get to a launcher: they are given
these (WorkerParts) by the engine, and know nothing else of it, so the claiming, the
launching and the loop can each change alone. The keeper is the loop of an engine that is
not a worker: it claims only the workflows that engine started.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from durable._base.names import workflow_label
from durable._core import SWEEP_SLACK
from durable._io.systemdb import node_down
from durable.errors import DatabaseUnavailableError, EngineNotRunningError

if TYPE_CHECKING:
    from durable._base.registry import Registry
    from durable._host.claims import Claims, Slots
    from durable._io.config import Config
    from durable._io.listen import Subscription
    from durable._io.local import Claimed
    from durable._io.ownership import Ownership
    from durable._io.retention import RetentionPolicy
    from durable._io.systemdb import SystemDB


@dataclass(frozen=True)
class WorkerParts:
    """What the worker loop uses, made by the engine that runs it: where claims come from
    and where they go, what is running, how it is woken, and the chores it does between
    claims. The loop knows nothing else of the engine (not its runner, nor its client)."""

    config: Config
    registry: Registry
    db: SystemDB
    ownership: Ownership
    claims: Claims
    # Runs a claim (on a thread, or an event loop for an async def workflow).
    launch: Callable[[Claimed], object]
    slots: Slots
    # What ended the event loop of async workflows, if it died (none run here then).
    loop_failure: Callable[[], BaseException | None]
    # A subscription to the work channel that calls its argument on each notification.
    subscribe: Callable[[Callable[[], None]], Subscription]
    # Wakes the other workers (released workflows are theirs to claim).
    notify: Callable[[str], None]
    # Done once per poll interval: expire approvals, fire due schedules.
    chores: Sequence[Callable[[], object]]
    prune: Callable[[RetentionPolicy], object]
    # Runnable workflows no live executor has the code of (given how recent a beat is).
    waiting_for_worker: Callable[[float], list[dict[str, Any]]]
    # Moves an application database's outbox into this one (outbox_url=), or None.
    drain_outbox: Callable[[], object] | None = None

    def async_room(self) -> int:
        """How many more async workflows may run here (none once their loop died)."""
        if self.loop_failure() is not None:
            return 0
        return self.config.max_async - self.slots.tasks_running()


T = TypeVar("T")

logger = logging.getLogger("durable.worker")

_BACKOFF_MAX = 10.0
# Executor rows of workers whose heartbeat stopped this long ago (and 10 leases) are removed.
_EXECUTOR_STALE_MIN = 600.0
_EXECUTOR_PRUNE_INTERVAL = 60.0
# On Citus the housekeeping sweeps (approvals and stuck steps expired, schedules fired, the
# dead's claims taken back) each read or write every shard: at most this often there,
# rather than every poll interval (a short poll then costs claims, which read a few shards,
# not sweeps of every shard).
_CITUS_HOUSEKEEPING = 1.0
# How often an engine that is not a worker looks for its own waiting workflows (keep).
_KEEP_MIN = 0.05
_KEEP_MAX = 1.0
_KEEP_IDLE = 0.25
_KEEP_GONE = 30.0


class Worker:
    """Claims and runs workflows for one engine until stopped."""

    def __init__(self, parts: WorkerParts, *, poll_interval: float, grace_seconds: float) -> None:
        self.parts = parts
        self.poll_interval = poll_interval
        self.grace_seconds = grace_seconds
        self._wake = threading.Event()
        # A notification came on the work channel (not a run's end): claim at once.
        self._notified = False
        self._warned: set[str] = set()
        self._next_prune = 0.0

    def run(self, stop: threading.Event) -> None:
        # Notifications on the work channel set the wake event, through the engine's one
        # LISTEN connection (shared with its stream readers and watchers). Without one (off,
        # lost, refused) every wake-up is a poll; when it comes back the listener wakes us,
        # since work submitted meanwhile notified nobody.
        subscription = self.parts.subscribe(self._on_notification)
        try:
            self._run(stop)
        finally:
            subscription.close()

    def _on_notification(self) -> None:
        self._notified = True
        self._wake.set()

    def _run(self, stop: threading.Event) -> None:
        parts = self.parts
        config, db, ownership, slots = parts.config, parts.db, parts.ownership, parts.slots
        logger.info(
            "worker %s started: %d slots, lease %.1f s",
            config.executor_id,
            config.max_workers,
            config.lease_seconds,
        )
        backoff = 0.0
        outage_logged = False
        next_executor_prune = 0.0
        next_housekeeping = 0.0
        # When the next claim round is due. While a queue's backlog drains, every run that
        # ends wakes this loop to dequeue the next entry; a claim round then (its wake_due
        # and claim_batch statements, and their Python) almost always finds nothing: it
        # runs once per poll interval, at once on a notification, and again at once after
        # a round that claimed (there may be more), as when the loop polls.
        next_round = 0.0
        more = True
        while not self._stopping(stop):
            try:
                # While a Citus worker node hangs, what would wait for it is not sent: the
                # statements over every shard, and the release of runs it cut off (their
                # leases run out).
                hung = db.nodes_hung()
                if not hung and ownership.release_interrupted(db):
                    raise DatabaseUnavailableError("interrupted workflows still held")
                if time.monotonic() >= next_housekeeping and not hung:
                    # Once per poll interval, not once per claim round: while a backlog is
                    # being worked through (a recovery), rounds come every few
                    # milliseconds and these statements were a third of the loop's time.
                    every = max(self.poll_interval, _CITUS_HOUSEKEEPING if db.distributed else 0)
                    next_housekeeping = time.monotonic() + every
                    # Each reads or writes every Citus node: while one is down they wait
                    # for it, and the claims below go on.
                    for chore in parts.chores:
                        _unless_node_down(chore)
                    _unless_node_down(self._apply_retention)
                    # A process of this host that died: its claims are recovered now.
                    _unless_node_down(ownership.take_back_from_the_dead, db)
                    # A long step that stopped heartbeating (its process frozen or cut off):
                    # its workflow is claimed below, before its lease would run out.
                    _unless_node_down(self._expire_stuck_steps)
                if time.monotonic() >= next_executor_prune and not hung:
                    next_executor_prune = time.monotonic() + _EXECUTOR_PRUNE_INTERVAL
                    stale = max(_EXECUTOR_STALE_MIN, 10 * config.lease_seconds)
                    prune = {"stale_seconds": stale}
                    _unless_node_down(db.execute, "prune_executors", prune)
                    _unless_node_down(self._warn_orphans)
                # Keep one batch queued behind the running ones so threads never idle
                # waiting for the next claim; queued claims are covered by the heartbeat.
                # Async workflows are claimed against their own limit (max_async).
                free = 2 * config.max_workers - slots.threads_running()
                claimed: list[Claimed] = []
                if more or self._notified or time.monotonic() >= next_round:
                    self._notified = False
                    next_round = time.monotonic() + self.poll_interval
                    claimed = parts.claims.round(None, max(0, free), parts.async_room())
                    more = bool(claimed)
                    self._launch(claimed)
                # Queue entries hold their queue's slot from the moment they are dequeued,
                # so take only what can start now, never a backlog.
                room = config.max_workers - slots.threads_running()
                backlog = False
                if room > 0:
                    # A queue's limits count its entries on every node: while a Citus node
                    # is down or hangs, queues with limits wait for it (claims of other
                    # work, and queues without limits, go on: see SystemDB.dequeue).
                    asynchronous = parts.loop_failure() is None
                    dequeued = (
                        _unless_node_down(parts.claims.dequeue, room, None, asynchronous) or []
                    )
                    # Every slot it was allowed was taken: entries are likely still
                    # waiting, so the next freed slot dequeues at once, not at the next poll.
                    backlog = len(dequeued) >= room
                    claimed += self._launch(dequeued)
                else:
                    backlog = bool(parts.claims.queues())
                if outage_logged:
                    logger.debug("database is back; worker resumed")
                outage_logged = False
                backoff = 0.0
            except DatabaseUnavailableError as exc:
                if not outage_logged:
                    # Said once by SystemDB.outage; here only how the loop copes.
                    logger.debug("database unavailable, retrying with backoff: %s", exc)
                    outage_logged = True
                backoff = min(_BACKOFF_MAX, max(0.2, backoff * 2))
                stop.wait(backoff)
                continue
            except Exception:
                # Nothing one workflow, schedule or policy does may stop the loop that
                # runs every other one: log it, back off, go on.
                logger.exception("worker round failed; retrying")
                backoff = min(_BACKOFF_MAX, max(0.2, backoff * 2))
                stop.wait(backoff)
                continue
            if claimed and slots.threads_running() >= 2 * config.max_workers:
                # Full: wait until the queued batch has gone into the threads (no more
                # running than there are threads), then claim a whole batch again. Claiming
                # each time one slot frees made batches of one or two workflows, each
                # costing a claim, a journal read and a wake-up check.
                while not self._stopping(stop) and slots.threads_running() > config.max_workers:
                    slots.wait_for_room(config.max_workers, self.poll_interval)
                continue
            if claimed and not backlog:
                continue  # there may be more
            self._wake.clear()
            # With a backlog, a workflow that ends wakes this loop (to dequeue the next).
            slots.wake_on_free = self._wake if backlog else None
            self._wait(stop)
        if parts.loop_failure() is not None:
            stop.set()  # the worker stops: its LISTEN thread too
        self._drain()
        failure = parts.loop_failure()
        if failure is not None:
            # Its runs were given up when it died; a process that can no longer run async
            # workflows stops, so that its supervisor starts a whole one.
            raise EngineNotRunningError(
                f"worker {config.executor_id} stopped: the event loop of its async "
                f"workflows died ({type(failure).__qualname__}: {failure}); start the worker again "
                "(other workers recover the workflows it held)"
            )

    def _warn_orphans(self) -> None:
        """Say (once per workflow) when work waits for code no live worker has: a renamed
        function, a missing import, another version. The line names the version it waits
        for and the versions of that name this worker has, since a workflow left on an old
        version after a deploy is the usual case (`durable workflows resume ID --version V`
        moves it)."""
        parts = self.parts
        rows = parts.waiting_for_worker(parts.config.live_seconds)
        for row in rows:
            if row["workflow_id"] in self._warned:
                continue
            self._warned.add(row["workflow_id"])
            label = workflow_label(row["name"], row["version"])
            same = sorted(
                workflow_label(d.name, d.version)
                for d in parts.registry.workflows()
                if d.name == row["name"]
            )
            if same:
                has = ", ".join(same)
                hint = f" (to move it: durable workflows resume {row['workflow_id']} --version V)"
            else:
                names = ", ".join(parts.registry.workflow_names()) or "no workflows"
                has = f"no {row['name']} at all ({names})"
                hint = ""
            logger.warning(
                "workflow %s waits for a worker that has %s; this one has %s%s",
                row["workflow_id"],
                label,
                has,
                hint,
                extra={
                    "event": "orphan",
                    "workflow_id": row["workflow_id"],
                    "workflow": label,
                    "version": row["version"],
                    "worker_has": same,
                },
            )

    def _expire_stuck_steps(self) -> None:
        """Expire the leases of workflows whose long step went past its heartbeat_timeout
        without a heartbeat (see _core.heartbeats): claimed at once, epoch bumped."""
        stuck = self.parts.db.fetch_all("expire_stuck_steps", {"slack": SWEEP_SLACK})
        for row in stuck:
            logger.warning(
                "workflow %s: its running step stopped heartbeating; taking it over",
                row["workflow_id"],
            )

    def _apply_retention(self) -> None:
        """Prune when the engine's retention policy is due (once per its interval)."""
        policy = self.parts.config.retention
        if policy is None or time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + policy.interval_seconds
        self.parts.prune(policy)

    def _launch(self, claims: list[Claimed]) -> list[Claimed]:
        for claimed in claims:
            self.parts.launch(claimed)
        return claims

    def _stopping(self, stop: threading.Event) -> bool:
        """Asked to stop, another process took this worker's executor id over, or the
        event loop of its async workflows died."""
        parts = self.parts
        return stop.is_set() or parts.ownership.superseded or parts.loop_failure() is not None

    def _wait(self, stop: threading.Event) -> None:
        deadline = time.monotonic() + self.poll_interval
        while not self._stopping(stop) and time.monotonic() < deadline:
            if self._wake.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
                return

    def _drain(self) -> None:
        """Stop claiming; hand each running workflow over at its next step boundary; when
        the grace period ends, release the rest.

        A run hands its workflow over (released, and other workers woken) as soon as the
        step under way is recorded, before its next call starts: another worker resumes
        it at once and runs nothing of it again. Only a run whose step outlives the grace
        is released while the step is under way; that step may then run again.

        A worker whose executor id another process took over does neither: its leases are
        no longer renewed, so its runs must not go on, and what it could release is not
        its own (the process exits at once, see `durable worker`)."""
        parts = self.parts
        ownership, slots = parts.ownership, parts.slots
        if ownership.superseded:
            logger.info(
                "worker %s stopped: its executor id is held by another process",
                parts.config.executor_id,
            )
            return
        ownership.hand_over_all()
        deadline = time.monotonic() + self.grace_seconds

        def running() -> int:
            return slots.threads_running() + slots.tasks_running()

        while running() and time.monotonic() < deadline and not ownership.superseded:
            time.sleep(0.05)
        left = running()
        if left:
            logger.warning("%d workflows still running after the grace period", left)
        try:
            parts.db.on_held("release_owned", ownership.held_params(), "count")
            parts.notify("released")
        except DatabaseUnavailableError:
            logger.warning("could not release workflows; their leases will expire")
        logger.info("worker %s stopped", parts.config.executor_id)


def keep(
    parts: WorkerParts,
    own: Callable[[], list[str]],
    forget: Callable[[list[str]], None],
    stop: threading.Event,
) -> None:
    """An engine that is not a worker still finishes what it started: the workflows it
    started or enqueued (`own()`) that wait (a sleep, a message, an approval, a queue slot)
    are claimed again here once they can go on, and forgotten once finished. Polls only
    while there are such workflows, backing off to one second."""
    config, claims = parts.config, parts.claims
    delay = _KEEP_MIN
    # Since when each watched workflow has not been there. A workflow is remembered just
    # before its row is written, so one not there yet is being started: it is let go
    # only once it has stayed away for _KEEP_GONE (a finished one that was pruned).
    missing: dict[str, float] = {}
    while not stop.wait(delay):
        watched = own()
        if not watched:
            delay = _KEEP_IDLE
            missing.clear()
            continue
        try:
            if parts.drain_outbox is not None:
                # What it started in another database's transaction reaches this one.
                parts.drain_outbox()
            free = config.max_workers - parts.slots.threads_running()
            started = claims.round(watched, free, parts.async_room())
            for claimed in started:
                parts.launch(claimed)
            if parts.claims.queues() and free > len(started):
                asynchronous = parts.loop_failure() is None
                dequeued = claims.dequeue(free - len(started), watched, asynchronous=asynchronous)
                for claimed in dequeued:
                    parts.launch(claimed)
                started += dequeued
            rows = parts.db.fetch_all("finished_among", {"workflow_ids": watched})
            now = time.monotonic()
            seen = {r["workflow_id"] for r in rows if r["gone"]}
            missing = {w: missing.get(w, now) for w in seen}
            finished = [r["workflow_id"] for r in rows if not r["gone"]]
            finished += [w for w, since in missing.items() if now - since >= _KEEP_GONE]
            forget(finished)
        except Exception:  # an outage or a bad row: try again later, never stop
            logger.debug(
                "engine %s: could not resume its workflows", config.executor_id, exc_info=True
            )
            started = []
        delay = _KEEP_MIN if started else min(_KEEP_MAX, delay * 2)


def _unless_node_down(work: Callable[..., T], *args: Any) -> T | None:
    """`work(*args)`, or None when a Citus worker node it needs is down (it is tried again next
    round); any other error is raised."""
    try:
        return work(*args)
    except DatabaseUnavailableError as exc:
        if not node_down(exc):
            raise
        logger.debug("waiting for a Citus worker node: %s", exc)
        return None


class Heartbeat:
    """Renews this executor's leases and reads cancel (and pause) requests for its runs, on a
    thread.

    Leases are renewed every third of their length; cancel requests are read more often
    (`cancel_poll_interval`) and handed to the runner as one dict, so a run sees a cancel
    at its next step with a dict lookup, not a query."""

    def __init__(
        self,
        config: Config,
        ownership: Ownership,
        db: Callable[[], SystemDB],
        running: Callable[[], bool],
        set_cancel_requests: Callable[[dict[str, tuple[int, str]]], None],
    ) -> None:
        self.config = config
        self.ownership = ownership
        self._db = db
        self._running = running
        self._set_cancel_requests = set_cancel_requests
        # Read at each turn: a test may slow it down to widen a race.
        self.cancel_poll_interval = config.cancel_poll_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="durable-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        ownership, lease_seconds = self.ownership, self.config.lease_seconds
        interval = lease_seconds / 3
        failing = False
        next_renewal = time.monotonic() + interval
        while not self._stop.wait(self.cancel_poll_interval):
            if not self._running():
                return
            db = self._db()
            try:
                holding = ownership.held_epochs()
                rows = (
                    db.on_held("owned_cancel_requests", ownership.held_params(holding))[0]
                    if holding
                    else []
                )
                self._set_cancel_requests(
                    {
                        r["workflow_id"]: (int(r["epoch"]), r["cancel_reason"])
                        for r in rows
                        if r["cancel_reason"] is not None
                    }
                )
                ownership.replace_pause_requests(
                    {r["workflow_id"]: int(r["epoch"]) for r in rows if r["pause_requested"]}
                )
                if time.monotonic() < next_renewal:
                    continue
                next_renewal = time.monotonic() + interval
                held = ownership.held_epochs()
                sent = time.monotonic()
                # On Citus with a worker node down, the leases on the other nodes are
                # renewed (on_held), not those on the node that is down: their runs are
                # stuck on it, and may have lost their claims when it is back.
                reached = True
                if held:
                    reached = db.on_held("renew_leases", ownership.held_params(held), "count")[1]
                try:
                    # The executor row is written on every node: not while one hangs.
                    if not db.nodes_hung() and not ownership.beat(db):
                        return  # another process holds the id: renew nothing more (lose_id)
                except DatabaseUnavailableError as exc:
                    # The executor row is a reference table, written on every node: refused
                    # while one is down. The leases were renewed under the incarnation's
                    # fence all the same, which is what the runs rely on.
                    if not node_down(exc):
                        raise
                if not reached:
                    raise DatabaseUnavailableError("a Citus worker node is down")
                db.outage.renewed(sent, lease_seconds)
                if failing:
                    logger.info("heartbeat restored")
                failing = False
            except DatabaseUnavailableError:
                failing = True  # the outage is said once, by SystemDB.outage
            except Exception:
                if not failing:
                    logger.warning("heartbeat failed; retrying", exc_info=True)
                failing = True
