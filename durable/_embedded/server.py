"""Starting and stopping the embedded server: `ensure_server` and `stop_server`.

The entry points the rest of durable calls. Each takes the data directory's lock, checks
again what it finds, and only then runs initdb, pg_ctl start or pg_ctl stop; the pieces it
puts together live in the other modules of this package.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from durable._embedded.accounts import _make_parent, _server_user
from durable._embedded.binaries import _LEFTOVER_SIGNS, _LEFTOVER_WAIT, _bin_dir, _package_dir, _run
from durable._embedded.cluster import _free_port, _initdb, _lock_down
from durable._embedded.files import (
    _NO_TRICKS,
    _PASSFILE,
    _PORT_FILE,
    _locked_down,
    _pg_version,
    _read_port,
    _write_private,
)
from durable._embedded.layout import (
    _LOCK_TIMEOUT,
    _check_path,
    _lock_path,
    _resolve,
    _socket_dir,
    _url,
)
from durable._embedded.liveness import _START_TIMEOUT, _settle, _up
from durable.errors import EmbeddedServerError

if TYPE_CHECKING:
    import pwd

_LOG_FILE = "server.log"
_LOG_ROTATE_BYTES = 10 * 1024 * 1024


def _log_size(log: Path) -> int:
    try:
        return log.lstat().st_size
    except OSError:
        return 0


def _log_tail(log: Path, since: int = 0, lines: int = 40) -> str:
    """The last `lines` lines written after byte `since`: this attempt's, not old runs'.

    Not through a symlink (the log is in the server's account's directory, and its tail
    goes into our error message)."""
    try:
        fd = os.open(log, os.O_RDONLY | _NO_TRICKS)
    except OSError:
        return "(no server log)"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "(no server log)"
        f.seek(since)
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:]) or "(nothing logged)"


def _refused(port: int, data_dir: Path) -> EmbeddedServerError:
    return EmbeddedServerError(
        f"a PostgreSQL server answers on 127.0.0.1:{port}, the port of {data_dir}, but refuses "
        f"the password in {data_dir / _PASSFILE}: if it is this data directory's server, stop "
        f"it (`pg_ctl stop -D {data_dir}` as the directory's owner) and delete that file to "
        f"have a new password set at the next start; if not, stop it, or delete "
        f"{data_dir / _PORT_FILE} to pick a new port (the URL will change)"
    )


def _start(data_dir: Path, port: int, user: pwd.struct_passwd | None) -> None:
    log = data_dir / _LOG_FILE
    with contextlib.suppress(OSError):
        if log.lstat().st_size > _LOG_ROTATE_BYTES:  # keep one old log, not an ever-growing one
            log.replace(data_dir / f"{_LOG_FILE}.1")
    sockets = str(_socket_dir(data_dir)).replace('"', '""')
    # pg_ctl hands -o to /bin/sh, so each argument is shell-quoted; the socket directory is
    # also double-quoted for PostgreSQL's own list syntax (a path may hold a comma).
    options = shlex.join(
        [
            "-p",
            str(port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f'unix_socket_directories="{sockets}"',
            "-c",
            "max_connections=200",
            "-c",
            "shared_buffers=128MB",
        ]
    )
    cmd = [
        str(_bin_dir(_pg_version(data_dir), user) / "pg_ctl"),
        "start",
        "-D",
        str(data_dir),
        "-l",
        str(log),
        "-o",
        options,
        "-w",
        "-t",
        str(_START_TIMEOUT),
    ]
    deadline = time.monotonic() + _LEFTOVER_WAIT
    while True:
        since = _log_size(log)
        try:
            _run(cmd, user, timeout=_START_TIMEOUT + 30)
            break
        except EmbeddedServerError as exc:
            tail = _log_tail(log, since)
            leftover = any(sign in tail for sign in _LEFTOVER_SIGNS)
            if leftover and time.monotonic() < deadline:
                time.sleep(0.5)  # a killed server's processes are still on their way out
                continue
            hint = ""
            if "Address already in use" in tail:
                hint = (
                    f"\nport {port} is taken by another program: stop it, or delete "
                    f"{data_dir / _PORT_FILE} to pick a new port (the URL will change)"
                )
            elif leftover:
                hint = (
                    "\nif no server of this data directory is running any more, delete "
                    f"{data_dir / 'postmaster.pid'} and try again"
                )
            raise EmbeddedServerError(f"{exc}\nserver log ({log}):\n{tail}{hint}") from exc
    state = _settle(port, data_dir)
    if state == "refused":
        raise _refused(port, data_dir)
    if state != "ours":
        raise EmbeddedServerError(
            f"the embedded server started but port {port} answers as {state!r}\n"
            f"server log ({log}):\n{_log_tail(log, since)}"
        )


def _stop(data_dir: Path) -> None:
    """Stop the server of `data_dir`, which the caller has just seen answer as ours (so its
    postmaster.pid names it, not a stranger that reused a dead server's pid)."""
    user = _server_user(data_dir)
    _run(
        [
            str(_bin_dir(_pg_version(data_dir), user) / "pg_ctl"),
            "stop",
            "-D",
            str(data_dir),
            "-m",
            "fast",
            "-w",
            "-t",
            str(_START_TIMEOUT),
        ],
        user,
        timeout=_START_TIMEOUT + 30,
    )


def _locked(data_dir: Path) -> FileLock:
    return FileLock(str(_lock_path(data_dir)), timeout=_LOCK_TIMEOUT)


def ensure_server(data_dir: Path | None = None) -> str:
    """Start (or attach to) the embedded server and return a libpq URL to its `postgres` database.

    Safe to call from many processes at once: they share one server. The first call on a new
    data directory runs initdb (about a second); later calls that find the server up cost one
    connection. The URL names the password file rather than holding the password (see the
    package's docstring): it works for the accounts that can read that file, the server's and
    root.
    """
    data_dir = _resolve(data_dir)
    return _url(_ensure(data_dir), data_dir)


def _ensure(data_dir: Path) -> int:
    """Start (or attach to) the server of `data_dir`, locked down; return its port."""
    _check_path(data_dir)
    port = _up(data_dir)  # the common case: up already, no lock needed
    if port is not None:
        return port
    _package_dir()  # fail with the install hint before creating anything
    user = _server_user(data_dir)
    try:
        _make_parent(data_dir, user)
        with _locked(data_dir):
            # Another process may have started it while we waited for the lock.
            port = _read_port(data_dir)
            if port is not None:
                state = _settle(port, data_dir)
                if state == "ours" and _locked_down(data_dir):
                    return port
                if state == "ours":
                    # Up, but started before its data directory was locked down (by an
                    # older durable that trusted every local user): restart it locked down
                    # rather than leave it open for as long as it runs.
                    _stop(data_dir)
                elif state == "refused":
                    raise _refused(port, data_dir)
                elif state == "other":
                    raise EmbeddedServerError(
                        f"another PostgreSQL server answers on 127.0.0.1:{port}, the port of "
                        f"{data_dir}: stop it, or delete {data_dir / _PORT_FILE} to pick a "
                        "new port (the URL will change)"
                    )
            if not (data_dir / "PG_VERSION").exists():
                _initdb(data_dir, user)
            user = _server_user(data_dir)  # the owner, now that it exists
            port = _read_port(data_dir)
            if port is None:  # a data directory made by hand, or the file was deleted
                port = _free_port()
                _write_private(data_dir / _PORT_FILE, f"{port}\n", user)
            _lock_down(data_dir, user)
            _start(data_dir, port, user)
            return port
    except Timeout:
        raise EmbeddedServerError(
            f"timed out after {_LOCK_TIMEOUT:.0f} s waiting for {_lock_path(data_dir)}, held "
            "by another process starting the server: see its server.log (the lock is an "
            "flock, released the moment that process exits)"
        ) from None
    except OSError as exc:
        raise EmbeddedServerError(
            f"could not prepare the embedded server's files for {data_dir}: {exc}"
        ) from exc


def stop_server(data_dir: Path | None = None) -> bool:
    """Stop the embedded server (fast shutdown); True if it was running and is now stopped.

    False when nothing of ours answers, so it is safe to call unconditionally in clean-up.
    """
    data_dir = _resolve(data_dir)
    port = _read_port(data_dir)
    if port is None:
        return False
    try:
        with _locked(data_dir):
            state = _settle(port, data_dir)
            if state == "refused":
                raise _refused(port, data_dir)
            if state != "ours":
                return False
            _stop(data_dir)
    except Timeout:
        raise EmbeddedServerError(
            f"timed out after {_LOCK_TIMEOUT:.0f} s waiting for {_lock_path(data_dir)}"
        ) from None
    return True
