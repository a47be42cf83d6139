from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable.testing import NoPostgresError, TemplateDatabases, find_postgres

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[TemplateDatabases]:
    """A PostgreSQL server (see durable.testing.find_postgres for the order)."""
    try:
        source = find_postgres()
    except NoPostgresError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))
    dbs = TemplateDatabases(source.url)
    yield dbs
    dbs.close()
    source.close()


@pytest.fixture
def database_url(pg_databases: TemplateDatabases) -> Iterator[str]:
    """A fresh, migrated database of its own for each test."""
    url = pg_databases.create()
    yield url
    pg_databases.drop(url)


@pytest.fixture
def bare_database_url(pg_databases: TemplateDatabases) -> Iterator[str]:
    """A fresh database with no durable schema."""
    url = pg_databases.create(migrated=False)
    yield url
    pg_databases.drop(url)


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child processes that import the test apps."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("DURABLE_CRASH_POINTS", None)
    env["PYTHON"] = sys.executable
    return env
