"""What several benchmarks share."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

RESULTS = Path(__file__).resolve().parent / "results"


def wait_for_success(
    conn: psycopg.Connection[Any], n: int, timeout: float, what: str, poll: float = 0.01
) -> None:
    """Poll until `n` workflows are SUCCESS; TimeoutError naming how many were after
    `timeout` seconds (a broken run fails the benchmark instead of hanging it)."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(
            "SELECT count(*) FROM durable.workflows WHERE status = 'SUCCESS'"
        ).fetchone()
        done = row[0] if row is not None else 0
        if done >= n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: only {done} of {n} workflows finished in {timeout:.0f} s")
        time.sleep(poll)


# -- CPU and statement counts beside wall time ------------------------------------------------
#
# A wall ratio to the floor (a bare INSERT + commit) moves with the disk: the same code is
# 1.4x the floor where a commit costs 0.27 ms and 2.5x where it costs 0.10 ms. CPU seconds
# and statement counts do not: every benchmark reports them beside its ratios.

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu() -> float:
    """CPU seconds of the calling thread (user + system)."""
    return time.thread_time()


def process_cpu() -> float:
    """CPU seconds of this process, all its threads (user + system)."""
    return time.process_time()


def pid_cpu(pid: int) -> float | None:
    """CPU seconds of a local process: its run time from /proc/<pid>/schedstat (in ns), else
    utime + stime from /proc/<pid>/stat (in clock ticks, 10 ms); None where there is no such
    process or no /proc (a remote server: its CPU is not measured). For a PostgreSQL backend
    this is the server's work on its connection's statements."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: the fields after it start past its ")".
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def backend_pid(conn: psycopg.Connection[Any]) -> int:
    """The server process serving this connection."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def server_is_local(conn: psycopg.Connection[Any]) -> bool:
    """Whether this connection's backend is a process of this machine (its CPU readable)."""
    return pid_cpu(backend_pid(conn)) is not None


def database_backends(
    conn: psycopg.Connection[Any], dbname: str, exclude: Sequence[int] = ()
) -> list[int]:
    """The pids of the backends connected to `dbname`, except `conn`'s own and `exclude`."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        " AND pid <> ALL(%s)",
        [dbname, list(exclude)],
    ).fetchall()
    return [int(r[0]) for r in rows]


def cpu_snapshot(backends: Sequence[int] = ()) -> tuple[float, float, float | None]:
    """(this thread's CPU s, this process's CPU s, the given backends' CPU s summed: None
    if one is not a process of this machine)."""
    server: float | None = 0.0
    for pid in backends:
        cpu = pid_cpu(pid)
        server = None if cpu is None or server is None else server + cpu
    return time.thread_time(), time.process_time(), server


def cpu_per(
    before: tuple[float, float, float | None], after: tuple[float, float, float | None], n: int
) -> dict[str, float | None]:
    """CPU µs per operation between two cpu_snapshot()s over `n` operations: the measuring
    thread's (`thread_cpu_us`), the whole client process's (`process_cpu_us`) and the
    server's (`server_cpu_us`, its backends' utime + stime; None if not local)."""
    tb, pb, sb = before
    ta, pa, sa = after
    return {
        "thread_cpu_us": (ta - tb) / n * 1e6,
        "process_cpu_us": (pa - pb) / n * 1e6,
        "server_cpu_us": None if sa is None or sb is None else (sa - sb) / n * 1e6,
    }


def add_output_args(parser: argparse.ArgumentParser, name: str) -> None:
    """--out PATH / --save: where the results go. By default a run writes no file, so it
    never overwrites the committed results in benchmarks/results/ unless asked to."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--out",
        "--json",
        dest="out",
        type=Path,
        default=None,
        help="write the results (JSON) to this file",
    )
    group.add_argument(
        "--save",
        dest="out",
        action="store_const",
        const=RESULTS / f"{name}.json",
        help=f"write them to benchmarks/results/{name}.json (the committed results)",
    )


def write_results(path: Path | None, results: Any) -> None:
    """Write the results to `path` (nothing when None: see add_output_args)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n", "utf-8")


class CPUSampler:
    """Reads the CPU of a changing set of local processes every `interval` seconds on a
    thread of its own, so the CPU they used over a window known only afterwards (say, from
    the server's timestamps of a run's first and last workflow) can be read back:
    `used(t0, t1)`, interpolated between samples (wall clock: `time.time()`).

    `pids()` names the processes at each tick (worker processes, or a database's backends);
    a process first seen after t0 counts from zero, one gone before t1 up to its last
    sample."""

    def __init__(self, pids: Callable[[], Sequence[int]], interval: float = 0.05) -> None:
        self._pids = pids
        self._interval = interval
        self._series: dict[int, list[tuple[float, float]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-sampler")

    def __enter__(self) -> CPUSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        for pid in self._pids():
            cpu = pid_cpu(pid)
            if cpu is not None:  # (None: gone, or not on this machine)
                self._series.setdefault(pid, []).append((time.time(), cpu))

    def used(self, t0: float, t1: float) -> float | None:
        """CPU seconds the processes used from t0 to t1 (None: not local processes)."""
        if not self._series:
            return None
        return sum(_at(s, t1) - _at(s, t0) for s in self._series.values())


def _at(series: list[tuple[float, float]], t: float) -> float:
    """A process's CPU seconds at time t, interpolated (0 before it was first seen)."""
    if t < series[0][0]:
        return 0.0
    for (ta, ca), (tb, cb) in itertools.pairwise(series):
        if ta <= t <= tb:
            return ca + (cb - ca) * ((t - ta) / (tb - ta) if tb > ta else 1.0)
    return series[-1][1]


class ServerCPU:
    """The CPU of the server's backends serving one database, or one application_name (the
    sessions of the measured code), read from /proc: `read()` now, `spent(before, after)`
    between two reads (a backend that connected in between counts from zero)."""

    def __init__(
        self,
        observer: psycopg.Connection[Any],
        dbname: str | None = None,
        application_name: str | None = None,
    ) -> None:
        self._observer = observer
        self._dbname = dbname
        self._app = application_name

    def read(self) -> dict[int, float]:
        rows = self._observer.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
            " AND (%(db)s::text IS NULL OR datname = %(db)s)"
            " AND (%(app)s::text IS NULL OR application_name = %(app)s)",
            {"db": self._dbname, "app": self._app},
        ).fetchall()
        now = {int(r[0]): pid_cpu(int(r[0])) for r in rows}
        return {pid: cpu for pid, cpu in now.items() if cpu is not None}

    @staticmethod
    def spent(before: dict[int, float], after: dict[int, float]) -> float | None:
        """CPU seconds between two reads; None if no backend was readable (not local)."""
        if not after:
            return None
        return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def database_commits(admin: psycopg.Connection[Any], dbname: str, timeout: float = 15.0) -> int:
    """pg_stat_database.xact_commit of `dbname`, read once its backends have exited (a
    backend flushes its statistics as it exits): call it after closing its connections."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and database_backends(admin, dbname):
        time.sleep(0.05)
    time.sleep(0.2)
    admin.execute("SELECT pg_stat_clear_snapshot()")
    row = admin.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [dbname]
    ).fetchone()
    return int(row[0]) if row is not None else 0
