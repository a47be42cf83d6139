"""`TemplateDatabases.recycle`: a database its test changed only in rows is emptied and handed
out again (no CREATE DATABASE, no DROP DATABASE and its checkpoint); one whose schema or
settings a test changed, or that still has a session on it, is dropped instead."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

import durable
from durable.testing import TemplateDatabases

reg = durable.Registry()


@durable.step(registry=reg, name="recycle.add")
def add(x: int) -> int:
    return x + 1


@durable.workflow(registry=reg, name="recycle.wf")
def wf(x: int) -> int:
    return add(x) * 2


@pytest.fixture
def dbs(pg_databases: TemplateDatabases) -> Iterator[TemplateDatabases]:
    own = TemplateDatabases(pg_databases.admin_url, prefix="durable_recycle")
    yield own
    own.close()


def _settled(dbs: TemplateDatabases) -> None:
    """Wait for the background recycling and drops."""
    deadline = time.monotonic() + 30
    while dbs._pending.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.05)


def _exists(dbs: TemplateDatabases, url: str) -> bool:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(dbs.admin_url) as conn:
        return (
            conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            is not None
        )


def test_a_database_changed_only_in_rows_is_emptied_and_handed_out_again(
    dbs: TemplateDatabases,
) -> None:
    url = dbs.create()
    with durable.Engine(url, registry=reg) as engine:
        assert engine.start(wf, 3).result(timeout=10) == 8
    dbs.recycle(url)
    _settled(dbs)
    again = dbs.create()
    assert again == url
    with psycopg.connect(again) as conn:
        assert conn.execute("SELECT count(*) FROM durable.workflows").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM durable.steps").fetchone() == (0,)
        # The migrations' own record is kept: the schema is still current.
        assert conn.execute("SELECT count(*) FROM durable.schema_migrations").fetchone() != (0,)
    with durable.Engine(again, registry=reg) as engine:
        assert engine.start(wf, 4).result(timeout=10) == 10


@pytest.mark.parametrize(
    "change",
    [
        "CREATE TABLE public.orders (id int)",
        "ALTER TABLE durable.steps ADD COLUMN extra int",
        "CREATE INDEX ON durable.workflows (created_at)",
        "DELETE FROM durable.schema_migrations",
        "CREATE FUNCTION public.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "CREATE SCHEMA other",
        "ALTER DATABASE {db} SET work_mem = '8MB'",
    ],
)
def test_a_database_whose_schema_a_test_changed_is_dropped(
    dbs: TemplateDatabases, change: str
) -> None:
    url = dbs.create()
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(change.format(db=name))
    dbs.recycle(url)
    _settled(dbs)
    assert not _exists(dbs, url)
    assert dbs.create() != url


def test_a_database_with_a_session_left_on_it_is_dropped(dbs: TemplateDatabases) -> None:
    dbs.SESSIONS_END_WITHIN = 0.5
    url = dbs.create()
    left = psycopg.connect(url)
    try:
        dbs.recycle(url)
        _settled(dbs)
        assert not _exists(dbs, url)
    finally:
        left.close()
