"""A database that hangs (connections open, no byte moving: a frozen host, a partition that
drops packets) is treated as one that is down, within the response timeout.

One `durable worker` (A) reaches PostgreSQL through a TCP proxy in a process of its own
(tests/proxy.py); the test SIGSTOPs the proxy while A runs two workflows. A's statements
(its heartbeat's renewal, its run's records) give up within the bound (1 s here): A reports
the outage while the proxy is still frozen, and runs no step past its lease. A second
worker (B), connected directly, takes the workflows over once their leases lapse and
finishes them, the proxy still frozen: every step ran, all of A's before any of B's, and
only the step in flight at the freeze may have run twice. Thawed, A works again: it alone
runs the next workflows to their end. The same for `async def` workflows (their event
loop's pool). Before, A's statements waited for the whole freeze
and it said nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.workers import client, start_worker, stop_worker, wait_for
from tests.apps import hung_app
from tests.apps.counter_app import WORLD_DDL

APP = "tests.apps.hung_app"
STEPS = 30


def _world(url: str) -> list[tuple[int, str, str, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, workflow_id, what, pid FROM world ORDER BY id").fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def _statuses(url: str, ids: list[str]) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT status FROM durable.workflows WHERE workflow_id = ANY(%s)", [ids]
        ).fetchall()
    return [r[0] for r in rows]


def _through(url: str, port: int) -> str:
    return psycopg.conninfo.make_conninfo(url, host="127.0.0.1", port=str(port))


@dataclass
class Proxy:
    proc: subprocess.Popen[bytes]
    port: int

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def proxy(database_url: str, tmp_path: Path) -> Iterator[Proxy]:
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    port_file = tmp_path / "proxy.port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.proxy",
            str(info.get("host") or "127.0.0.1"),
            str(info.get("port") or 5432),
            str(port_file),
        ],
        cwd=Path(__file__).resolve().parents[2],
    )
    wait_for(port_file.exists, timeout=20, what="the proxy")
    yield Proxy(proc, int(port_file.read_text()))
    os.kill(proc.pid, signal.SIGCONT)
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_hung_database_is_an_outage_within_the_bound(
    kind: str,
    database_url: str,
    subprocess_env: dict[str, str],
    proxy: Proxy,
    tmp_path: Path,
) -> None:
    workflow = hung_app.steps if kind == "sync" else hung_app.steps_async
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(WORLD_DDL)
    env = {**subprocess_env, "HUNG_WORLD_URL": database_url, "DURABLE_RESPONSE_TIMEOUT": "1"}
    log_a = tmp_path / "worker_a.log"
    a = start_worker(
        env, _through(database_url, proxy.port), lease=3.0, concurrency=2, log=str(log_a), app=APP
    )
    b: subprocess.Popen[bytes] | None = None
    frozen = False
    try:
        first = ["H1", "H2"]
        with client(database_url) as engine:
            for w in first:
                engine.submit(workflow, w, STEPS, workflow_id=w)
        wait_for(
            lambda: sum(1 for r in _world(database_url) if r[3] == a.pid) >= 4,
            timeout=60,
            what="worker A to run steps",
        )
        proxy.freeze()
        frozen = True
        b = start_worker(
            env, database_url, lease=3.0, concurrency=2, log=str(tmp_path / "b.log"), app=APP
        )
        # A's statements give up: it says the database is lost while it still hangs.
        wait_for(
            lambda: "lost the system database" in log_a.read_text(errors="replace"),
            timeout=30,
            what="worker A to report the hung database as an outage",
        )
        # B takes the workflows over after their leases and finishes them, A still cut off.
        wait_for(
            lambda: _statuses(database_url, first) == ["SUCCESS", "SUCCESS"],
            timeout=90,
            what="worker B to finish the workflows",
        )
        assert proxy.proc.poll() is None and a.poll() is None
        proxy.thaw()
        frozen = False
        stop_worker(b)
        b = None
        # Thawed, A works again: it alone runs the next ones to their end.
        second = ["H3", "H4"]
        with client(database_url) as engine:
            for w in second:
                engine.submit(workflow, w, 3, workflow_id=w)
        wait_for(
            lambda: _statuses(database_url, second) == ["SUCCESS", "SUCCESS"],
            timeout=90,
            what="worker A to run workflows after the thaw",
        )
    finally:
        if frozen:
            proxy.thaw()
        if b is not None:
            stop_worker(b)
        stop_worker(a)

    world = _world(database_url)
    for w in first:
        rows = [r for r in world if r[1] == w]
        ran = [r[2] for r in rows]
        assert sorted(set(ran)) == sorted(f"s{i}" for i in range(STEPS)), w
        # Only the step in flight when the database hung may have run twice.
        assert len(ran) - len(set(ran)) <= 1, (w, ran)
        # A ran nothing once it could not confirm its lease: its steps all came first.
        by_a = [r[0] for r in rows if r[3] == a.pid]
        by_others = [r[0] for r in rows if r[3] != a.pid]
        assert by_a and by_others, w
        assert max(by_a) < min(by_others), (w, rows)
    assert {r[3] for r in world if r[1] in ("H3", "H4")} == {a.pid}
