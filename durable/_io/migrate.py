"""Applies the numbered SQL migrations under an advisory lock.

Migrations are the only definition of the schema: forward-only files in `_io/sql/migrations`,
each applied once, in order, inside one transaction that first takes a transaction-level
advisory lock. Two processes launching at once therefore serialize here: the second waits,
then sees the versions the first applied and does nothing.
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Callable
from importlib import resources
from typing import cast

import psycopg
from psycopg import sql

from durable.errors import MigrationError

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def lock_key(schema: str) -> int:
    """A stable 63-bit advisory-lock key for this schema's migrations."""
    return zlib.crc32(f"durable.migrate:{schema}".encode()) & 0x7FFFFFFF


def available() -> list[tuple[int, str, str]]:
    """(version, name, text) of every shipped migration, in order."""
    found = []
    for entry in resources.files("durable._io.sql.migrations").iterdir():
        match = _FILE_RE.match(entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    return sorted(found)


def latest_version() -> int:
    return available()[-1][0]


def render(text: str, schema: str) -> sql.Composed:
    """Substitute the quoted schema name into a migration's text."""
    return sql.SQL(text).format(schema=sql.Identifier(schema))


# Told of each migration this call applies: (version, name, index, count, seconds), once
# with seconds None as it begins and once with its duration when done (an index on a large
# table can take minutes; an operator should see which one is running).
MigrationProgress = Callable[[int, str, int, int, float | None], None]


def migrate(
    conn: psycopg.Connection[object], schema: str, progress: MigrationProgress | None = None
) -> list[int]:
    """Bring `schema` up to date; returns the versions applied by this call. On a Citus node
    other than the coordinator (a worker may connect to any node), migrations are the
    coordinator's: the schema is only checked."""
    if _citus_non_coordinator(conn):
        check(conn, schema)
        return []
    applied_now: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key(schema)])
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ).format(sql.Identifier(schema))
        )
        rows = conn.execute(
            sql.SQL("SELECT version FROM {}.schema_migrations").format(sql.Identifier(schema))
        ).fetchall()
        done = {int(cast(tuple[int], row)[0]) for row in rows}
        todo = [m for m in available() if m[0] not in done]
        for index, (version, name, text) in enumerate(todo, 1):
            if progress is not None:
                progress(version, name, index, len(todo), None)
            began = time.monotonic()
            conn.execute(render(text, schema))
            conn.execute(
                sql.SQL("INSERT INTO {}.schema_migrations (version, name) VALUES (%s, %s)").format(
                    sql.Identifier(schema)
                ),
                [version, name],
            )
            applied_now.append(version)
            if progress is not None:
                progress(version, name, index, len(todo), time.monotonic() - began)
    return applied_now


def check(conn: psycopg.Connection[object], schema: str, url: str | None = None) -> None:
    """Raise MigrationError unless `schema` is exactly at the version this library ships;
    the message names the database (`url`, or the project whose embedded database it is)
    and advises `durable migrate` only where that would not make a schema in the wrong
    place (an embedded database of a project that was only guessed)."""
    where, advice = _where(url)
    try:
        row = conn.execute(
            sql.SQL("SELECT max(version) FROM {}.schema_migrations").format(sql.Identifier(schema))
        ).fetchone()
    except psycopg.errors.UndefinedTable as exc:
        row = _on_coordinator(conn, schema)
        if row is not None:
            return _compare(row[0], schema, where, advice)
        if advice.startswith("run "):
            advice += " (or start the engine with migrate=True)"
        raise MigrationError(
            f"schema {schema!r} has no durable tables in {where}: {advice}"
        ) from exc
    _compare(cast(tuple[int | None], row)[0] if row else None, schema, where, advice)


def _citus_non_coordinator(conn: psycopg.Connection[object]) -> bool:
    """Whether `conn` is to a node of a Citus cluster that is not its coordinator."""
    row = conn.execute(
        "SELECT to_regclass('pg_catalog.pg_dist_local_group') IS NOT NULL"
        " AND EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
    ).fetchone()
    if not row or not cast(tuple[bool], row)[0]:
        return False
    # The coordinator's group is 0, a worker node's its own (set when it was added).
    found = conn.execute("SELECT groupid <> 0 FROM pg_catalog.pg_dist_local_group").fetchone()
    return bool(found) and bool(cast(tuple[bool], found)[0])


def _on_coordinator(conn: psycopg.Connection[object], schema: str) -> tuple[int | None] | None:
    """The schema's version read on the Citus coordinator, when `conn` is to another node of
    the cluster (a worker may connect to any node: docs/scaling.md): schema_migrations is
    kept on the coordinator only. None: not a Citus node, or no answer."""
    command = sql.SQL("SELECT max(version) FROM {}.schema_migrations").format(
        sql.Identifier(schema)
    )
    try:
        row = conn.execute(
            "SELECT success, result FROM run_command_on_coordinator(%s)",
            [command.as_string(conn)],
        ).fetchone()
    except psycopg.Error:
        return None
    found = cast(tuple[bool, str | None] | None, row)
    if not found or not found[0]:
        return None
    return (int(found[1]) if found[1] and found[1].isdigit() else None,)


def _compare(current: int | None, schema: str, where: str, advice: str) -> None:
    expected = latest_version()
    if current is None or current < expected:
        raise MigrationError(
            f"schema {schema!r} in {where} is at version {current}, this library needs "
            f"{expected}: {advice}"
        )
    if current > expected:
        raise MigrationError(
            f"schema {schema!r} in {where} is at version {current}, newer than this "
            f"library ({expected}): upgrade durable-pg"
        )


def _where(url: str | None) -> tuple[str, str]:
    """The database `url` names, for a message, and what to run to give it the schema."""
    if url is None:
        return "this database", "run `durable migrate`"
    from durable._embedded.projects import describe_url, project_of

    where = describe_url(url)
    project = project_of(url)
    if project is None:
        return where, (
            "run `durable migrate` against that database (--database-url or DURABLE_DATABASE_URL)"
        )
    if project.guessed:
        return where, (
            f"no pyproject.toml or .git was found in {project.root} or above it, so that "
            "directory is only a guess at the project: run the command from your project's "
            "top directory, set DURABLE_PROJECT_DIR to it, or pass --database-url"
        )
    return where, f"run `durable migrate` in {project.root}"
