"""A project's own database on the embedded server, named after its directory.

`durable db url` and an Engine without a URL use one database per project directory on the
one shared server; naming and creating it is separate from running the server.

Each database carries a comment (COMMENT ON DATABASE) with its project's directory and when
it was last used, refreshed at most once a minute, so that `durable db list` can say whose
it is (its name holds only a hash of the path) and `durable db drop` can remove it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from durable._base.urls import redact
from durable._embedded.files import _read_password
from durable._embedded.layout import _resolve, _url
from durable._embedded.server import _ensure
from durable.errors import EmbeddedServerError, NoProjectDatabaseError

logger = logging.getLogger("durable")


# What marks a project's top directory, as for ruff and git.
_PROJECT_MARKERS = ("pyproject.toml", ".git")
# How often a database's "last used" is written (it is read by `durable db list`).
_TOUCH_EVERY = dt.timedelta(minutes=1)


@dataclass(frozen=True)
class Project:
    """The project whose embedded database is used, and how it was chosen: `marker` is the
    file found (pyproject.toml or .git), `pinned` that DURABLE_PROJECT_DIR named it; with
    neither, the directory is a guess (see `guessed`)."""

    root: Path
    marker: str | None = None
    pinned: bool = False

    @property
    def guessed(self) -> bool:
        """No marker was found and nothing pinned it: the directory a command ran in was
        taken as the project, which is wrong when it ran in a subdirectory."""
        return self.marker is None and not self.pinned

    @property
    def database(self) -> str:
        return _database_name(self.root)

    def describe(self) -> str:
        """What a person reads: "the embedded database of project /path"."""
        return f"the embedded database of project {self.root}"

    def how_chosen(self) -> str | None:
        """Why this directory is the project when it is a guess (else None), and how to
        choose another."""
        if not self.guessed:
            return None
        return (
            f"no pyproject.toml or .git in {self.root} or above it, so that directory is "
            "taken as the project; to use another, run from the project's top directory, "
            "add a pyproject.toml (or .git) there, or set DURABLE_PROJECT_DIR=<its path>"
        )


def find_project(directory: Path | None = None, *, pinned: Path | str | None = None) -> Project:
    """The project a directory (the working directory by default) belongs to, and how it
    was found; `pinned` (DURABLE_PROJECT_DIR) names it outright."""
    if pinned is not None:
        return Project(_absolute(Path(pinned).expanduser()), pinned=True)
    try:
        start = _absolute(directory) if directory is not None else _working_directory()
    except FileNotFoundError:
        raise EmbeddedServerError(
            "the working directory no longer exists, and the embedded database of a project "
            "is named after it: cd into the project's directory, or pass a database URL"
        ) from None
    for path in (start, *start.parents):
        for marker in _PROJECT_MARKERS:
            if (path / marker).exists():
                return Project(path, marker=marker)
    return Project(start)


def project_root(directory: Path | None = None) -> Path:
    """The project a directory (the working directory by default) belongs to: the nearest
    directory at or above it that holds a pyproject.toml or a .git, else the directory
    itself. So `cd examples && python hello.py` uses the project's database, not one of
    its own."""
    return find_project(directory).root


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
    return _database_name(project_root(directory))


def _database_name(path: Path) -> str:
    stem = "".join(c if c.isalnum() else "_" for c in path.name.lower())[:30].strip("_")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return f"durable_{stem or 'root'}_{digest}"


def project_url(
    directory: Path | None = None,
    data_dir: Path | None = None,
    *,
    create: bool = True,
    project: Project | None = None,
) -> str:
    """The URL of this project's database on the embedded server, the server started and
    the database created if needed: the URL works at once, for `psql "$(durable db url)"`
    or `durable migrate` as for the engine. With `create=False` (what only reads), a
    project that has no database yet is said to have none (NoProjectDatabaseError).
    `project` (from find_project) is used as it is; else the one of `directory`."""
    data_dir = _resolve(data_dir)
    if project is None:
        project = find_project(directory)  # before the server starts: the cwd may be gone
    root, name = project.root, project.database
    port = _ensure(data_dir)
    if create:
        _create_database(port, data_dir, name, root)
    elif not _database_exists(port, data_dir, name, root):
        raise NoProjectDatabaseError(str(root), name, guessed=project.guessed)
    url = _url(port, data_dir, name)
    _IN_USE[_key(url)] = project
    logger.info(
        "project %s: database %s on the embedded PostgreSQL (port %d)",
        root,
        name,
        port,
        extra={"event": "embedded_database", "project": str(root), "database": name},
    )
    return url


# The projects whose URLs this process made, by (port, database): what describe_url reads.
_IN_USE: dict[tuple[str, str], Project] = {}


def _key(url: str) -> tuple[str, str]:
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return ("", "")
    return str(info.get("port") or ""), str(info.get("dbname") or "")


def project_of(url: str) -> Project | None:
    """The project whose embedded database `url` is, when this process made that URL."""
    return _IN_USE.get(_key(url))


def describe_url(url: str) -> str:
    """The database `url` names, for a person: "the embedded database of project <dir>"
    when this process made it for a project, else the URL without its password."""
    project = project_of(url)
    return project.describe() if project is not None else f"the database at {redact(url)}"


def _touch(conn: psycopg.Connection[tuple[object, ...]], name: str, project: Path) -> None:
    """Record the project's directory and the time on its database's comment (on `conn`,
    in autocommit), when the comment is missing, names another directory or is over a
    minute old. Best effort: a failure (another process writing the same comment at once)
    loses only a timestamp."""
    now = dt.datetime.now(dt.UTC)
    try:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            (name,),
        ).fetchone()
        if row is None:
            return
        known = _comment(row[0])
        last = known.get("last_used")
        if known.get("project") == str(project) and isinstance(last, str):
            with contextlib.suppress(ValueError):
                if now - dt.datetime.fromisoformat(last) < _TOUCH_EVERY:
                    return
        text = json.dumps({"project": str(project), "last_used": now.isoformat()})
        conn.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(name), sql.Literal(text))
        )
    except psycopg.Error as exc:
        logger.debug("could not record the use of database %s: %s", name, exc)


def _comment(text: object) -> dict[str, object]:
    if not isinstance(text, str):
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class ProjectDatabase:
    """One project's database on the embedded server, as `durable db list` shows it."""

    database: str
    project: str | None  # None: made before databases recorded their project
    size_bytes: int
    last_used: str | None  # ISO 8601, UTC


def list_project_databases(data_dir: Path | None = None) -> list[ProjectDatabase]:
    """Every project's database on the embedded server of `data_dir` (started if it is
    down), most recently used first; none when the server was never made."""
    data_dir = _resolve(data_dir)
    if not (data_dir / "PG_VERSION").exists():
        return []
    port = _ensure(data_dir)
    try:
        with psycopg.connect(
            _url(port, data_dir), password=_read_password(data_dir), connect_timeout=10
        ) as conn:
            rows = conn.execute(
                "SELECT datname, pg_database_size(oid), shobj_description(oid, 'pg_database') "
                "FROM pg_database WHERE datname LIKE 'durable\\_%' ORDER BY datname"
            ).fetchall()
    except psycopg.Error as exc:
        raise EmbeddedServerError(f"could not read the embedded server's databases: {exc}") from exc
    found = []
    for name, size, comment in rows:
        known = _comment(comment)
        project, last = known.get("project"), known.get("last_used")
        found.append(
            ProjectDatabase(
                database=str(name),
                project=project if isinstance(project, str) else None,
                size_bytes=int(size),
                last_used=last if isinstance(last, str) else None,
            )
        )
    found.sort(key=lambda d: d.last_used or "", reverse=True)
    return found


def drop_project_database(project: Project, data_dir: Path | None = None) -> bool:
    """Drop the project's database on the embedded server, ending its sessions first
    (workers and consoles connected to it lose their connections); False when it has
    none. The server keeps running for the other projects."""
    data_dir = _resolve(data_dir)
    if not (data_dir / "PG_VERSION").exists():
        return False
    port = _ensure(data_dir)
    name = project.database
    try:
        with psycopg.connect(
            _url(port, data_dir),
            password=_read_password(data_dir),
            connect_timeout=10,
            autocommit=True,
        ) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                return False
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    except psycopg.Error as exc:
        raise EmbeddedServerError(
            f"could not drop the database {name} on the embedded server: {exc}"
        ) from exc
    for url, known in list(_IN_USE.items()):
        if known.database == name:
            del _IN_USE[url]
    logger.info(
        "dropped database %s of project %s on the embedded PostgreSQL",
        name,
        project.root,
        extra={"event": "embedded_database_dropped", "database": name},
    )
    return True


def _database_exists(port: int, data_dir: Path, name: str, project: Path) -> bool:
    try:
        with psycopg.connect(
            _url(port, data_dir),
            password=_read_password(data_dir),
            connect_timeout=10,
            autocommit=True,
        ) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                return False
            _touch(conn, name, project)
            return True
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
            _touch(conn, name, project)
    except psycopg.Error as exc:
        raise EmbeddedServerError(
            f"could not create the database {name} on the embedded server: {exc}"
        ) from exc
