"""A PostgreSQL server of a test's own: initdb in a temporary directory, on a free port.

For a test that restarts or stops its server: the shared one on 127.0.0.1:5432 serves
every other test running beside it (pytest-xdist's processes, or another suite), which a
restart would cut off.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.citus import _free_ports, pg_bindir

SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "max_connections": "100",
    "shared_buffers": "'32MB'",
    "fsync": "off",
    "full_page_writes": "off",
    "log_min_messages": "warning",
}


def available() -> bool:
    """Whether PostgreSQL's server binaries are here."""
    return pg_bindir() is not None


@dataclass
class PrivateServer:
    base: Path
    port: int
    user: str | None

    @property
    def pgdata(self) -> Path:
        return self.base / "data"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def run(self, *args: str) -> None:
        bindir = pg_bindir()
        assert bindir is not None
        cmd = [str(bindir / args[0]), *args[1:]]
        if self.user is not None:  # PostgreSQL refuses to run as root
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        env = {
            "PATH": f"{bindir}:/usr/bin:/bin:/usr/sbin:/sbin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }
        done = subprocess.run(cmd, env=env, capture_output=True, cwd=self.base, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({done.returncode}): "
                f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}"
            )

    def pg_ctl(self, action: str, *args: str) -> None:
        log = str(self.base / "server.log")
        self.run("pg_ctl", action, "-w", "-t", "60", "-D", str(self.pgdata), "-l", log, *args)

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextmanager
def private_server() -> Iterator[PrivateServer]:
    """A running server of its own, stopped and removed on exit."""
    assert available(), "no PostgreSQL server binaries under /usr/lib/postgresql"
    base = Path(tempfile.mkdtemp(prefix="durable-private-pg-"))
    user = "postgres" if os.geteuid() == 0 else None
    if user is not None:
        os.chown(base, pwd.getpwnam(user).pw_uid, -1)
    server = PrivateServer(base, _free_ports(1)[0], user)
    try:
        server.run(
            "initdb", "-D", str(server.pgdata), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", "--locale=C.UTF-8", "--no-sync",
        )  # fmt: skip
        with open(server.pgdata / "postgresql.auto.conf", "a") as conf:
            for name, value in {**SETTINGS, "port": str(server.port)}.items():
                conf.write(f"{name} = {value}\n")
        server.pg_ctl("start")
        yield server
    finally:
        if (server.pgdata / "postmaster.pid").exists():
            try:
                server.pg_ctl("stop", "-m", "immediate")
            except RuntimeError:
                pass
        shutil.rmtree(base, ignore_errors=True)
