"""A day-long sleep and cron schedules, on a fake clock shared with real worker processes."""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

import durable
from durable import errors
from tests import reads
from tests.acceptance.workers import client, scalar, start_worker, stop_worker, wait_for
from tests.apps import counter_app


def cli(env: dict[str, str], url: str, *args: str) -> str:
    """Run `durable ARGS` in a fresh process; returns its stdout."""
    out = subprocess.run(
        [sys.executable, "-m", "durable.cli", *args],
        env={**env, "DURABLE_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_day_long_sleep_survives_sigkill_and_wakes_once_on_time(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    clock = durable.FakeClock(dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC), path=tmp_path / "t")
    with client(database_url) as engine:
        handle = engine.submit(counter_app.napper, "nap", 86_400.0, workflow_id="nap")
        first = start_worker(subprocess_env, database_url, clock_file=str(tmp_path / "t"))
        wait_for(lambda: handle.status() == "SUSPENDED", what="the sleep to suspend")
        first.send_signal(signal.SIGKILL)
        first.wait()
        wake_at = scalar(database_url, "SELECT wake_at FROM durable.workflows")
        assert isinstance(wake_at, dt.datetime)
        assert abs((wake_at - clock.now()) - dt.timedelta(days=1)) < dt.timedelta(minutes=1)
        second = start_worker(subprocess_env, database_url, clock_file=str(tmp_path / "t"))
        try:
            time.sleep(2.0)  # twenty polls of the fresh worker: not due, so it must not wake
            assert handle.status() == "SUSPENDED"
            clock.advance(dt.timedelta(days=1))
            assert handle.result(timeout=60) == "AFTER"
        finally:
            stop_worker(second)
        steps = engine.steps("nap")
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT what FROM world WHERE workflow_id = 'nap' ORDER BY id")
        whats = [r[0] for r in rows]
    assert whats == ["before", "after"]  # each step once: the sleep did not run again
    assert [s.kind for s in steps] == ["step", "sleep", "step"]
    woke = steps[2].started_at
    assert woke is not None and wake_at <= woke < wake_at + dt.timedelta(seconds=30)


def test_three_workers_run_each_tick_exactly_once(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        engine.schedule("every-second", counter_app.ticker, "* * * * * *", catch_up=3)
        workers = [start_worker(subprocess_env, database_url) for _ in range(3)]
        try:

            def ticks() -> list[str]:
                query = "SELECT what FROM world WHERE workflow_id = 'ticker' ORDER BY what"
                return [r[0] for r in reads.rows(database_url, query)]

            wait_for(lambda: len(ticks()) >= 7, what="seven ticks")
            cli(subprocess_env, database_url, "schedules", "pause", "every-second")
            time.sleep(1.5)  # ticks started before the pause finish
            wait_for(
                lambda: (
                    scalar(
                        database_url,
                        "SELECT count(*) FROM durable.workflows WHERE status <> 'SUCCESS'",
                    )
                    == 0
                ),
                what="started ticks to finish",
            )
            seen = ticks()
            time.sleep(1.5)
            assert ticks() == seen  # paused: nothing more fires
        finally:
            for proc in workers:
                stop_worker(proc)
    times = [dt.datetime.fromisoformat(t) for t in seen]
    assert len(set(times)) == len(times)  # no tick ran twice
    # Every second from the first tick to the last ran: 5 s of schedule is exactly 5 runs.
    assert times == [times[0] + dt.timedelta(seconds=i) for i in range(len(times))]
    window = [t for t in times if t < times[0] + dt.timedelta(seconds=5)]
    assert len(window) == 5
    pids = scalar(database_url, "SELECT count(DISTINCT pid) FROM world WHERE workflow_id='ticker'")
    assert isinstance(pids, int) and pids >= 1
    (row,) = json.loads(cli(subprocess_env, database_url, "schedules", "list", "--json"))
    assert row["schedule_name"] == "every-second" and row["paused"] is True


def test_missed_tick_policy_after_an_outage(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="report")
    def report(tick: dt.datetime) -> str:
        return tick.isoformat()

    start = dt.datetime(2026, 1, 5, 7, 58, 30, tzinfo=dt.UTC)
    clock = durable.FakeClock(start)
    with durable.Engine(database_url, registry=reg, clock=clock) as engine:
        engine.schedule("skip", report, "* * * * *")
        engine.schedule("catch", report, "* * * * *", catch_up=3)

        def started(name: str) -> list[str]:
            return sorted(
                w.workflow_id
                for w in engine.list_workflows(limit=1000)
                if w.workflow_id.startswith(f"schedule:{name}:")
            )

        assert engine.fire_schedules() == 0  # a new schedule starts at its next tick
        clock.advance(60)
        assert engine.fire_schedules() == 2  # 07:59 for each
        assert engine.fire_schedules() == 0  # the same tick never twice
        # Downtime: ten minutes pass with no worker.
        clock.advance(600)
        engine.fire_schedules()
        assert started("skip") == [
            "schedule:skip:2026-01-05T07:59:00+00:00",
            "schedule:skip:2026-01-05T08:09:00+00:00",  # only the latest; 9 skipped
        ]
        assert started("catch")[1:] == [
            f"schedule:catch:2026-01-05T08:0{m}:00+00:00" for m in (6, 7, 8, 9)
        ]  # at most 3 missed ones, then the latest
        engine.client.pause_schedule("skip")
        clock.advance(120)
        engine.fire_schedules()
        assert len(started("skip")) == 2  # paused
        assert len(started("catch")) == 7
        with pytest.raises(errors.UnknownScheduleError, match="schedules list"):
            engine.client.pause_schedule("nope")
        # The ticks run as ordinary workflows with the tick as their argument.
        handles = engine.recover(limit=100)
        results = {h.result(timeout=30) for h in handles}
        assert "2026-01-05T08:09:00+00:00" in results


def test_decorated_schedule_follows_its_timezone(database_url: str) -> None:
    reg = durable.Registry()

    @durable.scheduled("0 9 * * *", timezone="Europe/Berlin", registry=reg)
    @durable.workflow(registry=reg, name="morning")
    def morning(tick: dt.datetime) -> str:
        return tick.isoformat()

    clock = durable.FakeClock(dt.datetime(2026, 1, 5, 7, 59, 0, tzinfo=dt.UTC))
    with durable.Engine(database_url, registry=reg, clock=clock) as engine:
        (row,) = engine.client.list_schedules()  # stored when the engine started
        assert (row["schedule_name"], row["timezone"]) == ("morning", "Europe/Berlin")
        engine.fire_schedules()
        clock.advance(120)  # 08:01 UTC is 09:01 in Berlin (winter)
        assert engine.fire_schedules() == 1
        (info,) = engine.list_workflows()
        assert info.workflow_id == "schedule:morning:2026-01-05T08:00:00+00:00"


def test_bad_schedules_are_refused_and_nothing_is_stored(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="job")
    def job(tick: dt.datetime) -> None:
        return None

    with pytest.raises(errors.InvalidScheduleError, match="valid cron expression"):
        durable.scheduled("every five minutes", registry=reg)(job)
    with pytest.raises(errors.InvalidScheduleError, match="IANA timezone"):
        durable.scheduled("*/5 * * * *", timezone="Mars/Olympus", registry=reg)(job)
    with pytest.raises(errors.InvalidScheduleError, match="catch_up"):
        durable.scheduled("*/5 * * * *", catch_up=-1, registry=reg)(job)
    assert reg.schedules() == []
    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(errors.InvalidScheduleError, match="five fields"):
            engine.schedule("bad", job, "61 * * * *")
        with pytest.raises(errors.InvalidScheduleError, match="Europe/Berlin"):
            engine.schedule("bad", job, "* * * * *", timezone="Nowhere/City")
        assert engine.client.list_schedules() == []
