"""Whether the embedded server is up: by connecting to it, never by pid files.

A probe also asks the server for its data directory, so a stranger answering on our port is
never taken for ours. It starts nothing and takes no lock, which is why it stands apart from
the start and stop logic.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import psycopg

from durable._embedded.binaries import _NOT_READY, _REFUSED_SIGNS
from durable._embedded.files import _locked_down, _read_password, _read_port
from durable._embedded.layout import _resolve, _url

if TYPE_CHECKING:
    pass

_START_TIMEOUT = 60  # seconds pg_ctl waits for the server to accept connections
_State = Literal["ours", "starting", "refused", "other", "down"]


def _probe(port: int, data_dir: Path) -> _State:
    """Connect to our port and ask whose server answers there."""
    try:
        with psycopg.connect(
            _url(port, data_dir),
            # Explicitly too: the passfile may not be written yet (a data directory from the
            # first version with passwords, whose server is up with its raw password file).
            password=_read_password(data_dir),
            connect_timeout=2,
            autocommit=True,
        ) as conn:
            row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    except psycopg.OperationalError as exc:
        text = str(exc)
        if _NOT_READY in text:
            return "starting"
        return "refused" if any(sign in text for sign in _REFUSED_SIGNS) else "down"
    except psycopg.Error:
        return "other"  # it speaks PostgreSQL but will not tell us its data directory
    if row is None:
        return "other"
    return "ours" if Path(str(row[0])).resolve() == data_dir else "other"


def _settle(port: int, data_dir: Path, wait: float = _START_TIMEOUT) -> _State:
    """Probe, waiting while the server is starting up, shutting down or recovering."""
    deadline = time.monotonic() + wait
    while True:
        state = _probe(port, data_dir)
        if state != "starting" or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


def _up(data_dir: Path) -> int | None:
    """Our server's port if it answers now and its data directory is locked down."""
    port = _read_port(data_dir)
    if port is None or not _locked_down(data_dir):
        return None  # a directory that is not locked down waits for ensure_server's lock
    return port if _probe(port, data_dir) == "ours" else None


def server_url(data_dir: Path | None = None) -> str | None:
    """The URL of the embedded server if it answers now (checked by connecting), else None.

    Starts nothing and takes no lock, so it is cheap to call to see whether a server is up.
    None too for a server whose data directory is not locked down yet (one started by an
    older version): `ensure_server` restarts it first.
    """
    data_dir = _resolve(data_dir)
    port = _up(data_dir)
    return _url(port, data_dir) if port is not None else None
