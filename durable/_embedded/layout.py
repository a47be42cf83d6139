"""Where the embedded server lives: its data directory, lock, socket directory and URL.

Paths and the URL are derived from the data directory alone, so every process that asks
finds the same server; they are kept apart from the code that creates or starts anything.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from durable._embedded.accounts import _can_reach, _is_root, _root_fallback_base, _server_user
from durable._embedded.files import _PASSFILE, _SUPERUSER
from durable.errors import EmbeddedServerError

if TYPE_CHECKING:
    pass

_LOCK_TIMEOUT = 180.0
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL
_SOCKET_NAME_MAX = len("/.s.PGSQL.65535")
# pg_ctl pastes -D and -l into a /bin/sh command line inside double quotes.
_SHELL_UNSAFE = frozenset('"$`\\\n')


def default_data_dir() -> Path:
    """Where the embedded server keeps its data when no directory is passed.

    `platformdirs.user_data_dir("durable") / "pgdata"` (DURABLE_DATA_DIR is read by
    `Config.resolve` and passed down as the data directory). As
    root that location is usually unreachable for the unprivileged account the server must run
    as (root's home is 0700), and then the default is `/var/lib/durable-embedded/pgdata`
    instead, so that `durable` works as root without setup (and keeps its data across a
    reboot). The result is what
    `ensure_server()` with no argument uses, so it answers "where is my data".
    """
    import platformdirs

    path = Path(platformdirs.user_data_dir("durable", appauthor=False)) / "pgdata"
    path = path.expanduser().resolve()
    if _is_root():
        try:
            user = _server_user(path)
        except EmbeddedServerError:
            return path  # ensure_server will explain
        if user is not None and not _can_reach(path, user):
            return _root_fallback_base() / "pgdata"
    return path


def _resolve(data_dir: Path | None) -> Path:
    if data_dir is None:
        return default_data_dir()
    return Path(data_dir).expanduser().resolve()


def _lock_path(data_dir: Path) -> Path:
    # Beside the data directory, not inside: the data directory may not exist yet, and it
    # belongs to the server's account while the lock belongs to whoever calls us.
    return data_dir.parent / f"{data_dir.name}.lock"


def _socket_dir(data_dir: Path) -> Path:
    """The data directory if a socket path in it fits the 107-byte limit, else the temp dir."""
    for candidate in (data_dir, Path(tempfile.gettempdir()), Path("/tmp")):
        if len(os.fsencode(str(candidate))) + _SOCKET_NAME_MAX <= _SOCKET_PATH_MAX:
            return candidate
    return Path("/tmp")


def _url(port: int, data_dir: Path, dbname: str = "postgres") -> str:
    """The URL of a database on the server: it names the password file, never the password,
    so that printing it, logging it or passing it on a command line gives nothing away."""
    passfile = quote(str(data_dir / _PASSFILE), safe="/")
    return f"postgresql://{_SUPERUSER}@127.0.0.1:{port}/{dbname}?passfile={passfile}"


def _check_path(data_dir: Path) -> None:
    if sys.platform == "win32":
        raise EmbeddedServerError(
            "the embedded server is not supported on Windows: pass a database URL or set "
            "DURABLE_DATABASE_URL"
        )
    if _SHELL_UNSAFE & set(str(data_dir)):
        raise EmbeddedServerError(
            f"the data directory path {str(data_dir)!r} contains a character pg_ctl cannot "
            'quote (" $ ` \\ or a newline): set DURABLE_DATA_DIR to a plainer path'
        )
