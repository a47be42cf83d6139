"""`durable worker --metrics-port`: real worker processes serve Prometheus metrics and
health checks over HTTP. The families are there, the counts move as workflows run, a
recovery after a SIGKILL shows on the worker that took over, and a worker without the
metrics extra refuses the option with the pip install to run."""

from __future__ import annotations

import http.client
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

pytest.importorskip("prometheus_client", reason="pip install 'durable-pg[metrics]'")
from prometheus_client.parser import text_string_to_metric_families

from tests.acceptance.workers import client, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def _up(port: int) -> bool:
    try:
        return _get(port, "/healthz")[0] == 200
    except OSError:
        return False


def _scrape(port: int) -> tuple[set[str], Samples]:
    """The families served and every sample, keyed by name and labels."""
    status, text = _get(port, "/metrics")
    assert status == 200
    families: set[str] = set()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return families, samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


FAMILIES = {
    "durable_workflows",
    "durable_workflows_lease_expired",
    "durable_queue_depth",
    "durable_queue_oldest_wait_seconds",
    "durable_executor_heartbeat_age_seconds",
    "durable_step_duration_seconds",
    "durable_step_retries",
    "durable_budget_spent_dollars",
    "durable_recoveries",
    "durable_dead_letters",
    "durable_workflows_finished",
    "durable_lease_takeovers",
    "durable_database_outages",
}


def test_worker_serves_metrics_and_health(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    port = _free_port()
    with client(database_url) as engine:
        handles = [
            engine.submit(counter_app.three_steps, f"m{i}", workflow_id=f"m{i}") for i in range(3)
        ]
        slow = engine.submit(counter_app.slow, "ms", 4, 0.3, workflow_id="ms")
        worker = start_worker(subprocess_env, database_url, extra=["--metrics-port", str(port)])
        try:
            wait_for(lambda: _up(port), what="the worker's /healthz")
            wait_for(lambda: len(world(database_url, "ms")) >= 1, what="the slow workflow's step")
            # While it works: every family is served, and steps have been measured (a step
            # is measured once its record is written, a moment after its body ran).
            wait_for(
                lambda: (
                    _value(
                        _scrape(port)[1],
                        "durable_step_duration_seconds_count",
                        step="counter.slow_step",
                    )
                    >= 1
                ),
                what="a measured step",
            )
            families, during = _scrape(port)
            assert FAMILIES <= families, FAMILIES - families
            steps_during = _value(
                during, "durable_step_duration_seconds_count", step="counter.slow_step"
            )
            assert steps_during >= 1
            assert _get(port, "/readyz") == (200, "ok\n")
            for h in handles:
                h.result(timeout=60)
            slow.result(timeout=60)
            # An outcome is counted by the worker once it is written: a reader may see it
            # first.
            wait_for(
                lambda: (
                    _value(
                        _scrape(port)[1],
                        "durable_workflows_finished_total",
                        status="SUCCESS",
                        workflow="counter.slow",
                    )
                    == 1
                ),
                what="the slow workflow counted",
            )
            _, after = _scrape(port)
        finally:
            assert stop_worker(worker) == 0
    # Finished workflows are counted by the worker that finished them (a scrape reads no
    # finished row of the database).
    finished = "durable_workflows_finished_total"
    assert _value(after, finished, status="SUCCESS", workflow="counter.three_steps") == 3
    assert _value(after, finished, status="SUCCESS", workflow="counter.slow") == 1
    assert _value(after, "durable_workflows", status="SUCCESS") == 0
    assert _value(after, "durable_workflows", status="RUNNING") == 0
    assert (
        _value(after, "durable_step_duration_seconds_count", step="counter.slow_step")
        > steps_during
    )
    assert _value(after, "durable_step_duration_seconds_count", step="counter.step") == 9
    assert _value(after, "durable_executor_heartbeat_age_seconds") >= 0


def test_recovery_after_a_kill_shows_on_the_worker_that_took_over(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    first_port, second_port = _free_port(), _free_port()
    with client(database_url) as engine:
        handle = engine.submit(counter_app.slow, "mk", 6, 0.3, workflow_id="mk")
        first = start_worker(
            subprocess_env, database_url, lease=30.0, extra=["--metrics-port", str(first_port)]
        )
        wait_for(lambda: len(world(database_url, "mk")) >= 1, what="the first step")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        second = start_worker(
            subprocess_env, database_url, lease=30.0, extra=["--metrics-port", str(second_port)]
        )
        try:
            wait_for(lambda: _up(second_port), what="the second worker's /healthz")
            # Its lease (30 s) has not run out: the second worker, on the same host, sees
            # the first's process gone and takes its workflow back at once.
            assert handle.result(timeout=60) == [f"s{i}" for i in range(6)]
            wait_for(
                lambda: (
                    _value(
                        _scrape(second_port)[1],
                        "durable_workflows_finished_total",
                        status="SUCCESS",
                        workflow="counter.slow",
                    )
                    == 1
                ),
                what="the recovered workflow counted",
            )
            _, samples = _scrape(second_port)
        finally:
            assert stop_worker(second) == 0
    assert _value(samples, "durable_recoveries_total", workflow="counter.slow") == 1
    assert _value(samples, "durable_lease_takeovers_total") == 1
    finished = "durable_workflows_finished_total"
    assert _value(samples, finished, status="SUCCESS", workflow="counter.slow") == 1


def test_metrics_port_without_the_extra_names_the_install(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    # prometheus_client made unimportable in the worker's process, as where it is not
    # installed.
    shadow = tmp_path / "prometheus_client"
    shadow.mkdir()
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'prometheus_client'\", "
        "name='prometheus_client')\n"
    )
    env = dict(subprocess_env)
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    env["DURABLE_DATABASE_URL"] = database_url
    counter_app.setup(database_url)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "durable.cli", "worker", "--app", "tests.apps.counter_app"),
            *("--metrics-port", str(_free_port())),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "pip install 'durable-pg[metrics]'" in done.stderr + done.stdout


def _cut_off(url: str, allow: bool) -> None:
    """Refuse (or allow again) new connections to the test's database, and terminate the
    worker's connections when refusing: the system database is unreachable for it."""
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    admin_url = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allow).lower()}'.encode())
        if not allow:
            admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE datname = %s AND application_name LIKE 'durable%%'",
                [name],
            )


def test_readyz_answers_503_while_the_database_is_unreachable(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    port = _free_port()
    counter_app.setup(database_url)
    worker = start_worker(subprocess_env, database_url, extra=["--metrics-port", str(port)])
    try:
        wait_for(lambda: _up(port) and _get(port, "/readyz")[0] == 200, what="readiness")
        _cut_off(database_url, allow=False)
        try:
            wait_for(lambda: _get(port, "/readyz")[0] == 503, what="/readyz 503")
            assert "database unreachable" in _get(port, "/readyz")[1]
            # Liveness asks nothing of the database: an outage restarts no worker.
            assert _get(port, "/healthz") == (200, "ok\n")
        finally:
            _cut_off(database_url, allow=True)
        wait_for(lambda: _get(port, "/readyz")[0] == 200, what="readiness again")
    finally:
        assert stop_worker(worker) == 0


def _health(port: int, path: str) -> tuple[int, str]:
    try:
        return _get(port, path)
    except OSError:
        return 0, ""


def test_a_worker_waiting_on_a_predecessors_lease_is_alive_not_ready(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    """A worker given an executor id whose row another container (another host key) beat
    for a moment ago watches that heartbeat for up to a lease before taking the id: it is
    starting, so /healthz answers 200 (a liveness probe must not restart it mid-wait) and
    /readyz 503; once it takes the id, both answer ok."""
    first_port, port = _free_port(), _free_port()
    fixed = ["--executor-id", "box"]
    first = start_worker(
        subprocess_env, database_url, extra=[*fixed, "--metrics-port", str(first_port)]
    )
    try:
        wait_for(lambda: _health(first_port, "/readyz")[0] == 200, what="the first worker")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    with psycopg.connect(database_url, autocommit=True) as conn:
        # As if it ran in another container, and beat just now.
        conn.execute(
            "UPDATE durable.executors SET host_key = 'another-container', heartbeat_at = now()"
            " WHERE executor_id = 'box'"
        )
    worker = start_worker(
        subprocess_env, database_url, lease=20.0, extra=[*fixed, "--metrics-port", str(port)]
    )
    try:
        wait_for(lambda: _health(port, "/healthz")[0] != 0, what="the worker's endpoints")
        # Its endpoints listen before it launches: starting from their first answer.
        assert _health(port, "/healthz") == (200, "starting\n")
        assert _health(port, "/readyz") == (503, "starting\n")
        wait_for(lambda: _health(port, "/readyz") == (200, "ok\n"), what="the takeover")
        assert _health(port, "/healthz") == (200, "ok\n")
    finally:
        assert stop_worker(worker) == 0
