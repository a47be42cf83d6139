"""Helpers for testing code that uses durable against a real PostgreSQL.

`find_postgres()` picks a server in a fixed order: DURABLE_TEST_DATABASE_URL, the local
server on 127.0.0.1:5432, a testcontainers PostgreSQL when Docker answers, then a throwaway
cluster from the embedded binaries. `TemplateDatabases` migrates one template database and
clones a fresh database from it per test, which costs milliseconds instead of a migration.
There is deliberately no in-memory fake: a durable engine is only as good as its SQL.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from durable import _migrate
from durable.errors import ConfigurationError

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
HOW_TO_GET_ONE = (
    "no PostgreSQL for the tests: set DURABLE_TEST_DATABASE_URL to a server you may create "
    "databases on, run one on 127.0.0.1:5432 (trust auth, user postgres), start Docker for "
    "testcontainers, or `pip install 'durable-pg[embedded]'` for a throwaway cluster"
)


class NoPostgresError(ConfigurationError):
    """No PostgreSQL server is available for tests."""


@dataclass
class PostgresSource:
    """An admin URL (to a maintenance database) and where it came from."""

    url: str
    origin: str
    _cleanup: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for fn in reversed(self._cleanup):
            with contextlib.suppress(Exception):
                fn()
        self._cleanup.clear()


def _reachable(url: str, timeout: int = 3) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=timeout, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-not-found,import-untyped,unused-ignore]

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def find_postgres() -> PostgresSource:
    """Find a server for tests, in the documented order; raise NoPostgresError if none."""
    env_url = os.environ.get("DURABLE_TEST_DATABASE_URL")
    if env_url:
        if not _reachable(env_url, timeout=10):
            raise NoPostgresError(
                f"DURABLE_TEST_DATABASE_URL is set but the server does not answer: fix the "
                f"URL or unset it ({env_url.split('@')[-1]})"
            )
        return PostgresSource(env_url, "DURABLE_TEST_DATABASE_URL")
    if _reachable(LOCAL_URL):
        return PostgresSource(LOCAL_URL, "127.0.0.1:5432")
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16.4-alpine", driver=None)
        container.start()
        source = PostgresSource(container.get_connection_url(), "testcontainers")
        source._cleanup.append(container.stop)
        return source
    try:
        from durable import _embedded

        data_dir = Path(tempfile.mkdtemp(prefix="durable-test-pg-"))
        data_dir.chmod(0o755)
        url = _embedded.ensure_server(data_dir)
    except Exception as exc:
        raise NoPostgresError(f"{HOW_TO_GET_ONE} (embedded server: {exc})") from exc
    source = PostgresSource(url, "embedded")
    source._cleanup.append(lambda: _embedded.stop_server(data_dir))
    return source


def _with_dbname(url: str, dbname: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = dbname
    return psycopg.conninfo.make_conninfo("", **{k: str(v) for k, v in info.items()})


class TemplateDatabases:
    """One migrated template database; `create()` clones a fresh database from it.

    `isolation` (default: DURABLE_TEST_ISOLATION) sets each new database's
    `default_transaction_isolation`: "serializable" runs a suite the way CockroachDB runs
    every transaction, so that serialization failures (SQLSTATE 40001) really happen and
    their retries are exercised."""

    def __init__(
        self,
        admin_url: str,
        schema: str = "durable",
        prefix: str = "durable_test",
        isolation: str | None = None,
    ):
        self.admin_url = admin_url
        self.schema = schema
        self.isolation = isolation or os.environ.get("DURABLE_TEST_ISOLATION") or None
        if self.isolation not in (None, "serializable", "repeatable read", "read committed"):
            raise ConfigurationError(
                f"isolation={self.isolation!r}: use 'serializable', 'repeatable read' or "
                "'read committed'"
            )
        self.prefix = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.template = f"{self.prefix}_tpl"
        self._created: list[str] = []
        self._ready = False

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_url, autocommit=True)

    def _ensure_template(self) -> None:
        if self._ready:
            return
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        with psycopg.connect(_with_dbname(self.admin_url, self.template), autocommit=True) as c:
            _migrate.migrate(c, self.schema)
        self._ready = True

    def create(self, migrated: bool = True) -> str:
        """A new empty database (migrated from the template, or bare); returns its URL."""
        name = f"{self.prefix}_{len(self._created)}"
        with self._admin() as conn:
            if migrated:
                self._ensure_template()
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(name), sql.Identifier(self.template)
                    )
                )
            else:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            if self.isolation is not None:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
                        sql.Identifier(name), sql.Literal(self.isolation)
                    )
                )
        self._created.append(name)
        return _with_dbname(self.admin_url, name)

    def drop(self, url: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(url).get("dbname")
        with self._admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
            )

    def close(self) -> None:
        with self._admin() as conn:
            for name in [*self._created, self.template]:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        self._created.clear()


@contextlib.contextmanager
def postgres_databases(schema: str = "durable") -> Iterator[TemplateDatabases]:
    """Find a server and yield a TemplateDatabases on it; cleans everything up after."""
    source = find_postgres()
    dbs = TemplateDatabases(source.url, schema)
    try:
        yield dbs
    finally:
        with contextlib.suppress(Exception):
            dbs.close()
        source.close()
