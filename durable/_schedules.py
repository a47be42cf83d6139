"""Cron schedules: each tick starts one workflow, exactly once, however many workers run.

A schedule is a row in `{schema}.schedules`. Every worker round fires the schedules whose
workflow this worker has: under the schedule's row lock (FOR UPDATE SKIP LOCKED, so
workers never wait for each other) it lists the ticks due since `last_tick`, inserts one
workflow per tick with the id `schedule:<name>:<tick in UTC>` (`_labels.schedule_tick_id`;
the primary key makes a second insert of the same tick a no-op), and moves `last_tick`
on. After downtime, the missed-tick policy decides: `catch_up=0` runs only the latest due
tick and skips the others; `catch_up=N` also runs up to N missed ticks before it. Time
comes from the engine's clock, so a month of ticks can be tested in seconds.
"""

from __future__ import annotations

import datetime as dt
import logging
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from croniter import croniter

from durable import _labels as labels
from durable._decorators import workflow_def
from durable._names import check_name
from durable._registry import Registry, default_registry
from durable.errors import DatabaseUnavailableError, InvalidScheduleError

if TYPE_CHECKING:
    from durable._clock import Clock
    from durable._inputs import Inputs
    from durable._systemdb import SystemDB, Tx

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("durable.schedules")


class Starter(Protocol):
    """What firing schedules needs of the client (or engine) that fires them."""

    @property
    def db(self) -> SystemDB: ...

    clock: Clock

    inputs: Inputs

    def notify_work(self, payload: str = "") -> None: ...


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
    """

    def decorate(fn: F) -> F:
        defn = workflow_def(fn)
        schedule = Schedule.build(
            name or defn.name, defn.name, defn.version, cron, timezone, catch_up
        )
        (registry if registry is not None else default_registry).add_schedule(schedule)
        return fn

    return decorate


def due_ticks(
    schedule: dict[str, Any], now: dt.datetime
) -> tuple[list[dt.datetime], dt.datetime | None]:
    """The ticks to run now, oldest first, and the new last_tick (None: nothing changes).

    With no last_tick yet (a new schedule) nothing runs: the latest tick becomes the mark,
    so a schedule starts with the next tick rather than back-filling the past.
    """
    tz = zoneinfo.ZoneInfo(schedule["timezone"])
    last = schedule["last_tick"]
    # get_prev() is strictly before its start, so start one second on and drop the future.
    it = croniter(schedule["cron"], now.astimezone(tz) + dt.timedelta(seconds=1))
    wanted = 1 + int(schedule["catch_up"])
    ticks: list[dt.datetime] = []
    while len(ticks) < wanted:
        tick = it.get_prev(dt.datetime)
        if tick > now:
            continue
        if last is not None and tick <= last:
            break
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
