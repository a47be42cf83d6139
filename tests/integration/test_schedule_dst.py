"""Schedules and zoned datetimes at daylight-saving changes, on a real database and a fake
clock: each wall time of a cron fires one workflow (the rows of the workflows table, one
per instant), catching up and backfilling start the same ones, each run gets its tick in
the schedule's zone, and a step may return a time of the repeated hour.

The tick rule (pure logic, and the 2026 dates): tests/unit/test_schedule_dst.py."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterator

import psycopg
import pytest

import durable
from tests.unit.test_schedule_dst import CHANGES, ZONES, utc

U = dt.UTC


@pytest.fixture
def reg() -> durable.Registry:
    return durable.Registry()


def report_workflow(reg: durable.Registry, name: str = "report") -> object:
    @durable.workflow(registry=reg, name=name)
    def report(tick: dt.datetime) -> list[str]:
        zone = tick.tzinfo
        assert isinstance(zone, zoneinfo.ZoneInfo) and zone.key is not None
        return [tick.isoformat(), zone.key, str(tick.fold)]

    return report


def started(database_url: str, name: str) -> list[str]:
    """The instants (UTC, `MM-DDTHH:MM`) of the workflows schedule `name` started."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT workflow_id FROM durable.workflows WHERE workflow_id LIKE %s",
            (f"schedule:{name}:%",),
        ).fetchall()
    instants = sorted(dt.datetime.fromisoformat(r[0].split(":", 2)[2]) for r in rows)
    return [i.astimezone(U).strftime("%m-%dT%H:%M") for i in instants]


def quarter_instants(start: dt.datetime, quarters: list[str]) -> list[str]:
    """The `HH:MM` quarters of a window as `MM-DDTHH:MM` (the window may cross midnight)."""
    out = []
    for quarter in quarters:
        hour, minute = map(int, quarter.split(":"))
        at = start.replace(hour=hour, minute=minute)
        out.append((at if at >= start else at + dt.timedelta(days=1)).strftime("%m-%dT%H:%M"))
    return out


def run_all(engine: durable.Engine, zone: str) -> list[str]:
    """Run every started tick; each gets its tick in the schedule's zone. Returns the
    ticks (ISO, in the zone)."""
    handles = engine.recover(limit=500)
    ticks = []
    for handle in handles:
        iso, key, fold = handle.result(timeout=60)
        assert key == zone
        tick = dt.datetime.fromisoformat(iso)
        # The id is the instant; the run's argument is that instant on the zone's clock.
        assert handle.workflow_id.endswith(tick.astimezone(U).isoformat())
        assert fold == "0"
        ticks.append(iso)
    return sorted(ticks)


@pytest.mark.parametrize("zone", ZONES)
def test_each_wall_time_fires_one_workflow_across_both_changes(
    database_url: str, reg: durable.Registry, zone: str
) -> None:
    report = report_workflow(reg)
    changes = sorted((c for c in CHANGES if c[0] == zone), key=lambda c: c[1][0])
    clock = durable.FakeClock(utc(changes[0][1][0]) - dt.timedelta(hours=1))
    with durable.Engine(database_url, registry=reg, clock=clock) as engine:
        for n, (_, window, quarters, (cron, when)) in enumerate(changes):
            start, end = utc(window[0]), utc(window[1])
            clock.set(start)
            engine.schedule(f"q{n}", report, "*/15 * * * *", timezone=zone)
            engine.schedule(f"d{n}", report, cron, timezone=zone)
            while clock.now() <= end:
                engine.fire_schedules()
                clock.advance(dt.timedelta(minutes=5))
            engine.client.pause_schedule(f"q{n}")
            engine.client.pause_schedule(f"d{n}")
            assert started(database_url, f"q{n}") == quarter_instants(start, quarters)
            assert started(database_url, f"d{n}") == [when]
        assert len(run_all(engine, zone)) == sum(len(c[2]) + 1 for c in changes)


def test_catch_up_over_a_change_starts_each_missed_tick_once(database_url: str) -> None:
    # Two engines on one clock, each firing the schedule whose workflow it has.
    quarter_reg, nightly_reg = durable.Registry(), durable.Registry()
    quarter, nightly = report_workflow(quarter_reg), report_workflow(nightly_reg, "nightly")
    clock = durable.FakeClock(dt.datetime(2026, 10, 23, 12, tzinfo=U))
    with (
        durable.Engine(database_url, registry=quarter_reg, clock=clock) as quarters,
        durable.Engine(database_url, registry=nightly_reg, clock=clock) as nightlies,
    ):
        nightlies.schedule("nightly", nightly, "30 2 * * *", timezone="Europe/Berlin", catch_up=2)
        nightlies.fire_schedules()  # its mark: 10-23's tick
        quarters.schedule("q", quarter, "*/15 * * * *", timezone="Europe/Berlin", catch_up=20)
        clock.set(dt.datetime(2026, 10, 24, 23, 40, tzinfo=U))
        quarters.fire_schedules()  # its mark: 23:30Z
        clock.set(dt.datetime(2026, 10, 25, 2, 10, tzinfo=U))  # one round after the change
        quarters.fire_schedules()
        assert started(database_url, "q") == [
            "10-24T23:45",
            "10-25T00:00",
            "10-25T00:15",
            "10-25T00:30",
            "10-25T00:45",  # 02:45 CEST; 01:00-01:45Z read 02:xx again and fire nothing
            "10-25T02:00",
        ]
        quarters.client.pause_schedule("q")
        # The nightly's worker was down three days over the change: catch_up=2 runs the
        # two missed ticks and the latest; then a round every six hours.
        clock.set(dt.datetime(2026, 10, 26, 12, tzinfo=U))
        assert nightlies.fire_schedules() == 3
        for _ in range(8):
            clock.advance(dt.timedelta(hours=6))
            nightlies.fire_schedules()
        assert started(database_url, "nightly") == [
            "10-24T00:30",
            "10-25T00:30",  # 02:30 CEST, the first of the two
            "10-26T01:30",
            "10-27T01:30",
            "10-28T01:30",
        ]
        assert nightlies.fire_schedules() == 0  # nothing twice
        run_all(quarters, "Europe/Berlin")
        ticks = run_all(nightlies, "Europe/Berlin")
    assert "2026-10-25T02:30:00+02:00" in ticks and "2026-10-26T02:30:00+01:00" in ticks


def test_backfill_over_the_days_of_the_changes(database_url: str, reg: durable.Registry) -> None:
    report = report_workflow(reg)
    # After both days: a backfill of the past.
    clock = durable.FakeClock(dt.datetime(2026, 11, 2, tzinfo=U))
    with durable.Engine(database_url, registry=reg, clock=clock) as engine:
        engine.schedule("q", report, "*/15 * * * *", timezone="Europe/Berlin")
        engine.schedule("d", report, "30 2 * * *", timezone="Europe/Berlin")
        # Naive bounds are the zone's wall times: a day of 23 hours and one of 25.
        for day in (dt.datetime(2026, 3, 29), dt.datetime(2026, 10, 25)):
            engine.client.backfill_schedule("q", day, day + dt.timedelta(days=1))
            engine.client.backfill_schedule("d", day, day + dt.timedelta(days=1))
        quarters = started(database_url, "q")
        assert len(quarters) == 92 + 96  # every wall time once; 02:xx in March at 03:00
        assert "03-29T00:45" in quarters and "03-29T01:00" in quarters
        assert [q for q in quarters if q.startswith("10-25T0")][:10] == [
            "10-25T00:00",
            "10-25T00:15",
            "10-25T00:30",
            "10-25T00:45",  # the first 02:45; the second (01:45Z) is not a tick
            "10-25T02:00",
            "10-25T02:15",
            "10-25T02:30",
            "10-25T02:45",
            "10-25T03:00",
            "10-25T03:15",
        ]
        assert started(database_url, "d") == ["03-29T01:00", "10-25T00:30"]
        # Again, by aware bounds over the repeated hour (its second pass, 01:00-01:45Z, has
        # no ticks): nothing new.
        again = engine.client.backfill_schedule(
            "q",
            dt.datetime(2026, 10, 24, 23, tzinfo=U),
            dt.datetime(2026, 10, 25, 3, tzinfo=U),
        )
        assert len(again) == 12 and len(started(database_url, "q")) == 92 + 96
        ticks = run_all(engine, "Europe/Berlin")
    assert "2026-03-29T03:00:00+02:00" in ticks and "2026-10-25T02:30:00+02:00" in ticks


@pytest.fixture
def ambiguous_app(reg: durable.Registry) -> Iterator[object]:
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")

    @durable.step(registry=reg)
    def local_time(fold: int) -> dt.datetime:
        return dt.datetime(2026, 10, 25, 2, 30, tzinfo=berlin, fold=fold)

    @durable.workflow(registry=reg, name="ambiguous")
    def ambiguous(fold: int) -> dt.datetime:
        return local_time(fold)

    yield ambiguous


@pytest.mark.parametrize("fold", [0, 1])
def test_a_step_may_return_a_time_of_the_repeated_hour(
    database_url: str, reg: durable.Registry, ambiguous_app: object, fold: int
) -> None:
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    value = dt.datetime(2026, 10, 25, 2, 30, tzinfo=berlin, fold=fold)
    with durable.Engine(database_url, registry=reg) as engine:
        first = engine.start(ambiguous_app, fold, workflow_id="w")  # type: ignore[arg-type]
        replayed = engine.fork("w", from_step=1, new_id="replayed")  # the step from the journal
        for got in (first.result(timeout=30), replayed.result(timeout=30)):
            assert isinstance(got, dt.datetime)
            assert got.astimezone(U) == value.astimezone(U)  # the same instant
            assert got.tzinfo is berlin and got.fold == fold  # in its zone, the same hour
            assert got.isoformat() == value.isoformat()


def test_a_trigger_in_the_repeated_hour_runs_at_that_moment(
    database_url: str, reg: durable.Registry
) -> None:
    report = report_workflow(reg)
    second_pass = dt.datetime(2026, 10, 25, 1, 30, tzinfo=U)  # 02:30 CET, the second time
    clock = durable.FakeClock(second_pass)
    with durable.Engine(database_url, registry=reg, clock=clock, worker=True) as engine:
        engine.schedule("nightly", report, "30 2 * * *", timezone="Europe/Berlin")
        iso, zone, fold = engine.client.trigger_schedule("nightly").result(timeout=30)
    assert (zone, fold) == ("Europe/Berlin", "1")
    assert dt.datetime.fromisoformat(iso) - second_pass < dt.timedelta(minutes=1)
    assert iso.startswith("2026-10-25T02:30") and iso.endswith("+01:00")
