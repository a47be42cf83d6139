"""A project's own database on the embedded server, named after its directory.

`durable db url` and an Engine without a URL use one database per project directory on the
one shared server; naming and creating it is separate from running the server.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from durable._embedded.files import _read_password
from durable._embedded.layout import _resolve, _url
from durable._embedded.server import _ensure
from durable.errors import EmbeddedServerError

if TYPE_CHECKING:
    pass


def project_database(directory: Path | None = None) -> str:
    """The embedded database of a project: named after its directory (the working
    directory by default), with a hash of the full path so that two checkouts called
    alike still get two databases."""
    try:
        path = (directory or Path.cwd()).resolve()
    except FileNotFoundError:
        raise EmbeddedServerError(
            "the working directory no longer exists, and the embedded database of a project "
            "is named after it: cd into the project's directory, or pass a database URL"
        ) from None
    stem = "".join(c if c.isalnum() else "_" for c in path.name.lower())[:30].strip("_")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return f"durable_{stem or 'root'}_{digest}"


def project_url(directory: Path | None = None, data_dir: Path | None = None) -> str:
    """The URL of this project's database on the embedded server, the server started and
    the database created if needed: the URL works at once, for `psql "$(durable db url)"`
    or `durable migrate` as for the engine."""
    data_dir = _resolve(data_dir)
    name = project_database(directory)  # before the server starts: the cwd may be gone
    port = _ensure(data_dir)
    _create_database(port, data_dir, name)
    return _url(port, data_dir, name)


def _create_database(port: int, data_dir: Path, name: str) -> None:
    """Create database `name` on our server unless it exists. Processes doing it at once
    are fine: a loser sees it exists (DuplicateDatabase), or loses the race inside the
    catalog (a unique violation on pg_database's name)."""
    try:
        with psycopg.connect(
            _url(port, data_dir),
            password=_read_password(data_dir),  # as _probe: the passfile may be new
            connect_timeout=10,
            autocommit=True,
        ) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                with contextlib.suppress(
                    psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation
                ):
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise EmbeddedServerError(
            f"could not create the database {name} on the embedded server: {exc}"
        ) from exc
