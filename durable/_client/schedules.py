"""Cron schedules: each tick starts one workflow, exactly once, however many workers run.

A schedule is a row in `{schema}.schedules`. Every worker round fires the schedules whose
workflow this worker has: under the schedule's row lock (FOR UPDATE SKIP LOCKED, so
workers never wait for each other) it lists the ticks due since `last_tick`, inserts one
workflow per tick with the id `schedule:<name>:<tick in UTC>` (`_labels.schedule_tick_id`;
the primary key makes a second insert of the same tick a no-op), and moves `last_tick`
on. The cron names wall times of the schedule's timezone; each fires at one instant
(`tick_instant`), the key of its workflow, so a daylight-saving change neither repeats
nor drops a tick. After downtime, the missed-tick policy decides: `catch_up=0` runs only
the latest due tick and skips the others; `catch_up=N` also runs up to N missed ticks
before it. Time comes from the engine's clock, so a month of ticks can be tested in
seconds.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from croniter import croniter

from durable._base import labels
from durable._base.names import check_name
from durable._base.registry import Registry, default_registry
from durable._client import audit
from durable._client.starts import start_placed
from durable._run.context import workflow_code_run
from durable._run.decorators import workflow_def
from durable.errors import (
    DatabaseUnavailableError,
    InvalidScheduleError,
    UnknownScheduleError,
    UnknownWorkflowError,
)

if TYPE_CHECKING:
    from durable._base.clock import Clock
    from durable._base.registry import WorkflowDef
    from durable._client.inputs import Inputs
    from durable._io.systemdb import SystemDB, Tx

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("durable.schedules")


class Starter(Protocol):
    """What firing schedules needs of the client (or engine) that fires them."""

    @property
    def db(self) -> SystemDB: ...

    clock: Clock

    inputs: Inputs

    def notify_work(self, payload: str = "") -> None: ...


class Operator(Starter, Protocol):
    """What running a schedule by hand (backfill, trigger) needs: a client that knows who
    acts, for the audit log."""

    actor: str | None


@dataclass(frozen=True)
class Schedule:
    """A validated cron schedule of one workflow."""

    name: str
    workflow_name: str
    workflow_version: str | None
    cron: str
    timezone: str
    catch_up: int

    @staticmethod
    def build(
        name: str,
        workflow_name: str,
        workflow_version: str | None,
        cron: str,
        timezone: str,
        catch_up: int,
    ) -> Schedule:
        """Validate everything before anything is stored."""
        if not isinstance(cron, str) or not croniter.is_valid(cron):
            raise InvalidScheduleError(
                f"cron={cron!r} is not a valid cron expression: use five fields "
                "'minute hour day month weekday' (e.g. '*/5 * * * *'), or six with seconds "
                "last (e.g. '* * * * * */10')"
            )
        try:
            zoneinfo.ZoneInfo(timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
            raise InvalidScheduleError(
                f"timezone={timezone!r} is not a known IANA timezone: use a name such as "
                "'UTC' or 'Europe/Berlin' (zoneinfo.available_timezones() lists them)"
            ) from None
        if not isinstance(catch_up, int) or isinstance(catch_up, bool) or catch_up < 0:
            raise InvalidScheduleError(
                f"catch_up={catch_up!r}: give how many missed ticks to run after downtime "
                "(0 skips them)"
            )
        if not name:
            raise InvalidScheduleError("a schedule needs a non-empty name")
        check_name("schedule name", name)
        return Schedule(name, workflow_name, workflow_version, cron, timezone, catch_up)

    def row(self) -> dict[str, Any]:
        return {
            "schedule_name": self.name,
            "workflow_name": self.workflow_name,
            "workflow_version": self.workflow_version,
            "cron": self.cron,
            "timezone": self.timezone,
            "catch_up": self.catch_up,
        }


def scheduled(
    cron: str,
    *,
    timezone: str = "UTC",
    catch_up: int = 0,
    name: str | None = None,
    registry: Registry | None = None,
) -> Callable[[F], F]:
    """Run a workflow on a cron schedule; it is called with the tick (an aware datetime).

    Put it above @durable.workflow. Workers store the schedule when they start and fire
    each tick exactly once; `catch_up` is the missed-tick policy after downtime (0: skip
    missed ticks, N: run at most N of them). Bad cron or timezone raise
    InvalidScheduleError here, at import time.

    The cron is read on the wall clock of `timezone`, and each wall time it names fires
    once, at the first moment that clock reads it or later: when the clocks go back, a
    repeated time fires at its first occurrence only; when they jump forward, a time
    that does not exist fires when the jump lands (02:30 in Europe/Berlin on the night of
    02:00 -> 03:00 fires at 03:00 CEST). Catching up and backfilling follow the same rule.
    For ticks at fixed intervals of real time, use timezone="UTC".
    """

    def decorate(fn: F) -> F:
        defn = workflow_def(fn)
        schedule = Schedule.build(
            name or defn.name, defn.name, defn.version, cron, timezone, catch_up
        )
        (registry if registry is not None else default_registry).add_schedule(schedule)
        return fn

    return decorate


def tick_instant(wall: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """The instant a schedule's wall-clock time `wall` (naive, in `tz`) fires: the first
    moment the zone's clock reads `wall` or later. So a time that happens once fires then;
    one that happens twice (the clocks go back) fires at its first occurrence only; one
    that never happens (the clocks jump forward over it) fires when the jump lands (02:30
    in Berlin on the night of 02:00 -> 03:00 fires at 03:00). Later wall times never fire
    earlier: ticks keep their order. Returned in `tz`, fold set, as the zone's clock reads
    it then."""
    wall = wall.replace(tzinfo=None)
    # fold=0 is a repeated time's first occurrence; a time that exists reads back as itself.
    at = wall.replace(tzinfo=tz).astimezone(dt.UTC)
    if at.astimezone(tz).replace(tzinfo=None) == wall:
        return at.astimezone(tz)
    # A gap: read with the offset after the jump it is before the jump, with the offset
    # before it after the jump. The jump is the first moment between them reading >= wall.
    low = wall.replace(tzinfo=tz, fold=1).astimezone(dt.UTC)
    high = at
    step = dt.timedelta(microseconds=1)
    while high - low > step:
        middle = low + (high - low) // 2
        if middle.astimezone(tz).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle
    return high.astimezone(tz)


def _local(when: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """The zone's wall-clock reading at `when`, naive."""
    return when.astimezone(tz).replace(tzinfo=None)


def next_tick(cron: str, timezone: str, now: dt.datetime) -> dt.datetime:
    """The schedule's first tick after `now` (by `tick_instant`), in its timezone."""
    tz = zoneinfo.ZoneInfo(timezone)
    it = croniter(cron, _local(now, tz))
    while True:  # in a repeated hour's second pass, its wall times fired in the first
        tick = tick_instant(it.get_next(dt.datetime), tz)
        if tick.astimezone(dt.UTC) > now:
            return tick


def due_ticks(
    schedule: dict[str, Any], now: dt.datetime
) -> tuple[list[dt.datetime], dt.datetime | None]:
    """The ticks to run now, oldest first, and the new last_tick (None: nothing changes).

    The cron is read in the schedule's wall clock (croniter on naive times: its own
    handling of zones repeats or drops ticks at a DST change), and each wall time fires at
    its `tick_instant`. With no last_tick yet (a new schedule) nothing runs: the latest tick
    becomes the mark, so a schedule starts with the next tick rather than back-filling the
    past.
    """
    tz = zoneinfo.ZoneInfo(schedule["timezone"])
    last = schedule["last_tick"]
    here = now.astimezone(tz)
    # The latest wall time read so far: in the second pass of a repeated hour the clock
    # reads less than it did before it went back, and those later wall times are due.
    top = here.replace(tzinfo=None)
    first, second = here.replace(fold=0).utcoffset(), here.utcoffset()
    if here.fold and first is not None and second is not None:
        top += first - second
    # get_prev() is strictly before its start, so start one second on and drop the future.
    it = croniter(schedule["cron"], top + dt.timedelta(seconds=1))
    wanted = 1 + int(schedule["catch_up"])
    ticks: list[dt.datetime] = []
    while len(ticks) < wanted:
        tick = tick_instant(it.get_prev(dt.datetime), tz)
        at = tick.astimezone(dt.UTC)
        if at > now:
            continue
        if last is not None and at <= last:
            break
        if ticks and at == ticks[-1].astimezone(dt.UTC):
            continue  # wall times of one gap fire at one instant: one tick
        ticks.append(tick)
        if last is None:
            break
    if not ticks:
        return [], None
    ticks.reverse()
    if last is None:
        return [], ticks[-1]
    return ticks, ticks[-1]


def fire(
    client: Starter,
    registry: Registry,
    durability: str,
    failing: dict[str, str] | None = None,
) -> int:
    """Start the due ticks of every schedule `registry` can run; returns how many
    workflows were started. Safe to call from any number of workers at once: each
    schedule is fired under its row lock (SKIP LOCKED), and a tick's workflow id is
    derived from the tick, so a tick is never started twice."""
    defs = registry.workflows()
    names = [d.name for d in defs]
    versions = [d.version or "" for d in defs]
    candidates = client.db.fetch_all("due_schedules", {"names": names, "versions": versions})
    started = 0
    now = client.clock.now()
    for candidate in candidates:
        try:
            started += _fire_one(client, registry, durability, candidate, now)
        except DatabaseUnavailableError:
            raise
        except Exception as exc:
            # A schedule that cannot fire (its stored cron or timezone no longer parses,
            # say) is skipped; the others still fire. It is logged when its error first
            # appears (or changes), not on every round. `failing` is the caller's memory.
            name, why = candidate["schedule_name"], f"{type(exc).__name__}: {exc}"
            if failing is None or failing.get(name) != why:
                logger.error("schedule %s cannot fire: %s", name, why)
                if failing is not None:
                    failing[name] = why
    if started:
        client.notify_work("schedule")
    return started


def _fire_one(
    client: Starter,
    registry: Registry,
    durability: str,
    candidate: dict[str, Any],
    now: dt.datetime,
) -> int:
    """Fire one schedule's due ticks under its row lock; how many workflows started."""
    schedule_name = candidate["schedule_name"]

    def fire(tx: Tx) -> int:  # run again from the start after a conflict
        started = 0
        locked = tx.fetch_one("lock_schedule", {"schedule_name": schedule_name})
        if locked is None:
            return 0  # another worker is firing it right now
        ticks, mark = due_ticks(locked, now)
        defn = registry.get_workflow(candidate["workflow_name"], candidate["workflow_version"])
        assert defn is not None  # due_schedules filtered on what the registry has
        for tick in ticks:
            workflow_id = labels.schedule_tick_id(schedule_name, tick)
            inputs = client.inputs.encode(defn, [tick], {})
            params = client.inputs.row(defn, workflow_id, inputs, None, durability)
            started += tx.execute("insert_workflow_pending", params)
        if mark is not None:
            tx.execute("set_schedule_mark", {"schedule_name": schedule_name, "last_tick": mark})
        return started

    return client.db.atomically(fire, "fire_schedule")


# The most ticks one backfill starts: a wider range is split by the caller.
MAX_BACKFILL_TICKS = 10_000


def _stored(client: Starter, name: str) -> dict[str, Any]:
    """The stored schedule `name` (paused or not); UnknownScheduleError if there is none."""
    check_name("name", name)
    for row in client.db.fetch_all("list_schedules", {}):
        if row["schedule_name"] == name:
            return row
    raise UnknownScheduleError(name)


def _code(schedule: dict[str, Any], registry: Registry | None) -> WorkflowDef:
    """The schedule's workflow as this process has it: its timeout and budget are stored
    with every run, so a run is only recorded where the code is imported."""
    found = (registry if registry is not None else default_registry).get_workflow(
        schedule["workflow_name"], schedule["workflow_version"]
    )
    if found is None:
        raise UnknownWorkflowError(schedule["workflow_name"], schedule["workflow_version"])
    return found


def _aware(when: dt.datetime, tz: zoneinfo.ZoneInfo, label: str) -> dt.datetime:
    """`when` as an aware datetime; a naive one is a wall time of the schedule's timezone,
    read as a tick is (`tick_instant`)."""
    if not isinstance(when, dt.datetime):
        raise InvalidScheduleError(f"{label}={when!r}: give a datetime")
    return tick_instant(when, tz) if when.tzinfo is None else when


def backfill_ticks(
    schedule: dict[str, Any], start: dt.datetime, end: dt.datetime
) -> list[dt.datetime]:
    """The schedule's ticks from `start` (included) to `end` (excluded), oldest first: the
    instants `due_ticks` fires, so a backfilled tick has the id its firing has."""
    tz = zoneinfo.ZoneInfo(schedule["timezone"])
    first = _aware(start, tz, "start").astimezone(dt.UTC)
    last = _aware(end, tz, "end").astimezone(dt.UTC)
    if last < first:
        raise InvalidScheduleError(f"end={end!r} is before start={start!r}: swap them")
    # get_next() is strictly after its start; a wall time no later than the clock's reading
    # a second before `first` fires before `first` (ticks keep their order).
    it = croniter(schedule["cron"], _local(first - dt.timedelta(seconds=1), tz))
    ticks: list[dt.datetime] = []
    while True:
        tick = tick_instant(it.get_next(dt.datetime), tz)
        at = tick.astimezone(dt.UTC)
        if at < first or (ticks and at == ticks[-1].astimezone(dt.UTC)):
            continue
        if at >= last:
            return ticks
        if len(ticks) == MAX_BACKFILL_TICKS:
            raise InvalidScheduleError(
                f"{start.isoformat()} .. {end.isoformat()} holds more than "
                f"{MAX_BACKFILL_TICKS} ticks of schedule {schedule['schedule_name']!r}: "
                "backfill it in smaller ranges"
            )
        ticks.append(tick)


def backfill(
    client: Operator,
    name: str,
    start: dt.datetime,
    end: dt.datetime,
    durability: str,
    registry: Registry | None = None,
) -> tuple[list[str], int]:
    """Record the runs of schedule `name`'s ticks in [start, end): each under its tick's id,
    the one the schedule itself uses, so a tick that already ran (or was backfilled) starts
    nothing new. Returns every tick's workflow id and how many were started now."""
    schedule = _stored(client, name)
    defn = _code(schedule, registry)
    ticks = backfill_ticks(schedule, start, end)
    rows = []
    for tick in ticks:
        workflow_id = labels.schedule_tick_id(name, tick)
        inputs = client.inputs.encode(defn, [tick], {})
        rows.append(client.inputs.row(defn, workflow_id, inputs, None, durability))

    started = audit.start_runs(client, rows, "backfill schedule", name) if rows else 0
    if started:
        client.notify_work("schedule")
    return [str(row["workflow_id"]) for row in rows], started


def trigger(
    client: Operator,
    name: str,
    workflow_id: str | None,
    durability: str,
    registry: Registry | None = None,
) -> tuple[WorkflowDef, str, bool]:
    """Record one run of schedule `name` now, outside its ticks: it gets the current time
    as its tick and an id of its own (`workflow_id`, else a new one), so it never takes a
    tick's place. From workflow code it is a start like any other (starts.start_placed): a
    child at the next position of the parent's journal, so a replay adopts the run the
    first pass started instead of starting another. Returns the workflow, the id and
    whether it was started now (False: the id existed, or a replay found it journaled)."""
    schedule = _stored(client, name)
    defn = _code(schedule, registry)
    check_name("workflow_id", workflow_id, optional=True)
    if workflow_id is None and workflow_code_run() is None:
        workflow_id = labels.schedule_trigger_id(name, str(uuid.uuid4()))

    def create(chosen: str, parent: tuple[str, int] | None) -> bool:
        tick = client.clock.now().astimezone(zoneinfo.ZoneInfo(schedule["timezone"]))
        inputs = client.inputs.encode(defn, [tick], {})
        row = client.inputs.row(defn, chosen, inputs, parent, durability)
        started = audit.start_runs(client, [row], "trigger schedule", name) > 0
        if started:
            client.notify_work(chosen)
        return started

    chosen, started = start_placed(defn, workflow_id, create)
    return defn, chosen, bool(started)
