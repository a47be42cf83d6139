"""The small files the embedded server keeps in its data directory: port, password, pg_hba.

As root the data directory belongs to the server's account, so these files are read and
written without following a symlink, blocking on a FIFO or writing in place; that care lives
here, once, for every file durable keeps there.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from durable.errors import EmbeddedServerError

if TYPE_CHECKING:
    import pwd


_SUPERUSER = "postgres"  # the database role initdb creates; the URL's user
_PORT_FILE = "durable-port"
_PASSFILE = "durable-pgpass"  # the password, in libpq's passfile format
# The raw password, as the first version with passwords kept it; read once, then replaced.
_LEGACY_PASSWORD_FILE = "durable-password"
_HBA_FILE = "pg_hba.conf"
# The whole of pg_hba.conf: the password for everyone, on the socket and on loopback.
_HBA = (
    "# Written by durable at each start of the embedded server: edits are overwritten.\n"
    "# Every connection, on the socket or on loopback, needs the password in durable-pgpass.\n"
    "local all all scram-sha-256\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
    "host all all ::1/128 scram-sha-256\n"
)
_READ_LIMIT = 1 << 16  # the data directory's small files we read (port, password, hba)
# Flags for opening files in the data directory: never through a symlink, never blocking on a
# FIFO. (Windows has neither; the embedded server is refused there before any is needed.)
_NO_TRICKS: int = (
    getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
)


def _read_private(path: Path) -> str | None:
    """The text of a small regular file in the data directory; None if it is missing or not
    a regular file.

    Never through a symlink, and never blocking on a FIFO: as root we read files in a
    directory the server's account owns, and that account must not be able to make us read
    (and then print in an error or a URL) a file of root's, or hang.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NO_TRICKS)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(_READ_LIMIT).decode(errors="replace")


def _write_private(path: Path, text: str, user: pwd.struct_passwd | None) -> None:
    """Replace `path` with a file holding `text`, mode 0600, owned by `user` (the server's
    account) if given.

    Written to a new file (O_EXCL, no symlink followed) and renamed over the old one: the
    server's account owns the directory, and a symlink it planted at `path` must not make
    root write to, chmod or chown the file it points to. The rename also means a reader never
    sees a half-written file.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_TRICKS, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), 0o600)  # whatever the umask
            if user is not None:
                os.fchown(f.fileno(), user.pw_uid, user.pw_gid)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _read_port(data_dir: Path) -> int | None:
    text = _read_private(data_dir / _PORT_FILE)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _pg_version(data_dir: Path) -> str:
    """The major version that made the cluster (its PG_VERSION file)."""
    text = _read_private(data_dir / "PG_VERSION")
    if text is None or not text.strip().isdigit():
        raise EmbeddedServerError(
            f"{data_dir / 'PG_VERSION'} is missing or is not a version number: the data "
            "directory is damaged; move it away (or set DURABLE_DATA_DIR) to start a new one"
        )
    return text.strip()


def _read_password(data_dir: Path) -> str | None:
    """The password in the data directory's passfile (or its older raw file), if any."""
    text = _read_private(data_dir / _PASSFILE)
    for line in (text or "").splitlines():
        fields = line.split(":")  # host:port:database:user:password; ours has no escapes
        if len(fields) == 5 and fields[3] == _SUPERUSER and fields[4]:
            return fields[4]
    legacy = _read_private(data_dir / _LEGACY_PASSWORD_FILE)
    return (legacy or "").strip() or None


def _passfile_line(password: str) -> str:
    return f"*:*:*:{_SUPERUSER}:{password}\n"


def _locked_down(data_dir: Path) -> bool:
    """Whether the data directory is as `_lock_down` leaves it: pg_hba.conf is ours and the
    passfile holds a password, with a mode libpq accepts (it ignores a file others can
    read)."""
    if _read_private(data_dir / _HBA_FILE) != _HBA:
        return False
    password = _read_password(data_dir)
    if password is None or _read_private(data_dir / _PASSFILE) != _passfile_line(password):
        return False
    try:
        mode = (data_dir / _PASSFILE).lstat().st_mode
    except OSError:
        return False
    return not mode & 0o077
