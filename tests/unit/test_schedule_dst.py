"""Schedule ticks at daylight-saving changes, as pure logic: every wall time of the cron
fires once, at the first moment the zone's clock reads it or later (a repeated time at its
first occurrence, a skipped time when the jump lands); firing minute by minute, catching
up after an outage and backfilling give the same instants.

The 2026 changes: Europe/Berlin 03-29 (02:00 -> 03:00) and 10-25 (03:00 -> 02:00),
America/New_York 03-08 (02:00 -> 03:00) and 11-01 (02:00 -> 01:00), Australia/Lord_Howe
10-04 (02:00 -> 02:30) and 04-05 (02:00 -> 01:30)."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

import pytest

from durable._client.schedules import backfill_ticks, due_ticks, next_tick, tick_instant

U = dt.UTC


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=U)


def schedule(zone: str, cron: str, catch_up: int = 0) -> dict[str, Any]:
    return {
        "schedule_name": "s",
        "timezone": zone,
        "cron": cron,
        "catch_up": catch_up,
        "last_tick": None,
    }


def fired(row: dict[str, Any], start: dt.datetime, end: dt.datetime, every: int) -> list[str]:
    """The ticks `row` fires (UTC, minute precision) with a worker round every `every`
    minutes from `start` to `end`; checks each comes back in the schedule's zone."""
    now, out = start, []
    while now <= end:
        ticks, mark = due_ticks(row, now)
        for tick in ticks:
            assert isinstance(tick.tzinfo, zoneinfo.ZoneInfo)
            assert tick.tzinfo.key == row["timezone"]
            out.append(tick.astimezone(U).strftime("%m-%dT%H:%M"))
        if mark is not None:
            row["last_tick"] = mark.astimezone(U)
        now += dt.timedelta(minutes=every)
    return out


# zone, UTC window around the change, quarter-hour ticks that fire (UTC), daily cron at a
# wall time in the gap or the repeated hour, and the one instant it fires.
Change = tuple[str, tuple[str, str], list[str], tuple[str, str]]
CHANGES: list[Change] = [
    (
        "Europe/Berlin",
        ("2026-03-29T00:10", "2026-03-29T02:10"),
        ["00:15", "00:30", "00:45", "01:00", "01:15", "01:30", "01:45", "02:00"],
        ("30 2 * * *", "03-29T01:00"),  # 02:30 never happens: 03:00 CEST
    ),
    (
        "Europe/Berlin",
        ("2026-10-24T23:40", "2026-10-25T02:10"),
        ["23:45", "00:00", "00:15", "00:30", "00:45", "02:00"],  # 01:00-01:45Z: 02:xx again
        ("30 2 * * *", "10-25T00:30"),  # 02:30 CEST, not 02:30 CET
    ),
    (
        "America/New_York",
        ("2026-03-08T06:10", "2026-03-08T08:10"),
        ["06:15", "06:30", "06:45", "07:00", "07:15", "07:30", "07:45", "08:00"],
        ("30 2 * * *", "03-08T07:00"),  # 03:00 EDT
    ),
    (
        "America/New_York",
        ("2026-11-01T04:40", "2026-11-01T07:10"),
        ["04:45", "05:00", "05:15", "05:30", "05:45", "07:00"],  # 06:00-06:45Z: 01:xx again
        ("30 1 * * *", "11-01T05:30"),  # 01:30 EDT, not 01:30 EST
    ),
    (
        "Australia/Lord_Howe",
        ("2026-10-03T15:10", "2026-10-03T16:10"),
        ["15:15", "15:30", "15:45", "16:00"],  # 02:00 and 02:15 fire with 02:30 (+11)
        ("15 2 * * *", "10-03T15:30"),
    ),
    (
        "Australia/Lord_Howe",
        ("2026-04-04T14:10", "2026-04-04T15:40"),
        ["14:15", "14:30", "14:45", "15:30"],  # 15:00, 15:15Z: 01:30, 01:45 again
        ("45 1 * * *", "04-04T14:45"),  # 01:45 +11:00, not +10:30
    ),
]


# Both changes of a zone in one test: a zone's clocks go forward and back.
ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]


@pytest.mark.parametrize("name", ZONES)
def test_each_wall_time_fires_once_across_a_change(name: str) -> None:
    for change in CHANGES:
        if change[0] == name:
            fires_once(*change)


def fires_once(
    zone: str, window: tuple[str, str], quarters: list[str], daily: tuple[str, str]
) -> None:
    start, end = utc(window[0]), utc(window[1])
    got = fired(schedule(zone, "*/15 * * * *"), start, end, every=5)
    assert [t.split("T")[1] for t in got] == quarters
    # A daily tick, from two days before: one a day, the change's once, at its moment.
    cron, when = daily
    days = fired(schedule(zone, cron), start - dt.timedelta(days=2), end, every=5)
    assert len(days) == 3 and days[-1] == when, days


@pytest.mark.parametrize("name", ZONES)
def test_catch_up_and_backfill_give_the_same_ticks(name: str) -> None:
    for change in CHANGES:
        if change[0] == name:
            same_ticks(*change)


def same_ticks(
    zone: str, window: tuple[str, str], quarters: list[str], daily: tuple[str, str]
) -> None:
    start, end = utc(window[0]), utc(window[1])
    # One round before the change, the next after it: the missed ones all run, once.
    row = schedule(zone, "*/15 * * * *", catch_up=20)
    got = fired(row, start, end, every=int((end - start).total_seconds() // 60))
    assert [t.split("T")[1] for t in got] == quarters
    # Down for three days over the change: catch_up=2 runs the latest and two before it.
    cron, when = daily
    row = schedule(zone, cron, catch_up=2)
    got = fired(row, start - dt.timedelta(days=2), end + dt.timedelta(days=1), 60 * 24 * 3)
    assert len(got) == 3 and got[-1] == when, got
    # Backfilling the window gives what firing gave.
    ticks = backfill_ticks(row, start, end + dt.timedelta(minutes=1))
    assert [
        t.astimezone(U).strftime("%H:%M")
        for t in backfill_ticks(
            schedule(zone, "*/15 * * * *"), start, end + dt.timedelta(minutes=1)
        )
    ] == quarters
    assert [t.astimezone(U).strftime("%m-%dT%H:%M") for t in ticks] == [when]


def test_a_day_of_quarter_hours_is_every_wall_time_once() -> None:
    berlin = schedule("Europe/Berlin", "*/15 * * * *")
    # Naive bounds are wall times of the zone: a 23-hour day and a 25-hour day.
    spring = backfill_ticks(berlin, dt.datetime(2026, 3, 29), dt.datetime(2026, 3, 30))
    autumn = backfill_ticks(berlin, dt.datetime(2026, 10, 25), dt.datetime(2026, 10, 26))
    assert len(spring) == 92  # 96 wall times; the four of 02:xx fire at 03:00, with it
    assert len(autumn) == 96  # 96 wall times; the second 02:xx fires nothing
    for ticks in (spring, autumn):
        instants = [t.astimezone(U) for t in ticks]
        assert instants == sorted(set(instants))
    assert [t.isoformat() for t in autumn[8:13]] == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:15:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:45:00+02:00",
        "2026-10-25T03:00:00+01:00",
    ]
    assert [t.isoformat() for t in spring[7:9]] == [
        "2026-03-29T01:45:00+01:00",
        "2026-03-29T03:00:00+02:00",
    ]


@pytest.mark.parametrize(
    ("zone", "wall", "fires"),
    [
        ("Europe/Berlin", "2026-03-29T02:30", "2026-03-29T03:00:00+02:00"),
        ("Europe/Berlin", "2026-03-29T02:00", "2026-03-29T03:00:00+02:00"),
        ("Europe/Berlin", "2026-03-29T03:00", "2026-03-29T03:00:00+02:00"),
        ("Europe/Berlin", "2026-10-25T02:30", "2026-10-25T02:30:00+02:00"),
        ("America/New_York", "2026-03-08T02:59:59", "2026-03-08T03:00:00-04:00"),
        ("America/New_York", "2026-11-01T01:00", "2026-11-01T01:00:00-04:00"),
        ("Australia/Lord_Howe", "2026-10-04T02:15", "2026-10-04T02:30:00+11:00"),
        ("Australia/Lord_Howe", "2026-04-05T01:30", "2026-04-05T01:30:00+11:00"),
        ("Australia/Lord_Howe", "2026-04-05T02:00", "2026-04-05T02:00:00+10:30"),
    ],
)
def test_the_instant_of_a_wall_time(zone: str, wall: str, fires: str) -> None:
    tick = tick_instant(dt.datetime.fromisoformat(wall), zoneinfo.ZoneInfo(zone))
    assert tick.isoformat() == fires and tick.fold == 0
    assert tick.astimezone(U) == dt.datetime.fromisoformat(fires).astimezone(U)


def test_the_next_tick_shown_skips_the_second_pass() -> None:
    second_pass = utc("2026-10-25T01:30")  # 02:30 CET: 02:xx fired an hour ago, in CEST
    shown = next_tick("*/15 * * * *", "Europe/Berlin", second_pass)
    assert shown.isoformat() == "2026-10-25T03:00:00+01:00"
    shown = next_tick("30 2 * * *", "Europe/Berlin", second_pass)
    assert shown.isoformat() == "2026-10-26T02:30:00+01:00"
    gap = next_tick("30 2 * * *", "Europe/Berlin", utc("2026-03-29T00:30"))
    assert gap.isoformat() == "2026-03-29T03:00:00+02:00"
