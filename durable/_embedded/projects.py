"""A project's own database on the embedded server, named after its directory.

`durable db url` and an Engine without a URL use one database per project directory on the
one shared server; naming and creating it is separate from running the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path

import psycopg
from psycopg import sql

from durable._embedded.files import _read_password
from durable._embedded.layout import _resolve, _url
from durable._embedded.server import _ensure
from durable.errors import EmbeddedServerError, NoProjectDatabaseError

logger = logging.getLogger("durable")


# What marks a project's top directory, as for ruff and git.
_PROJECT_MARKERS = ("pyproject.toml", ".git")


def project_root(directory: Path | None = None) -> Path:
    """The project a directory (the working directory by default) belongs to: the nearest
    directory at or above it that holds a pyproject.toml or a .git, else the directory
    itself. So `cd examples && python hello.py` uses the project's database, not one of
    its own."""
    try:
        start = _absolute(directory) if directory is not None else _working_directory()
    except FileNotFoundError:
        raise EmbeddedServerError(
            "the working directory no longer exists, and the embedded database of a project "
            "is named after it: cd into the project's directory, or pass a database URL"
        ) from None
    for path in (start, *start.parents):
        if any((path / marker).exists() for marker in _PROJECT_MARKERS):
            return path
    return start


def _working_directory() -> Path:
    """The working directory as the shell names it ($PWD, when it is this directory), not
    with its links resolved: a deploy that runs from /srv/app/current, a link moved to each
    new release, stays one project with one database."""
    here = os.getcwd()  # FileNotFoundError when it was removed
    logical = os.environ.get("PWD")
    if logical and os.path.isabs(logical):
        with contextlib.suppress(OSError):
            if os.path.samefile(logical, here):
                return _absolute(Path(logical))
    return Path(here)


def _absolute(path: Path) -> Path:
    """`path` made absolute and normalized (`..` and `.` removed), links kept."""
    return Path(os.path.normpath(os.path.abspath(path)))


def project_database(directory: Path | None = None) -> str:
    """The embedded database of a project (see project_root): named after its top
    directory, with a hash of the full path so that two checkouts called alike still get
    two databases."""
    path = project_root(directory)
    stem = "".join(c if c.isalnum() else "_" for c in path.name.lower())[:30].strip("_")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return f"durable_{stem or 'root'}_{digest}"


def project_url(
    directory: Path | None = None, data_dir: Path | None = None, *, create: bool = True
) -> str:
    """The URL of this project's database on the embedded server, the server started and
    the database created if needed: the URL works at once, for `psql "$(durable db url)"`
    or `durable migrate` as for the engine. With `create=False` (what only reads), a
    project that has no database yet is said to have none (NoProjectDatabaseError)."""
    data_dir = _resolve(data_dir)
    root = project_root(directory)  # before the server starts: the cwd may be gone
    name = project_database(root)
    port = _ensure(data_dir)
    if create:
        _create_database(port, data_dir, name, root)
    elif not _database_exists(port, data_dir, name):
        raise NoProjectDatabaseError(str(root), name)
    logger.info(
        "project %s: database %s on the embedded PostgreSQL (port %d)",
        root,
        name,
        port,
        extra={"event": "embedded_database", "project": str(root), "database": name},
    )
    return _url(port, data_dir, name)


def _database_exists(port: int, data_dir: Path, name: str) -> bool:
    try:
        with psycopg.connect(
            _url(port, data_dir), password=_read_password(data_dir), connect_timeout=10
        ) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            return found.fetchone() is not None
    except psycopg.Error as exc:
        raise EmbeddedServerError(f"could not read the embedded server's databases: {exc}") from exc


def _create_database(port: int, data_dir: Path, name: str, project: Path) -> None:
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
                    # Said once, where it can be seen: a project run from another
                    # directory than before finds none of its workflows.
                    logger.warning(
                        "durable: a new database %s for project %s on the embedded "
                        "PostgreSQL (workflows started from another project directory "
                        "are in that project's database)",
                        name,
                        project,
                        extra={"event": "embedded_database_created", "database": name},
                    )
    except psycopg.Error as exc:
        raise EmbeddedServerError(
            f"could not create the database {name} on the embedded server: {exc}"
        ) from exc
