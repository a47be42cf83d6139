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
import queue
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from durable._io import migrate as _migrate
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


# What a database's schema is, as far as a test can change it: every object made after
# initdb (catalog rows with an oid of 16384 or more, PostgreSQL's first one for users), with
# what ALTER can change in place (columns, owners, grants, settings), and the database's own
# settings. Two databases with the same fingerprint differ only in their tables' rows.
_SCHEMA_FINGERPRINT = """
SELECT md5(coalesce(string_agg(line, E'\\n' ORDER BY line), '')) FROM (
  SELECT concat_ws(' ', 'class', c.oid, c.relname, c.relnamespace, c.relkind, c.relowner,
    c.relpersistence, c.relacl, c.reloptions, c.relrowsecurity, c.relforcerowsecurity,
    c.relreplident, c.relnatts, c.relchecks, c.relhastriggers, c.relhasrules,
    c.relispartition) AS line FROM pg_class c WHERE c.oid >= 16384
  UNION ALL SELECT concat_ws(' ', 'att', a.attrelid, a.attnum, a.attname, a.atttypid,
    a.atttypmod, a.attnotnull, a.atthasdef, a.attidentity, a.attgenerated, a.attisdropped,
    a.attacl) FROM pg_attribute a WHERE a.attrelid >= 16384 AND a.attnum > 0
  UNION ALL SELECT concat_ws(' ', 'nsp', oid, nspname, nspowner, nspacl)
    FROM pg_namespace WHERE oid >= 16384
  UNION ALL SELECT concat_ws(' ', 'proc', oid, proname, proowner, md5(prosrc), proconfig,
    proacl, provolatile, prosecdef) FROM pg_proc WHERE oid >= 16384
  UNION ALL SELECT concat_ws(' ', 'type', oid, typname, typowner, typacl)
    FROM pg_type WHERE oid >= 16384
  UNION ALL SELECT concat_ws(' ', 'con', oid, conname, convalidated, pg_get_constraintdef(oid))
    FROM pg_constraint WHERE oid >= 16384
  UNION ALL SELECT concat_ws(' ', 'trg', oid, tgname, tgenabled)
    FROM pg_trigger WHERE oid >= 16384
  UNION ALL SELECT concat_ws(' ', 'ext', oid, extname, extversion, extconfig)
    FROM pg_extension WHERE oid >= 16384
  UNION ALL SELECT concat_ws(' ', 'desc', objoid, classoid, objsubid, md5(description))
    FROM pg_description WHERE objoid >= 16384
  UNION ALL SELECT concat_ws(' ', 'obj', tableoid::regclass, oid) FROM (
    SELECT tableoid, oid FROM pg_attrdef UNION ALL SELECT tableoid, oid FROM pg_policy
    UNION ALL SELECT tableoid, oid FROM pg_rewrite UNION ALL SELECT tableoid, oid FROM pg_cast
    UNION ALL SELECT tableoid, oid FROM pg_operator
    UNION ALL SELECT tableoid, oid FROM pg_collation
    UNION ALL SELECT tableoid, oid FROM pg_conversion
    UNION ALL SELECT tableoid, oid FROM pg_statistic_ext
    UNION ALL SELECT tableoid, oid FROM pg_default_acl
    UNION ALL SELECT tableoid, oid FROM pg_event_trigger
    UNION ALL SELECT tableoid, oid FROM pg_publication
    UNION ALL SELECT tableoid, oid FROM pg_largeobject_metadata
    UNION ALL SELECT tableoid, oid FROM pg_opclass UNION ALL SELECT tableoid, oid FROM pg_opfamily
    UNION ALL SELECT tableoid, oid FROM pg_language UNION ALL SELECT tableoid, oid FROM pg_am
    UNION ALL SELECT tableoid, oid FROM pg_foreign_data_wrapper
    UNION ALL SELECT tableoid, oid FROM pg_foreign_server
    UNION ALL SELECT tableoid, oid FROM pg_user_mapping
    UNION ALL SELECT tableoid, oid FROM pg_ts_config UNION ALL SELECT tableoid, oid FROM pg_ts_dict
    UNION ALL SELECT tableoid, oid FROM pg_transform
  ) objects WHERE oid >= 16384
  UNION ALL SELECT concat_ws(' ', 'dbset', setrole, setconfig) FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL SELECT concat_ws(' ', 'db', datdba, datallowconn, datconnlimit, datistemplate,
    datacl) FROM pg_database WHERE datname = current_database()
  UNION ALL SELECT concat_ws(' ', 'prepared', gid) FROM pg_prepared_xacts
    WHERE database = current_database()
) lines
"""

# Sessions on a database other than the caller's own (autovacuum's do not count).
_SESSIONS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
    " AND backend_type = 'client backend'"
)
# The tables and sequences of a database, as `schema.name` (quoted), and their kinds.
_RELATIONS = (
    "SELECT format('%I.%I', n.nspname, c.relname), c.relkind FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.oid >= 16384 AND c.relkind IN ('r', 'p', 'S') AND c.relpersistence <> 't'"
    " ORDER BY 1"
)


@dataclass
class _Fresh:
    """A database as `create()` makes it: its schema's fingerprint, the relations that hold
    rows in it (a migration's bookkeeping) and a digest of those rows, and the TRUNCATE that
    empties every other table."""

    schema: str
    kept: list[str]
    rows: str
    truncate: sql.Composed | None

    @classmethod
    def of(cls, conn: psycopg.Connection[Any]) -> _Fresh:
        relations = conn.execute(_RELATIONS).fetchall()
        kept: list[str] = []
        emptied: list[str] = []
        for name, kind in relations:
            query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.SQL(name))
            has_rows = kind == "S" or _one(conn, query)
            (kept if has_rows else emptied).append(name)
        truncate = None
        if emptied:
            truncate = sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
                sql.SQL(", ").join([sql.SQL(name) for name in emptied])
            )
        return cls(_one(conn, _SCHEMA_FINGERPRINT), kept, _digest(conn, kept), truncate)

    def matches(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether `conn`'s database differs from this fresh one only in the rows of the
        tables `truncate` empties."""
        return (
            _one(conn, _SCHEMA_FINGERPRINT) == self.schema and _digest(conn, self.kept) == self.rows
        )


def _one(conn: psycopg.Connection[Any], query: Any, args: Any = None) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def _digest(conn: psycopg.Connection[Any], relations: list[str]) -> str:
    parts = [
        _one(
            conn,
            sql.SQL(
                "SELECT md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM {} t"
            ).format(sql.SQL(name)),
        )
        for name in relations
    ]
    return " ".join(parts)


class TemplateDatabases:
    """One migrated template database; `create()` clones a fresh database from it.

    `isolation` (default: DURABLE_TEST_ISOLATION) sets each new database's
    `default_transaction_isolation`: "serializable" runs a suite the way CockroachDB runs
    every transaction, so that serialization failures (SQLSTATE 40001) really happen and
    their retries are exercised.

    Cloning a database costs a tenth of a second, and dropping one makes PostgreSQL (15 and
    later) wait for a checkpoint, from a tenth of a second to seconds. `recycle(url)` does
    neither: in a background thread, a database its test is done with is emptied and kept
    for the next `create()`, if the test left no session on it and changed nothing but the
    rows of its tables (else it is dropped there). `drop(url, wait=False)` drops in that
    thread too; `close()` waits for it."""

    # Databases waiting for the background thread, at most: a suite that hands them over
    # faster than they are emptied or dropped waits, instead of filling the disk.
    PENDING = 8
    # How long a recycled database's last sessions (a closed pool's, say) may take to end.
    SESSIONS_END_WITHIN = 5.0

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
        self._count = 0
        self._ready = False
        self._fresh: _Fresh | None = None
        self._spare: list[str] = []
        self._lock = threading.Lock()
        self._pending: queue.Queue[tuple[str, str] | None] = queue.Queue(maxsize=self.PENDING)
        self._worker: threading.Thread | None = None

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
        if migrated:
            with self._lock:
                spare = self._spare.pop() if self._spare else None
            if spare is not None:
                return _with_dbname(self.admin_url, spare)
        with self._lock:
            name = f"{self.prefix}_{self._count}"
            self._count += 1
            self._created.append(name)
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
        url = _with_dbname(self.admin_url, name)
        if migrated and self._fresh is None:
            with psycopg.connect(url, autocommit=True) as conn:
                self._fresh = _Fresh.of(conn)
        return url

    def recycle(self, url: str) -> None:
        """Done with a database `create()` made: keep it for a later `create()` (emptied)
        if its test changed nothing but rows, else drop it; in the background."""
        self._hand_over("recycle", url)

    def drop(self, url: str, wait: bool = True) -> None:
        """Drop a database `create()` made (its connections are closed first). With
        `wait=False` the drop happens in the background; `close()` waits for it."""
        if not wait:
            self._hand_over("drop", url)
            return
        with self._admin() as conn:
            self._drop(conn, _dbname(url))

    def _hand_over(self, what: str, url: str) -> None:
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="durable-test-databases", daemon=True
                )
                self._worker.start()
        self._pending.put((what, _dbname(url)))

    def _drop(self, conn: psycopg.Connection[Any], name: str) -> None:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        with self._lock, contextlib.suppress(ValueError):
            self._created.remove(name)

    def _work(self) -> None:
        """The background recycling and drops, one after another on one connection. A
        database that cannot be recycled is dropped; one that cannot be dropped is left to
        `close()`."""
        admin: psycopg.Connection[Any] | None = None
        try:
            while (job := self._pending.get()) is not None:
                what, name = job
                try:
                    if what == "recycle" and self._emptied(name):
                        with self._lock:
                            self._spare.append(name)
                        continue
                    if admin is None or admin.closed:
                        admin = self._admin()
                    self._drop(admin, name)
                except Exception:
                    if admin is not None:
                        admin.close()
                    admin = None
                finally:
                    self._pending.task_done()
        finally:
            if admin is not None:
                admin.close()

    def _emptied(self, name: str) -> bool:
        """Empty database `name` if its test left it as `create()` made it but for rows, and
        no session on it; False if not (or if it is gone)."""
        fresh = self._fresh
        if fresh is None:
            return False
        try:
            conn = psycopg.connect(_with_dbname(self.admin_url, name), autocommit=True)
        except psycopg.OperationalError:
            return False
        with conn:
            deadline = time.monotonic() + self.SESSIONS_END_WITHIN
            while _one(conn, _SESSIONS, [name]) > 0:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
            if not fresh.matches(conn):
                return False
            if fresh.truncate is not None:
                conn.execute(fresh.truncate)
        return True

    def close(self) -> None:
        """Wait for the background work, then drop every database left and the template."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            self._pending.put(None)
            worker.join()
        with self._admin() as conn:
            for name in [*self._created, self.template]:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        self._created.clear()
        self._spare.clear()


def _dbname(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(url).get("dbname"))


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
