"""A real Citus cluster on loopback: a coordinator and two workers, for distributed tests.

Citus has no Debian package here; `bash ../shared/citus/build.sh` builds it from source and
installs it into the local PostgreSQL (CI does so in .ci/run). A cluster is then three
ordinary PostgreSQL servers, each an `initdb` data directory with
`shared_preload_libraries = 'citus'` on a port of its own, started with `pg_ctl` (as the
`postgres` account when the tests run as root, since PostgreSQL refuses root).

Citus keeps its metadata (which nodes, which shards where) per database. A database the
cluster serves therefore exists on every node with the extension in each, and the
coordinator's copy is told its workers (`citus_add_node`, which also copies the metadata
to the workers): `create_database()` does all of that, so that each test gets a cluster
database of its own, bare (no durable schema) for the tests that migrate it themselves.

Each node runs in its own process group; `kill_worker()` SIGKILLs a worker's postmaster
(the machine is gone, as far as anyone can tell) and `start_worker()` brings it back on the
same port and data directory.
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
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

BUILD = "bash ../shared/citus/build.sh"

# Settings of every node. Small: three servers share a 2-core machine with other suites.
# fsync is off (a SIGKILLed postmaster loses nothing that was written; only a machine
# crash would); max_prepared_transactions lets Citus commit multi-shard writes in two
# phases.
SETTINGS = {
    "shared_preload_libraries": "'citus'",
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "200",
    "max_prepared_transactions": "200",
    # Citus runs a maintenance worker per database that has the extension.
    "max_worker_processes": "32",
    "shared_buffers": "'64MB'",
    "fsync": "off",
    "full_page_writes": "off",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] %d '",
}


# What only a Citus node needs: a plain server (`plain_coordinator`) starts without them.
CITUS_ONLY = ("shared_preload_libraries", "max_prepared_transactions", "max_worker_processes")


class Unavailable(Exception):
    """Citus is not installed for the local PostgreSQL."""


def pg_bindir() -> Path | None:
    """The newest PostgreSQL's bin directory, or None."""
    root = Path("/usr/lib/postgresql")
    if not root.is_dir():
        return None
    versions = sorted(
        (p for p in root.iterdir() if (p / "bin" / "pg_ctl").exists()),
        key=lambda p: int(p.name) if p.name.isdigit() else 0,
    )
    return versions[-1] / "bin" if versions else None


def ensure_installed() -> None:
    """Raise Unavailable (saying how to install it) unless citus.so and its extension files
    are installed for the newest local PostgreSQL."""
    bindir = pg_bindir()
    if bindir is None:
        raise Unavailable("no PostgreSQL server binaries under /usr/lib/postgresql")
    version = bindir.parent.name
    lib = bindir.parent / "lib" / "citus.so"
    control = Path(f"/usr/share/postgresql/{version}/extension/citus.control")
    if not (lib.exists() and control.exists()):
        raise Unavailable(f"Citus is not installed for PostgreSQL {version}: run `{BUILD}`")


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


def with_dbname(url: str, dbname: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = dbname
    return psycopg.conninfo.make_conninfo("", **{k: str(v) for k, v in info.items()})


@dataclass
class Node:
    name: str
    port: int
    pgdata: Path
    killed: bool = False

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"


@dataclass
class CitusCluster:
    """A coordinator and `n_workers` workers under `base`."""

    base: Path
    n_workers: int = 2
    # Shards per distributed table in the databases this cluster makes (Citus's default
    # is 32). Fewer make a database quicker to distribute; statements route the same way.
    shard_count: int = 4
    # The coordinator starts as a plain PostgreSQL server (no Citus loaded, joined to no
    # one): the one server a deployment outgrows, made the coordinator later, as
    # docs/scaling.md's runbook says (`restart_node` after setting the preload).
    plain_coordinator: bool = False
    coordinator: Node | None = None
    workers: list[Node] = field(default_factory=list)
    _user: str | None = None
    _created: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[Node]:
        assert self.coordinator is not None
        return [self.coordinator, *self.workers]

    @property
    def admin_url(self) -> str:
        assert self.coordinator is not None
        return self.coordinator.url()

    # -- processes ------------------------------------------------------------------------

    def _run(self, *args: str) -> None:
        bindir = pg_bindir()
        assert bindir is not None
        cmd = [str(bindir / args[0]), *args[1:]]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        env = {
            "PATH": f"{bindir}:/usr/bin:/bin:/usr/sbin:/sbin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }
        done = subprocess.run(cmd, env=env, capture_output=True, cwd=self.base)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({done.returncode}): "
                f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}"
            )

    def _start_node(self, node: Node) -> None:
        self._run(
            "pg_ctl", "start", "-w", "-t", "60", "-D", str(node.pgdata),
            "-l", str(self.base / f"{node.name}.log"),
        )  # fmt: skip
        node.killed = False

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            self._user = "postgres"
            os.chown(self.base, pwd.getpwnam("postgres").pw_uid, -1)
        ports = _free_ports(1 + self.n_workers)
        names = ["coordinator", *(f"worker{i}" for i in range(1, self.n_workers + 1))]
        nodes = [
            Node(name, port, self.base / name) for name, port in zip(names, ports, strict=True)
        ]
        self.coordinator, self.workers = nodes[0], nodes[1:]
        for node in nodes:
            self._run(
                "initdb", "-D", str(node.pgdata), "-U", "postgres", "--auth=trust",
                "-E", "UTF8", "--locale=C.UTF-8", "--no-sync",
            )  # fmt: skip
            settings = {**SETTINGS, "port": str(node.port), "unix_socket_directories": "''"}
            if self.plain_coordinator and node is self.coordinator:
                settings = {k: v for k, v in settings.items() if k not in CITUS_ONLY}
            with open(node.pgdata / "postgresql.auto.conf", "a") as conf:
                for name, value in settings.items():
                    conf.write(f"{name} = {value}\n")
            self._start_node(node)
        if not self.plain_coordinator:
            self._join("postgres")

    def _join(self, dbname: str) -> None:
        """Create the extension on every node's `dbname` and add the workers to it."""
        for node in self.nodes:
            with psycopg.connect(node.url(dbname), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
        assert self.coordinator is not None
        with psycopg.connect(self.coordinator.url(dbname), autocommit=True) as conn:
            conn.execute(
                "SELECT citus_set_coordinator_host('127.0.0.1', %s)", [self.coordinator.port]
            )
            for worker in self.workers:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", [worker.port])

    def restart_node(self, node: Node) -> None:
        """Restart `node` (a fast shutdown: its sessions are cut), e.g. to load a changed
        `shared_preload_libraries`."""
        self._run(
            "pg_ctl", "restart", "-w", "-t", "60", "-m", "fast", "-D", str(node.pgdata),
            "-l", str(self.base / f"{node.name}.log"),
        )  # fmt: skip

    def kill_worker(self, index: int) -> Node:
        """SIGKILL worker `index`'s postmaster (its backends die with it)."""
        node = self.workers[index]
        pid_file = node.pgdata / "postmaster.pid"
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        node.killed = True
        return node

    def freeze_worker(self, index: int) -> list[int]:
        """SIGSTOP worker `index`'s postmaster and every process of it (a hung host: its
        connections stay open, nothing answers); returns their pids for thaw_worker."""
        node = self.workers[index]
        master = int((node.pgdata / "postmaster.pid").read_text().split()[0])
        found = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True)
        pids = [master, *(int(p) for p in found.stdout.split())]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    @staticmethod
    def thaw_worker(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def start_worker(self, index: int) -> Node:
        """Start worker `index` again (after kill_worker), on its port and data directory."""
        node = self.workers[index]
        # The killed postmaster's children exit on their own once they see it gone; the
        # new one starts when the old shared memory is released.
        deadline = time.monotonic() + 60
        while True:
            try:
                self._start_node(node)
                return node
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        for node in self.nodes if self.coordinator is not None else []:
            if (node.pgdata / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError):
                    self._run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", str(node.pgdata))

    # -- databases ------------------------------------------------------------------------

    def create_database(self, prefix: str = "durable_citus") -> str:
        """A new database on every node, joined into the cluster; returns the coordinator's
        URL of it. No durable schema: the caller migrates (and distributes) it."""
        name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        for node in self.nodes:
            with psycopg.connect(node.url(), autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._created.append(name)
        assert self.coordinator is not None
        with psycopg.connect(self.coordinator.url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET citus.shard_count = {}").format(
                    sql.Identifier(name), sql.Literal(self.shard_count)
                )
            )
        self._join(name)
        return self.coordinator.url(name)

    def drop_database(self, url: str) -> None:
        name = str(psycopg.conninfo.conninfo_to_dict(url).get("dbname"))
        for node in self.nodes:
            if node.killed:
                continue
            with (
                contextlib.suppress(psycopg.OperationalError),
                psycopg.connect(node.url(), autocommit=True, connect_timeout=5) as conn,
            ):
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        with contextlib.suppress(ValueError):
            self._created.remove(name)

    def worker_of(self, url: str, table: str, key: str) -> int:
        """Which worker (index into `workers`) holds the shard of `table` where `key` lives."""
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT nodeport FROM pg_dist_shard_placement"
                " WHERE shardid = get_shard_id_for_distribution_column(%s, %s)",
                [table, key],
            ).fetchone()
        assert row is not None
        return next(i for i, w in enumerate(self.workers) if w.port == row[0])


@contextlib.contextmanager
def citus_cluster(**options: Any) -> Iterator[CitusCluster]:
    """Start a cluster in a temporary directory; stop and remove it after (set
    DURABLE_KEEP_CITUS to keep its data directories and logs)."""
    base = Path(tempfile.mkdtemp(prefix="durable-citus-"))
    cluster = CitusCluster(base, **options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if os.environ.get("DURABLE_KEEP_CITUS") is None:
            shutil.rmtree(base, ignore_errors=True)
