"""A step's record write that an outage cuts off is sent again while the run's lease may
hold: the step's code runs once and the workflow finishes, whichever point of the write
the outage hit (before the statement reached the server, while the server refuses
connections, on the server before its commit, after its commit with the answer lost), in
both drivers. Judged by a counter table of the
step's side effect and the stored rows."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

import durable

STEP = "blip.charge"


def _kill_engine_connections(url: str) -> int:
    """Terminate every backend of the engine's pools (the run's connection among them), as
    a server restart or a cut network would, and wait until they are gone."""
    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))"
            " FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'durable%%' AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _refuse_connections(url: str, seconds: float) -> None:
    """The database refuses connections for `seconds` (as a server restarting does), and
    every connection the engine holds is cut."""
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    admin_url = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    allow = 'ALTER DATABASE "{}" ALLOW_CONNECTIONS {}'
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(allow.format(name, "false").encode())
        admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE datname = %s AND application_name LIKE 'durable%%'",
            [name],
        )

    def reopen() -> None:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(allow.format(name, "true").encode())

    threading.Timer(seconds, reopen).start()


def _prepare(url: str, point: str) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("CREATE TABLE side_effects (workflow_id text, at timestamptz DEFAULT now())")
        if point == "on_server":
            # The record's INSERT reaches the server, whose backend is then terminated
            # before the commit (once: a sequence is not rolled back with it).
            admin.execute("CREATE SEQUENCE record_blips")
            admin.execute(
                """
                CREATE FUNCTION blip_record() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.step_name = 'blip.charge' AND nextval('record_blips') = 1 THEN
                        PERFORM pg_terminate_backend(pg_backend_pid());
                        PERFORM pg_sleep(5);  -- where the termination is taken
                    END IF;
                    RETURN NEW;
                END $$
                """
            )
            admin.execute(
                "CREATE TRIGGER blip_record BEFORE INSERT ON durable.steps"
                " FOR EACH ROW EXECUTE FUNCTION blip_record()"
            )


def _side_effect(url: str, point: str) -> None:
    """The step's effect on the world, then the outage at `point` (see the module)."""
    workflow_id = durable.workflow_id()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO side_effects (workflow_id) VALUES (%s)", [workflow_id])
        if point == "after_commit":
            # What a committed record whose answer was lost leaves: the row is there.
            conn.execute(
                "INSERT INTO durable.steps (workflow_id, step_seq, step_name, kind, output,"
                " attempts, started_at) VALUES (%s, %s, %s, 'step', %s, 1, now())",
                [workflow_id, durable.step_id(), STEP, '"charged"'],
            )
    if point in ("before_sent", "after_commit"):
        assert _kill_engine_connections(url) >= 1
    elif point == "refused":
        _refuse_connections(url, 1.5)


def _finished(url: str, workflow_id: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT status, epoch, recovery_attempts,"
            " (SELECT count(*) FROM side_effects WHERE workflow_id = w.workflow_id),"
            " (SELECT count(*) FROM durable.steps s WHERE s.workflow_id = w.workflow_id)"
            " FROM durable.workflows w WHERE workflow_id = %s",
            [workflow_id],
        ).fetchone()
    assert found is not None
    keys = ("status", "epoch", "recovery_attempts", "side_effects", "records")
    return dict(zip(keys, found, strict=True))


ONCE = {"status": "SUCCESS", "epoch": 1, "recovery_attempts": 0, "side_effects": 1, "records": 2}


@pytest.mark.parametrize("point", ["before_sent", "refused", "on_server", "after_commit"])
def test_a_step_whose_record_meets_an_outage_runs_once(database_url: str, point: str) -> None:
    _prepare(database_url, point)
    reg = durable.Registry()

    @durable.step(registry=reg, name=STEP)
    def charge() -> str:
        _side_effect(database_url, point)
        return "charged"

    @durable.step(registry=reg, name="blip.after")
    def after(value: str) -> str:
        return value + "!"

    @durable.workflow(registry=reg, name="blip.flow")
    def flow() -> str:
        return after(charge())

    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.05, lease_seconds=10.0
    ) as engine:
        assert engine.start(flow, workflow_id="blip").result(timeout=30) == "charged!"
    assert _finished(database_url, "blip") == ONCE


def test_an_async_step_whose_record_meets_an_outage_runs_once(database_url: str) -> None:
    _prepare(database_url, "refused")
    reg = durable.Registry()

    @durable.step(registry=reg, name=STEP)
    async def charge() -> str:
        await asyncio.to_thread(_side_effect, database_url, "refused")
        return "charged"

    @durable.step(registry=reg, name="blip.after")
    async def after(value: str) -> str:
        return value + "!"

    @durable.workflow(registry=reg, name="blip.flow")
    async def flow() -> str:
        return await after(await charge())

    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.05, lease_seconds=10.0
    ) as engine:
        assert engine.start(flow, workflow_id="blip").result(timeout=30) == "charged!"
    assert _finished(database_url, "blip") == ONCE
