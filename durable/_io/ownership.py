"""What this process owns, and whether it still does: its executor id and the incarnation of
it, and the claims it holds (each workflow at the epoch of its claim) with the cancel
requests for them and those an outage cut off.

Ownership is what every fence in the journal checks: a write is refused unless the
workflow's row names this epoch, and a statement under the executor id acts only while
the id's row names this incarnation. Before, its parts were spread over the Engine (the
id, the incarnation, being superseded), the Runner (held claims, interrupted ones, cancel
requests) and the heartbeat; here they are one object, used by the runner that claims and
lets go, the heartbeat that renews and reads cancel requests, and the engine that
registers the id and gives it up.

Not here yet: whether a held claim may have lapsed (a gap in the heartbeat's renewals, an
outage that ended) is counted by `SystemDB.outage` (its `doubts`), and a run proves its
claim again before its code runs (`_core.reclaim`), because both drivers and the core
read it there.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from durable._io import machine
from durable._io.systemdb import node_down
from durable.errors import DatabaseUnavailableError, ExecutorIdInUseError, ExecutorIdTakenError

if TYPE_CHECKING:
    from durable._io.systemdb import SystemDB

logger = logging.getLogger("durable.engine")


class Ownership:
    """One engine's executor identity and the claims it holds (see the module docstring).
    Thread-safe: the runner's threads, the heartbeat and the worker loop share it."""

    def __init__(
        self,
        executor_id: str,
        *,
        explicit: bool,
        lease_seconds: float,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self.executor_id = executor_id
        # Given explicitly (e.g. `durable worker --executor-id`), the id is this process's
        # stable identity: a restart takes back its interrupted workflows at once. A random
        # id is never reused, so nothing can be taken from a live process by mistake.
        self.explicit = explicit
        self.lease_seconds = lease_seconds
        # This process's incarnation of its executor id, drawn at each launch and written
        # in the executor row: statements under the id act only while the row names it.
        self.incarnation = ""
        self.registration: dict[str, Any] = {}
        self._on_lost = on_lost
        self._superseded = threading.Event()
        # Set when this process's worker stops: each run hands its workflow over at its
        # next step boundary (see `_core.check_interrupt`).
        self._handing_over = threading.Event()
        self._holder: str | None = None  # who holds the id then, as "pid N on HOST"
        self._lock = threading.Lock()
        # workflow_id -> epoch of every claim this executor is running or has queued to
        # run. The heartbeat renews these leases and no others: a claim whose commit
        # reached the server but whose answer never came back (the connection died), or
        # whose journal could not be loaded, is owned in the table yet run by nobody, and
        # must expire so that a worker recovers it.
        self._held: dict[str, int] = {}
        # Claims whose run an outage cut off: handed back (released) once it is over.
        self._interrupted: set[tuple[str, int]] = set()
        # workflow_id -> (epoch, reason), for the held runs that were asked to stop;
        # replaced whole by the heartbeat, read (one dict lookup) at each new step. The
        # epoch keeps a request from outliving the run it was made to.
        self._cancel_requests: dict[str, tuple[int, str]] = {}
        # workflow_id -> epoch, for the held runs an operator asked to pause: replaced
        # whole by the heartbeat too, read at each new step (see pause_requested).
        self._pause_requests: dict[str, int] = {}

    # -- the executor id -----------------------------------------------------------------------

    def register(self, capabilities: Iterable[tuple[str, str | None]]) -> dict[str, Any]:
        """A new incarnation of the id, and the executor row that claims it (to write with
        upsert_executor): from then on a process that held the id before touches nothing
        under it."""
        self.incarnation = uuid.uuid4().hex
        self._superseded.clear()
        self._handing_over.clear()
        hostname, pid = machine.identity()
        self.registration = {
            "executor_id": self.executor_id,
            "hostname": hostname,
            "pid": pid,
            "capabilities": json.dumps([[n, v] for n, v in capabilities]),
            "incarnation": self.incarnation,
            "host_key": machine.host_key(),
            "pid_start": machine.start_tick(pid),
        }
        return self.registration

    def take_up(self, db: SystemDB, capabilities: Iterable[tuple[str, str | None]]) -> None:
        """At launch: hold the id (refused while a live process holds it), register the
        executor with the workflows it can run, and take back the claims of the processes
        that held it before or died on this host."""
        holder_dead = self.refuse_a_live_twin(db) if self.explicit else True
        # From here on this incarnation holds the id; a process that held it before (paused
        # past its lease, and perhaps resumed) touches nothing under it.
        db.execute("upsert_executor", self.register(capabilities))
        if self.explicit:
            # The same identity as a process that crashed: its runs are ours to retake.
            params = {
                "owner": self.executor_id,
                "incarnation": self.incarnation,
                "dead": holder_dead,
            }
            taken = db.execute("abandon_owned", params)
            db.counters.takeovers += taken
            if taken:
                logger.info(
                    "executor %s restarted: taking back %d interrupted workflows",
                    self.executor_id,
                    taken,
                    extra={"event": "takeover", "executor_id": self.executor_id},
                )
        # A process of this host that died (this script, killed and run again) left claims
        # behind: they are taken at once, not after their leases.
        self.take_back_from_the_dead(db)

    def give_up(self, db: SystemDB, held: Mapping[str, int] | None) -> None:
        """At shutdown: release the claims `held` (None: none, as after an abrupt stop) and
        remove the executor row; a row left under another incarnation means the id was
        taken over meanwhile (lose_id)."""
        if held is not None:
            # Anything still owned here was interrupted: hand it back at once instead of
            # making another worker wait for the lease to expire.
            db.on_held("release_owned", self.held_params(held), "count")
        gone = db.execute("delete_executor", self.identity_params())
        if not gone and not self.superseded:
            row = db.fetch_one("get_executor", {"executor_id": self.executor_id})
            if row is not None:  # not ours, so another incarnation's
                self.lose_id(row)

    def refuse_a_live_twin(self, db: SystemDB) -> bool:
        """An explicit executor id still beating for another process is in use: taking its
        runs would run their steps twice. Refuse (ExecutorIdInUseError) before anything is
        touched. Otherwise say whether the process that held the id is known to be gone
        (then all it owned is ours to take back at once; else only what it let expire).

        Its pid is asked about only from its own host key (the same kernel and pid
        namespace, see durable/_io/machine.py): there a pid that is gone, or that names a process
        started at another tick (this very process's, in a container restarted as pid 1),
        is a dead predecessor, and a live pid a twin. A row of another host key (another
        container, even with the same hostname; or this container restarted in a new pid
        namespace) is judged by its heartbeat alone: this process watches it for up to a
        lease, and is refused as soon as it beats again, or takes the id once it is a lease
        old, rather than failing at once and being restarted until then."""
        row = db.fetch_one("get_executor", {"executor_id": self.executor_id})
        if row is None:
            return True
        key = machine.host_key()
        pid, start = int(row["pid"]), row["pid_start"]
        here = bool(key) and row["host_key"] == key
        if here and machine.gone(pid, start):
            return True  # it crashed (a kill -9, an OOM kill): its runs are ours to take back
        first = row
        deadline = time.monotonic() + self.lease_seconds + 1.0
        while True:
            age = float(row["heartbeat_age"])
            if age > self.lease_seconds:
                # It stopped beating a lease ago: paused, cut off or gone. If it comes back,
                # it finds its id taken and stops (the executor row names this incarnation).
                return False
            beat = (row["incarnation"], row["heartbeat_at"]) != (
                first["incarnation"],
                first["heartbeat_at"],
            )
            if here or beat or time.monotonic() > deadline:
                # A live process (this one included) beats under this id: a twin.
                holder = f"pid {row['pid']} on {row['hostname']}"
                raise ExecutorIdInUseError(self.executor_id, holder, age)
            if row is first:
                logger.warning(
                    "executor id %s was held by pid %s on %s, of another pid namespace, "
                    "whose heartbeat is %.1f s old: waiting for it to beat again (then this "
                    "process is refused) or to be a lease old (then it takes the id over)",
                    self.executor_id,
                    row["pid"],
                    row["hostname"],
                    age,
                    extra={"event": "twin_check", "executor_id": self.executor_id},
                )
            time.sleep(min(0.5, self.lease_seconds / 10))
            row = db.fetch_one("get_executor", {"executor_id": self.executor_id}) or {}
            if not row:
                return True  # its row was deleted: it shut down

    def take_back_from_the_dead(self, db: SystemDB) -> int:
        """The claims of other executors of this host whose process is gone (a crash: a
        `kill -9`, an OOM kill) are handed back now, to be recovered at once rather than
        after their leases; returns how many. Only rows of this very host key are judged
        (see durable/_io/machine.py), and each only while its row names the incarnation found
        dead."""
        key = self.registration.get("host_key") or ""
        if not key:
            return 0
        rows = db.fetch_all("executors_on_host", {"host_key": key, "executor_id": self.executor_id})
        taken = 0
        for row in rows:
            start = row["pid_start"]
            if not machine.gone(int(row["pid"]), None if start is None else int(start)):
                continue
            dead = {"owner": row["executor_id"], "incarnation": row["incarnation"]}
            count = db.execute("abandon_dead_executor", dead)
            db.execute("forget_dead_executor", dead)
            db.counters.takeovers += count
            if count:
                logger.info(
                    "executor %s (pid %s on this host) is gone: taking back its %d "
                    "interrupted workflows now",
                    row["executor_id"],
                    row["pid"],
                    count,
                    extra={"event": "takeover", "executor_id": row["executor_id"]},
                )
            taken += count
        return taken

    def identity_params(self) -> dict[str, Any]:
        return {"executor_id": self.executor_id, "incarnation": self.incarnation}

    def held_params(self, held: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The parameters of a statement on the claims `held` (default: all held now),
        fenced by this process's incarnation of its executor id."""
        claims = self.held_epochs() if held is None else held
        return {
            "owner": self.executor_id,
            "incarnation": self.incarnation,
            "held": list(claims),
            "epochs": list(claims.values()),
            "lease_seconds": self.lease_seconds,
        }

    @property
    def superseded(self) -> bool:
        """Another process took the id over (this one was paused or cut off past its
        lease): it claims, renews and releases nothing any more."""
        return self._superseded.is_set()

    def beat(self, db: SystemDB) -> bool:
        """Refresh the executor row; False (and the id is given up) if another process
        holds the id now."""
        if db.fetch_one("heartbeat_executor", self.registration) is not None:
            return True
        self.lose_id(db.fetch_one("get_executor", {"executor_id": self.executor_id}))
        return False

    def lose_id(self, holder: Mapping[str, Any] | None) -> None:
        """Another process holds the id: stop claiming, say so once.

        The statements under the id are fenced by the incarnation, so this process already
        touches nothing of the new holder's; stopping is what keeps its own runs from going
        on past leases it can no longer renew. `durable worker` then exits with an error."""
        if self._superseded.is_set():
            return
        if holder is not None:
            self._holder = f"pid {holder['pid']} on {holder['hostname']}"
        self._superseded.set()
        self._on_lost()
        error = ExecutorIdTakenError(self.executor_id, self._holder)
        logger.error(
            "%s",
            error,
            extra={"event": "superseded", "executor_id": self.executor_id},
        )

    def hand_over_all(self) -> None:
        """This worker is stopping: every run it holds gives its workflow back at its next
        step boundary, once the step under way is recorded, rather than when the grace
        period ends (when a step still under way would finish after another worker had
        started it again)."""
        self._handing_over.set()

    def handing_over(self) -> bool:
        return self._handing_over.is_set()

    def check_id(self) -> None:
        """Raise ExecutorIdTakenError once another process holds the id."""
        if self._superseded.is_set():
            raise ExecutorIdTakenError(self.executor_id, self._holder)

    # -- claims --------------------------------------------------------------------------------

    def hold(self, workflow_id: str, epoch: int) -> None:
        with self._lock:
            self._held[workflow_id] = epoch

    def let_go(self, workflow_id: str, epoch: int) -> None:
        with self._lock:
            if self._held.get(workflow_id) == epoch:
                del self._held[workflow_id]

    def held_epochs(self) -> dict[str, int]:
        """The claims held: workflow id -> the epoch of its claim."""
        with self._lock:
            return dict(self._held)

    @property
    def cancel_requests(self) -> dict[str, tuple[int, str]]:
        return self._cancel_requests

    def replace_cancel_requests(self, requests: dict[str, tuple[int, str]]) -> list[str]:
        """Replace the requests whole; the workflows asked anew since the last time."""
        new = [wid for wid, asked in requests.items() if self._cancel_requests.get(wid) != asked]
        self._cancel_requests = requests
        return new

    def cancel_request(self, workflow_id: str, epoch: int) -> str | None:
        """Why the run of `workflow_id` at `epoch` was asked to stop, if it was."""
        request = self._cancel_requests.get(workflow_id)
        if request is None or request[0] != epoch:
            return None
        return request[1]

    def replace_pause_requests(self, requests: dict[str, int]) -> None:
        """Replace the pause requests whole (the heartbeat's poll)."""
        self._pause_requests = requests

    def ask_pause(self, workflow_id: str, epoch: int, paused: bool) -> None:
        """A pause asked (or, `paused` false, withdrawn) through this process's client:
        its run sees it at its next step, not at the next poll."""
        requests = dict(self._pause_requests)
        if paused:
            requests[workflow_id] = epoch
        else:
            requests.pop(workflow_id, None)
        self._pause_requests = requests

    def pause_requested(self, workflow_id: str, epoch: int) -> bool:
        """Whether the run of `workflow_id` at `epoch` was asked to pause."""
        return self._pause_requests.get(workflow_id) == epoch

    def interrupted(self, workflow_id: str, epoch: int) -> None:
        """An outage cut this claim's run off: hand it back once the database is back."""
        with self._lock:
            self._interrupted.add((workflow_id, epoch))

    def release_interrupted(self, db: SystemDB) -> int:
        """Hand back the claims whose run an outage cut off; returns how many are still
        waiting (the database may still be down). Those whose Citus worker node is down
        are kept for later but not counted: they say nothing of the other nodes, whose
        work goes on meanwhile."""
        with self._lock:
            pending = list(self._interrupted)
        on_nodes_down = 0
        for workflow_id, epoch in pending:
            try:
                db.execute("release_workflow", {"workflow_id": workflow_id, "epoch": epoch})
            except DatabaseUnavailableError as exc:
                if not node_down(exc):
                    break
                on_nodes_down += 1
                continue
            with self._lock:
                self._interrupted.discard((workflow_id, epoch))
        with self._lock:
            return len(self._interrupted) - on_nodes_down


def say_who_holds(db: SystemDB, workflow_id: str, lease_seconds: float) -> None:
    """A start of an id another executor holds waits for it (it is resumed here once
    its lease runs out, if nobody finishes it first): say what it waits for, and until
    when, instead of waiting in silence. A warning when the holder has stopped
    beating (a crashed process elsewhere), else a note."""
    try:
        row = db.fetch_one("holder_of", {"workflow_id": workflow_id})
    except Exception:  # only a message: never fail a start over it
        logger.debug("could not read who holds %s", workflow_id, exc_info=True)
        return
    if row is None or row["owner"] is None or row["lease_left"] is None:
        return  # not running (suspended, queued) or no lease: nothing is held
    left = max(0.0, float(row["lease_left"]))
    until = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=left)).strftime("%H:%M:%S")
    age = row["heartbeat_age"]
    if row["hostname"] is None or age is None:
        where, stale = "whose process is no longer registered", True
    else:
        stale = float(age) > 2 * lease_seconds / 3 + 2  # beats: lease / 3
        where = f"pid {row['pid']} on {row['hostname']}, heartbeat {float(age):.0f} s ago"
    logger.log(
        logging.WARNING if stale else logging.INFO,
        "workflow %s is held by executor %s (%s): waiting for its lease to run out at "
        "%s UTC (in %.0f s) to resume it here, unless that executor finishes it first",
        workflow_id,
        row["owner"],
        where,
        until,
        left,
        extra={"event": "held", "workflow_id": workflow_id, "owner": row["owner"]},
    )
