"""A real high-availability PostgreSQL pair on loopback, for failover tests.

pg_auto_failover (Debian's `postgresql-15-auto-failover` and `pg-auto-failover-cli`): a
monitor and two nodes, a primary and a synchronous standby, each its own postmaster under
its own `pg_autoctl` supervisor. It was picked over Patroni with etcd because it needs no
separate consensus store and no configuration files: three commands build the pair, its
monitor turns synchronous replication on as soon as the standby has caught up, and it
promotes the standby on its own when the primary stops answering.

Each node runs in its own process group, so `kill_primary()` SIGKILLs the primary's
postmaster together with its supervisor (which would otherwise restart it): the machine
the primary ran on is gone, as far as anyone can tell.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

PACKAGES = ("postgresql-15-auto-failover", "pg-auto-failover-cli")
INSTALL = "apt-get install -y " + " ".join(PACKAGES)

# How fast the monitor notices a dead primary (defaults: 5 s checks, 20 s to unhealthy).
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1000",
    "pgautofailover.health_check_timeout": "2000",
    "pgautofailover.health_check_max_retries": "2",
    "pgautofailover.health_check_retry_delay": "500",
    # A node whose keeper has not reported for this long is unhealthy. Too short and a
    # busy machine makes the *standby* look unhealthy: the monitor then turns synchronous
    # replication off (wait_primary) to keep the primary writable, and a kill in that
    # window loses acknowledged commits, which is what the test is there to catch.
    "pgautofailover.node_considered_unhealthy_timeout": "5000",
    # How long the monitor waits for a lost primary to demote itself before it promotes
    # the standby (default 30 s). The killed primary here cannot answer at all.
    "pgautofailover.primary_demote_timeout": "3000",
}


class Unavailable(Exception):
    """pg_auto_failover is not installed and cannot be installed here."""


def _pg_bindir() -> str | None:
    root = Path("/usr/lib/postgresql")
    if not root.is_dir():
        return None
    versions = sorted((p for p in root.iterdir() if (p / "bin" / "pg_ctl").exists()), key=str)
    return str(versions[-1] / "bin") if versions else None


def ensure_installed() -> None:
    """Find pg_autoctl; under CI=true install it with apt-get, else raise Unavailable with
    the command that installs it."""
    if shutil.which("pg_autoctl") and _pg_bindir():
        return
    if os.environ.get("CI") == "true" and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False, capture_output=True)
        done = subprocess.run(
            ["apt-get", "install", "-y", "-q", *PACKAGES], env=env, capture_output=True
        )
        if done.returncode == 0 and shutil.which("pg_autoctl"):
            return
        raise Unavailable(f"`{INSTALL}` failed: {done.stderr.decode(errors='replace')[-500:]}")
    raise Unavailable(f"needs pg_auto_failover: `sudo {INSTALL}`")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Node:
    name: str
    port: int
    pgdata: Path
    proc: subprocess.Popen[bytes] | None = None
    killed: bool = False


@dataclass
class HACluster:
    """A monitor and two nodes under `base`; `url` names both nodes, read-write wanted."""

    base: Path
    dbname: str = "durable"
    # Settings of both nodes (e.g. Citus's preload): the first node's data directory is
    # made with them before pg_autoctl takes it over, and the standby copies it.
    settings: dict[str, str] = field(default_factory=dict)
    monitor_port: int = 0
    nodes: list[Node] = field(default_factory=list)
    _monitor: subprocess.Popen[bytes] | None = None
    _user: str | None = None

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return (
            f"postgresql://postgres@{hosts}/{self.dbname}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    @property
    def monitor_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.monitor_port}/pg_auto_failover"

    def node_url(self, node: Node, dbname: str | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{node.port}/{dbname or self.dbname}"

    # -- processes ------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        bindir = _pg_bindir()
        assert bindir is not None
        return {
            "PATH": f"{bindir}:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(self.base),
            "XDG_CONFIG_HOME": str(self.base / "config"),
            "XDG_DATA_HOME": str(self.base / "data"),
            "XDG_RUNTIME_DIR": str(self.base / "run"),
            "PG_AUTOCTL_DEBUG": "0",
            # UTF-8 databases, as a production cluster has (initdb follows the locale).
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen[bytes]:
        cmd = ["pg_autoctl", *args]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        # A process group of its own per node: kill_primary() takes the whole node down.
        with open(self.base / log, "ab") as out:
            return subprocess.Popen(
                cmd,
                env=self._env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base,
                start_new_session=True,
            )

    def _autoctl(self, *args: str) -> str:
        cmd = ["pg_autoctl", *args]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        done = subprocess.run(cmd, env=self._env(), capture_output=True, cwd=self.base)
        return done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")

    def start(self, timeout: float = 120.0) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        for sub in ("config", "data", "run"):
            (self.base / sub).mkdir(exist_ok=True)
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            self._user = "postgres"
            uid = pwd.getpwnam("postgres").pw_uid
            for path in [self.base, *self.base.rglob("*")]:
                os.chown(path, uid, -1)
        self.monitor_port, p1, p2 = _free_ports(3)
        self._monitor = self._spawn(
            [
                "create", "monitor", "--pgdata", str(self.base / "monitor"),
                "--pgport", str(self.monitor_port), "--hostname", "127.0.0.1",
                "--auth", "trust", "--no-ssl", "--run",
            ],
            "monitor.log",
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        self._wait(lambda: self._monitor_ready(), deadline, "the monitor")
        with psycopg.connect(self.monitor_url, autocommit=True) as conn:
            for name, value in MONITOR_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {value}")
            conn.execute("SELECT pg_reload_conf()")
        monitor = (
            f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover"
            "?sslmode=disable"
        )
        for name, port in (("node1", p1), ("node2", p2)):
            node = Node(name, port, self.base / name)
            if name == "node1" and self.settings:
                self._initdb(node.pgdata)
            node.proc = self._spawn(
                [
                    "create", "postgres", "--pgdata", str(node.pgdata),
                    "--pgport", str(port), "--hostname", "127.0.0.1", "--name", name,
                    "--auth", "trust", "--no-ssl", "--dbname", self.dbname,
                    "--monitor", monitor, "--run",
                ],
                f"{name}.log",
            )  # fmt: skip
            self.nodes.append(node)
            if name == "node1":
                self._wait(lambda: self._states().get("node1") == "single", deadline, "node1")
        # The standby's base backup waits for a checkpoint on the primary: ask for one.
        self._wait(self._settled, deadline, "a primary and a synchronous secondary")
        self._wait(self._sync_on, deadline, "synchronous replication")

    def _initdb(self, pgdata: Path) -> None:
        cmd = [
            "initdb", "-D", str(pgdata), "-U", "postgres", "--auth=trust", "-E", "UTF8",
            "--locale=C.UTF-8", "--no-sync",
        ]  # fmt: skip
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        subprocess.run(cmd, env=self._env(), capture_output=True, cwd=self.base, check=True)
        with open(pgdata / "postgresql.auto.conf", "a") as conf:
            for name, value in self.settings.items():
                conf.write(f"{name} = {value}\n")

    def _wait(self, ready: object, deadline: float, what: str) -> None:
        assert callable(ready)
        last: Exception | None = None
        while True:
            try:
                if ready():
                    return
            except psycopg.Error as exc:
                last = exc
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"pg_auto_failover: {what} not ready; state:\n{self.show_state()}\n"
                    f"last error: {last}; logs under {self.base}"
                )
            time.sleep(0.3)

    def _monitor_ready(self) -> bool:
        with psycopg.connect(self.monitor_url, connect_timeout=2) as conn:
            conn.execute("SELECT 1 FROM pgautofailover.node LIMIT 1")
        return True

    def _states(self) -> dict[str, str]:
        with psycopg.connect(self.monitor_url, connect_timeout=2) as conn:
            rows = conn.execute(
                "SELECT nodename, reportedstate::text FROM pgautofailover.node"
            ).fetchall()
        # The monitor's database is SQL_ASCII: psycopg hands its text back as bytes.
        return {_text(name): _text(state) for name, state in rows}

    def _settled(self) -> bool:
        states = self._states()
        if sorted(states.values()) == ["primary", "secondary"]:
            return True
        if "node1" in states and states["node1"] in ("single", "wait_primary"):
            with psycopg.connect(self.node_url(self.nodes[0], "postgres"), autocommit=True) as c:
                c.execute("CHECKPOINT")
        return False

    def _sync_on(self) -> bool:
        with psycopg.connect(self.node_url(self.primary(), "postgres"), connect_timeout=2) as c:
            names = c.execute("SHOW synchronous_standby_names").fetchone()
            rows = c.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')"
            ).fetchone()
        return bool(names and names[0]) and bool(rows and rows[0] == 1)

    def show_state(self) -> str:
        return self._autoctl("show", "state", "--pgdata", str(self.base / "monitor"))

    # -- what a test does ------------------------------------------------------------------

    def primary(self) -> Node:
        states = self._states()
        for node in self.nodes:
            if states.get(node.name) in ("primary", "wait_primary", "single"):
                return node
        raise LookupError(f"no primary: {states}")

    def kill_primary(self) -> Node:
        """SIGKILL the primary's postmaster and its supervisor (so nothing restarts it),
        once commits are seen waiting for the standby."""
        deadline = time.monotonic() + 60
        self._wait(
            lambda: sorted(self._states().values()) == ["primary", "secondary"] and self._sync_on(),
            deadline,
            "synchronous replication before the kill",
        )
        node = self.primary()
        assert node.proc is not None
        pid_file = node.pgdata / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
        os.killpg(node.proc.pid, signal.SIGKILL)
        if postmaster is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(postmaster, signal.SIGKILL)
        node.proc.wait()
        node.killed = True
        return node

    def wait_promoted(self, timeout: float = 120.0) -> Node:
        """Wait until the other node is a writable primary; return it."""
        deadline = time.monotonic() + timeout
        survivor = next(n for n in self.nodes if not n.killed)

        def writable() -> bool:
            with psycopg.connect(self.node_url(survivor, "postgres"), connect_timeout=2) as c:
                row = c.execute("SELECT pg_is_in_recovery()").fetchone()
            return row is not None and row[0] is False

        self._wait(writable, deadline, f"{survivor.name} promoted")
        return survivor

    def stop(self) -> None:
        procs = [n.proc for n in self.nodes if n.proc is not None and not n.killed]
        if self._monitor is not None:
            procs.append(self._monitor)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Postmasters that outlived their supervisor.
        for pgdata in [n.pgdata for n in self.nodes] + [self.base / "monitor"]:
            pid_file = pgdata / "postmaster.pid"
            with contextlib.suppress(Exception):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)


@contextlib.contextmanager
def ha_cluster(**options: Any) -> Iterator[HACluster]:
    base = Path(tempfile.mkdtemp(prefix="durable-ha-"))
    cluster = HACluster(base, **options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if os.environ.get("DURABLE_KEEP_HA") is None:
            shutil.rmtree(base, ignore_errors=True)
