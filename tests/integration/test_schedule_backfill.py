"""Backfilling and triggering a schedule: each tick still runs once, and a trigger is a run
of its own."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import zoneinfo
from collections import Counter
from collections.abc import Iterator

import pytest

import durable
from durable import errors
from durable._client.schedules import backfill_ticks, fire

START = dt.datetime(2026, 1, 5, 9, 0, 30, tzinfo=dt.UTC)


@pytest.fixture
def setup(database_url: str) -> Iterator[tuple[durable.Engine, durable.FakeClock, list[str]]]:
    reg = durable.Registry()
    ran: list[str] = []

    @durable.workflow(registry=reg, name="report")
    def report(tick: dt.datetime) -> str:
        ran.append(tick.isoformat())
        return tick.isoformat()

    @durable.workflow(registry=reg, name="other")
    def other() -> None: ...

    clock = durable.FakeClock(START - dt.timedelta(hours=1))
    with durable.Client(database_url, clock=clock) as client:
        client.schedule("hourly", report, "0 * * * *")
        fire(client, reg, "sync")  # a new schedule marks its latest tick, 08:00
        clock.advance(dt.timedelta(hours=1))
        assert fire(client, reg, "sync") == 1  # 09:00, by the schedule itself
    with durable.Engine(database_url, registry=reg, clock=clock, worker=True) as engine:
        engine.retrieve("schedule:hourly:2026-01-05T09:00:00+00:00").result(timeout=30)
        engine.start(other, workflow_id="taken").result(timeout=30)
        yield engine, clock, ran


def test_backfill_runs_each_missing_tick_once_and_none_that_ran(
    setup: tuple[durable.Engine, durable.FakeClock, list[str]],
) -> None:
    engine, _, ran = setup
    client = engine.client
    early, late = (
        dt.datetime(2026, 1, 5, 5, tzinfo=dt.UTC),
        dt.datetime(2026, 1, 5, 10, tzinfo=dt.UTC),
    )
    handles = client.backfill_schedule("hourly", early, late)
    hours = [f"2026-01-05T0{h}:00:00+00:00" for h in range(5, 10)]
    assert [h.workflow_id for h in handles] == [f"schedule:hourly:{t}" for t in hours]
    assert [h.result(timeout=30) for h in handles] == hours
    # Again, and over a wider range: only the ticks not yet run start.
    wider = client.backfill_schedule("hourly", early - dt.timedelta(hours=1), late)
    for h in wider:
        h.result(timeout=30)
    assert Counter(ran) == Counter(["2026-01-05T04:00:00+00:00", *hours])  # each once
    assert Counter(ran)["2026-01-05T09:00:00+00:00"] == 1  # fired, then backfilled: once


def test_trigger_is_a_run_of_its_own_and_the_same_id_runs_once(
    setup: tuple[durable.Engine, durable.FakeClock, list[str]],
) -> None:
    engine, clock, ran = setup
    client = engine.client
    first = client.trigger_schedule("hourly")
    second = client.trigger_schedule("hourly")
    assert first.workflow_id != second.workflow_id
    assert first.workflow_id.startswith("schedule:hourly:trigger:")
    now = first.result(timeout=30)
    assert dt.datetime.fromisoformat(now) - clock.now() < dt.timedelta(minutes=1)
    second.result(timeout=30)
    again = [client.trigger_schedule("hourly", workflow_id="by-hand") for _ in range(2)]
    assert {h.workflow_id for h in again} == {"by-hand"}
    again[0].result(timeout=30)
    assert len(ran) == 1 + 3  # the 09:00 tick, two triggers, one run of "by-hand"
    with pytest.raises(errors.WorkflowConflictError):
        client.trigger_schedule("hourly", workflow_id="taken")  # another workflow's id
    # The schedule's own ticks go on as before: 10:00 runs once.
    clock.advance(dt.timedelta(hours=1))
    assert engine.fire_schedules() == 1


def test_unknown_schedules_and_code_are_refused(
    setup: tuple[durable.Engine, durable.FakeClock, list[str]],
) -> None:
    client = setup[0].client
    with pytest.raises(errors.UnknownScheduleError):
        client.trigger_schedule("nope")
    with pytest.raises(errors.UnknownWorkflowError):  # "report" is not in this registry
        client.trigger_schedule("hourly", registry=durable.Registry())
    with pytest.raises(errors.InvalidScheduleError):
        client.backfill_schedule("hourly", START, START - dt.timedelta(days=1))
    with pytest.raises(errors.InvalidScheduleError):  # a year of minutes: split it
        every_minute = {"schedule_name": "m", "cron": "* * * * *", "timezone": "UTC"}
        backfill_ticks(every_minute, START, START + dt.timedelta(days=365))


def test_a_naive_time_is_read_in_the_schedules_timezone() -> None:
    berlin = {"schedule_name": "b", "cron": "0 9 * * *", "timezone": "Europe/Berlin"}
    ticks = backfill_ticks(berlin, dt.datetime(2026, 1, 5), dt.datetime(2026, 1, 7))
    assert [t.astimezone(dt.UTC).hour for t in ticks] == [8, 8]  # 09:00 in Berlin, winter
    assert all(t.tzinfo == zoneinfo.ZoneInfo("Europe/Berlin") for t in ticks)


def cli(env: dict[str, str], url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args],
        env={**env, "DURABLE_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_backfills_and_triggers(database_url: str, subprocess_env: dict[str, str]) -> None:
    from tests.apps import counter_app

    with durable.Client(database_url) as client:
        client.schedule("ticks", counter_app.ticker, "*/30 * * * *")
    app = ["--app", "tests.apps.counter_app"]
    span = ["--from", "2026-01-05T08:00", "--to", "2026-01-05T10:00"]
    out = cli(subprocess_env, database_url, "schedules", "backfill", "ticks", *span, *app)
    assert out.returncode == 0, out.stderr
    assert "4 ticks" in out.stdout and "4 started" in out.stdout
    out = cli(subprocess_env, database_url, "schedules", "backfill", "ticks", *span, *app)
    assert "0 started, 4 there already" in out.stdout
    ids = {
        cli(subprocess_env, database_url, "schedules", "trigger", "ticks", *app).stdout
        for _ in "ab"
    }
    assert len(ids) == 2
    out = cli(subprocess_env, database_url, "schedules", "trigger", "ticks")  # no code here
    assert out.returncode == 1 and "counter.ticker is not registered" in out.stderr
    with durable.Client(database_url) as client:
        pending = [w for w in client.list_workflows() if w.name == "counter.ticker"]
    assert len(pending) == 4 + 2


def test_a_deleted_schedule_fires_no_more_and_its_runs_are_kept(
    setup: tuple[durable.Engine, durable.FakeClock, list[str]],
) -> None:
    engine, clock, _ = setup
    client = engine.client
    nine = "schedule:hourly:2026-01-05T09:00:00+00:00"
    client.delete_schedule("hourly")  # an operator's action: engine.client, as pause
    assert client.list_schedules() == []
    clock.advance(dt.timedelta(hours=3))
    assert fire(client, engine.registry, "sync") == 0
    assert engine.fire_schedules() == 0
    # The run its tick started is kept, as it was.
    assert client.get_workflow(nine).status is durable.WorkflowStatus.SUCCESS
    assert [w.workflow_id for w in client.list_workflows() if w.name == "report"] == [nine]
    with pytest.raises(errors.UnknownScheduleError, match="hourly"):
        client.delete_schedule("hourly")
    with pytest.raises(errors.UnknownScheduleError):
        client.trigger_schedule("hourly")


def test_the_cli_deletes_a_schedule(database_url: str, subprocess_env: dict[str, str]) -> None:
    from tests.apps import counter_app

    with durable.Client(database_url) as client:
        client.schedule("ticks", counter_app.ticker, "*/30 * * * *")
    out = cli(subprocess_env, database_url, "schedules", "delete", "ticks")
    assert out.returncode == 0, out.stderr
    assert "deleted schedule ticks" in out.stdout
    again = cli(subprocess_env, database_url, "schedules", "delete", "ticks")
    assert again.returncode == 1 and "no schedule named 'ticks'" in again.stderr
    with durable.Client(database_url) as client:
        assert client.list_schedules() == []
