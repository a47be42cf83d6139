"""Making a cluster and locking it down: initdb, its port, its password and pg_hba.conf.

Everything here runs on a stopped cluster (initdb, single-user mode), before the server
ever listens, so that it never trusts anyone; starting and stopping it is the server
module's business.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import random
import secrets
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from durable._embedded.binaries import _LEFTOVER_SIGNS, _LEFTOVER_WAIT, _bin_dir, _run
from durable._embedded.files import (
    _HBA,
    _HBA_FILE,
    _LEGACY_PASSWORD_FILE,
    _PASSFILE,
    _PORT_FILE,
    _SUPERUSER,
    _locked_down,
    _passfile_line,
    _pg_version,
    _read_password,
    _write_private,
)
from durable.errors import EmbeddedServerError

if TYPE_CHECKING:
    import pwd

_SCRAM_ITERATIONS = 4096  # PostgreSQL's default scram_iterations
# Ports are picked below the ephemeral ranges (Linux 32768+, macOS/Windows 49152+), so that a
# client's outgoing connection is unlikely to hold our port when the server restarts.
_PORT_RANGE = (20000, 32767)


def _free_port() -> int:
    def free(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    rng = random.SystemRandom()
    for _ in range(50):
        port = rng.randint(*_PORT_RANGE)
        if free(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scram_verifier(password: str) -> str:
    """What PostgreSQL stores for `password` (SCRAM-SHA-256, RFC 5802 / 7677).

    Computed here and sent instead of the password, so that the password never reaches the
    server (nor its log, nor the error message of a failed statement). The password is hex,
    which SASLprep leaves as it is.
    """
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, _SCRAM_ITERATIONS)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${_SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def _single_user(data_dir: Path, user: pwd.struct_passwd | None, statement: str) -> None:
    """Run one statement on the stopped cluster in single-user mode: no server, no socket,
    no port, so nothing can connect while it runs."""
    cmd = [
        str(_bin_dir(_pg_version(data_dir), user) / "postgres"),
        "--single",
        "-D",
        str(data_dir),
        "-c",
        "exit_on_error=on",
        "postgres",
    ]
    deadline = time.monotonic() + _LEFTOVER_WAIT
    while True:
        try:
            _run(cmd, user, stdin=statement + "\n", secret=statement)
            return
        except EmbeddedServerError as exc:
            # A killed server's processes may still hold the data directory for a moment.
            if not any(s in str(exc) for s in _LEFTOVER_SIGNS) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _lock_down(data_dir: Path, user: pwd.struct_passwd | None) -> None:
    """Make the stopped cluster let in only holders of the password, whatever it let in
    before.

    A cluster without a password (made by initdb just now, or when the server trusted every
    local user) gets a new one, set in single-user mode before the server ever listens. Then
    the passfile and pg_hba.conf are (re)written if they are not as we write them. The order
    makes a crash harmless: the password is set before the passfile that names it exists,
    and a cluster without a passfile simply gets another password at its next start.
    """
    password = _read_password(data_dir)
    if password is None:
        password = secrets.token_hex(24)
        verifier = _scram_verifier(password)
        _single_user(data_dir, user, f"ALTER ROLE {_SUPERUSER} PASSWORD '{verifier}'")
    if not _locked_down(data_dir):
        _write_private(data_dir / _PASSFILE, _passfile_line(password), user)
        _write_private(data_dir / _HBA_FILE, _HBA, user)
    with contextlib.suppress(FileNotFoundError):  # one copy of the password is enough
        (data_dir / _LEGACY_PASSWORD_FILE).unlink()


def _initdb(data_dir: Path, user: pwd.struct_passwd | None) -> None:
    """Make a new cluster in a scratch directory, lock it down, then rename it into place.

    The rename makes a half-made cluster (initdb killed, disk full) impossible to mistake for
    a real one: the data directory either holds a finished cluster with its port file and
    password or does not exist (or is the empty directory the caller made, which rename(2)
    replaces). initdb is told to reject every connection until `_lock_down` has written ours,
    and gets no password file: the password is set afterwards, in single-user mode.
    """
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise EmbeddedServerError(
            f"{data_dir} exists but is not a PostgreSQL data directory (no PG_VERSION): "
            "move it away, or set DURABLE_DATA_DIR to another directory"
        )
    scratch = data_dir.parent / f".{data_dir.name}.initdb"
    shutil.rmtree(scratch, ignore_errors=True)  # left by an attempt that died
    scratch.mkdir(mode=0o700)
    try:
        if user is not None:
            os.chown(scratch, user.pw_uid, user.pw_gid)
        _run(
            [
                str(_bin_dir(None, user) / "initdb"),
                "-D",
                str(scratch),
                "-U",
                _SUPERUSER,
                "--auth=reject",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ],
            user,
        )
        _write_private(scratch / _PORT_FILE, f"{_free_port()}\n", user)
        _lock_down(scratch, user)
        scratch.rename(data_dir)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
