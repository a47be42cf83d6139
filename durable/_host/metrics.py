"""Prometheus metrics and the health endpoints of a worker (`durable worker --metrics-port`),
and the metrics of the console (its /metrics route).

Two kinds of numbers, in one CollectorRegistry owned by whoever serves them (never
prometheus_client's global one):

- What the system database holds, read when Prometheus scrapes: the workflows not
  finished (and the dead-lettered ones) by status and name, queued entries by queue with
  the oldest wait, leases that ran out, each executor's heartbeat age. One grouped
  statement over a partial index of workflows that holds no finished row, and one over
  the executors (queries.sql: metrics_workflows, metrics_executors): a scrape's cost
  follows the live work, not the history kept. Every worker and the console report the
  same numbers, so aggregate them with `max by (...)`. Labels are bounded by the code
  (names, statuses, queues), never by data: a partition key is a caller's value.
- What this process did, counted as it happens: each attempt of a step's code (a
  histogram by step, kind and outcome), retries, budget charged, the outcomes its runs
  wrote (finished workflows by status and name), workflows recovered and dead-lettered
  by its claims; and, read from the engine at scrape time at no cost to the runs,
  workflows taken back from dead executors, database outages, statements sent.

Without the `metrics` extra nothing here is imported by a run: the drivers test one
attribute (`Settings.observe_step`, None) per step attempt.
"""

from __future__ import annotations

import dataclasses
import http.server
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from durable._base.extras import extra
from durable._base.models import WorkflowStatus
from durable.errors import DurableError, EngineNotRunningError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from durable._core import Outcome, StepScope
    from durable._host.engine import Engine
    from durable._io.systemdb import SystemDB

logger = logging.getLogger("durable.worker")

# Step attempts last from a millisecond (a local computation) to minutes (a model's call).
STEP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
)
_DEAD = WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED.value


def new_registry() -> CollectorRegistry:
    """An empty registry of the caller's own (raises MissingExtraError without the extra)."""
    with extra("metrics"):
        from prometheus_client import CollectorRegistry
    return CollectorRegistry(auto_describe=False)


class WorkerMetrics:
    """The metrics of one worker process, in its own registry: attach() it to a launched
    engine before its worker runs; serve() them over HTTP."""

    def __init__(self) -> None:
        self.registry = new_registry()
        from prometheus_client import Counter, Histogram

        r = self.registry
        self.step_seconds = Histogram(
            "durable_step_duration_seconds",
            "Attempts of step (and transaction, tool, effect) code run by this process.",
            ["step", "kind", "outcome"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "durable_step_retries", "Attempts after a step's first, run here.", ["step"], registry=r
        )
        self.dollars = Counter(
            "durable_budget_spent_dollars",
            "Dollars charged (durable.charge) by steps run here.",
            ["step"],
            registry=r,
        )
        self.tokens = Counter(
            "durable_budget_spent_tokens",
            "Tokens charged (durable.charge) by steps run here.",
            ["step"],
            registry=r,
        )
        self.recoveries = Counter(
            "durable_recoveries",
            "Workflows this worker claimed after their run was cut off (a lease ran out or "
            "its executor died).",
            ["workflow"],
            registry=r,
        )
        self.dead_letters = Counter(
            "durable_dead_letters",
            "Workflows this worker's claims set MAX_RECOVERY_ATTEMPTS_EXCEEDED (they crashed "
            "their workers too often).",
            ["workflow"],
            registry=r,
        )
        self.finished = Counter(
            "durable_workflows_finished",
            "Outcomes this worker's runs wrote (SUCCESS, ERROR, CANCELLED, COMPENSATED, "
            "COMPENSATION_FAILED), by status and name.",
            ["status", "workflow"],
            registry=r,
        )
        # (step, kind, failed) -> the histogram's child: one dict lookup per attempt.
        self._children: dict[tuple[str, str, bool], Any] = {}
        # (name, status) -> the counter's child: one dict lookup per finished workflow.
        self._finished: dict[tuple[str, str], Any] = {}
        self.engine: Engine | None = None
        # Set while the worker launches its engine, which may wait up to a lease on another
        # process's heartbeat (Ownership.refuse_a_live_twin): a process starting is alive.
        self.starting = False

    # -- hooks (called by the engine's threads) ------------------------------------------------

    def observe_step(self, scope: StepScope | None, outcome: Outcome) -> None:
        """One attempt of a journaled call's code ran (Settings.observe_step)."""
        if scope is None or scope.seq < 0:
            return  # the workflow's body, a compensation: no position of their own
        key = (scope.name, scope.kind, outcome.error is not None)
        child = self._children.get(key)
        if child is None:
            child = self.step_seconds.labels(scope.name, scope.kind, "error" if key[2] else "ok")
            self._children[key] = child
        child.observe(outcome.seconds)
        if scope.attempt > 1:
            self.retries.labels(scope.name).inc()
        if scope.dollars:
            self.dollars.labels(scope.name).inc(float(scope.dollars))
        if scope.tokens:
            self.tokens.labels(scope.name).inc(scope.tokens)

    def observe_finish(self, name: str, status: str) -> None:
        """A run wrote its workflow's outcome (Settings.observe_finish)."""
        key = (name, status)
        child = self._finished.get(key)
        if child is None:
            child = self._finished[key] = self.finished.labels(status, name)
        child.inc()

    def claimed(self, rows: list[dict[str, Any]]) -> None:
        """A batch of claims (SystemDB.on_claims)."""
        for row in rows:
            if row.get("status") == _DEAD:
                self.dead_letters.labels(row["name"]).inc()
            elif row.get("lease_expired"):
                self.recoveries.labels(row["name"]).inc()

    # -- wiring ------------------------------------------------------------------------------

    def attach(self, engine: Engine) -> None:
        """Measure `engine` (launched, its worker not yet running): its runs report each
        step attempt, its claims their recoveries, and a scrape reads its state and the
        system database."""
        runner = engine.runner
        if runner.settings is None:
            raise EngineNotRunningError("attach metrics to a launched engine")
        runner.settings = dataclasses.replace(
            runner.settings, observe_step=self.observe_step, observe_finish=self.observe_finish
        )
        engine.client.db.on_claims = self.claimed
        self.engine = engine
        self.starting = False
        self.registry.register(_EngineCollector(engine))
        self.registry.register(DatabaseCollector(lambda: engine.client.db))

    def live(self) -> tuple[bool, str]:
        """Liveness: the engine runs, its heartbeat thread is alive, its event loop (async
        workflows) has not died and no other process took its executor id. The database is
        not asked: an outage must not get a worker restarted. While the engine launches
        (`starting`): alive, not ready, so that a liveness probe restarts no worker waiting
        on a predecessor's lease."""
        engine = self.engine
        if engine is None and self.starting:
            return True, "starting"
        if engine is None or not engine.running:
            return False, "engine not running"
        beat = engine._services.heartbeat._thread
        if beat is None or not beat.is_alive():
            return False, "heartbeat thread stopped"
        if engine.runner.loop_failure is not None:
            return False, f"event loop died: {engine.runner.loop_failure!r}"
        if engine.ownership.superseded:
            return False, "executor id taken over by another process"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """Readiness: live, not handing over (stopping), and the system database answers
        and still names this process's incarnation as the holder of its executor id."""
        ok, why = self.live()
        if not ok or self.engine is None:
            return False, why
        ownership = self.engine.ownership
        if ownership.handing_over():
            return False, "stopping"
        db = self.engine.client.db
        if db.outage.down_since is not None:
            # Known lost (a run or the worker loop said so): no probe waits on the pool.
            return False, "database unreachable"
        try:
            row = db.fetch_one("metrics_registered", ownership.identity_params())
        except Exception as exc:  # a probe answers 503, never a stack trace
            return False, f"database unreachable: {type(exc).__name__}: {exc}"
        if row is None:
            return False, "executor not registered"
        return True, "ok"


def _gauge(name: str, doc: str, labels: list[str]) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, doc, labels=labels)


def _counter(name: str, doc: str, value: float) -> Any:
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(name, doc, value=value)


class DatabaseCollector:
    """What the system database holds, read at each scrape (two statements): workflows
    not finished and dead-lettered ones (finished ones are counted by the workers that
    write them, WorkerMetrics.finished)."""

    def __init__(self, db: Callable[[], SystemDB]) -> None:
        self._db = db

    def collect(self) -> Iterator[Metric]:
        try:
            db = self._db()
            rows = db.fetch_all("metrics_workflows", {})
            executors = db.fetch_all("metrics_executors", {})
        except DurableError as exc:
            logger.debug("metrics: cannot read the system database: %s", exc)
            up = _gauge("durable_database_scrape_ok", "The system database answered.", [])
            up.add_metric([], 0)
            yield up
            return
        up = _gauge("durable_database_scrape_ok", "The system database answered.", [])
        up.add_metric([], 1)
        yield up
        total = _gauge(
            "durable_workflows",
            "Workflows not finished (and dead-lettered ones) by status and name.",
            ["status", "workflow"],
        )
        expired = _gauge(
            "durable_workflows_lease_expired",
            "RUNNING workflows whose lease ran out (their worker is gone or stuck) and no "
            "worker has claimed yet.",
            ["workflow"],
        )
        oldest = _gauge(
            "durable_workflows_oldest_change_seconds",
            "Age of the oldest last change among the workflows of a status and name.",
            ["status", "workflow"],
        )
        # By queue only: partition keys are callers' values (a tenant, a user), a series each
        # would grow without bound. Per partition: `durable queues list`, the console.
        depth = _gauge(
            "durable_queue_depth", "Entries waiting in a queue (all its partitions).", ["queue"]
        )
        wait = _gauge(
            "durable_queue_oldest_wait_seconds",
            "How long the oldest entry of a queue (any partition) that may start has waited.",
            ["queue"],
        )
        counts: dict[tuple[str, str], list[float]] = {}
        queues: dict[str, list[float]] = {}
        for r in rows:
            c = counts.setdefault((r["status"], r["name"]), [0, 0, 0.0])
            c[0] += r["n"]
            c[1] += r["lease_expired"]
            c[2] = max(c[2], r["oldest_change"] or 0.0)
            if r["status"] == WorkflowStatus.ENQUEUED.value:
                q = queues.setdefault(r["queue_name"] or "", [0, 0.0])
                q[0] += r["n"]
                q[1] = max(q[1], r["oldest_ready"] or 0.0)
        expired_by_name: dict[str, float] = {}
        for (status, name), (n, lapsed, age) in counts.items():
            total.add_metric([status, name], n)
            oldest.add_metric([status, name], age)
            if status == WorkflowStatus.RUNNING.value:
                expired_by_name[name] = lapsed
        for name, lapsed in expired_by_name.items():
            expired.add_metric([name], lapsed)
        for queue_name, (n, age) in queues.items():
            depth.add_metric([queue_name], n)
            wait.add_metric([queue_name], age)
        beat = _gauge(
            "durable_executor_heartbeat_age_seconds",
            "Seconds since each registered executor's last heartbeat.",
            ["executor_id"],
        )
        for e in executors:
            beat.add_metric([e["executor_id"]], e["heartbeat_age"])
        yield from (total, expired, oldest, depth, wait, beat)


class _EngineCollector:
    """This process's engine, read at each scrape: counts it keeps anyway (outages,
    takeovers, statements), the runs it holds, its own heartbeat's age."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        db = engine.client.db
        outage = db.outage
        yield _counter(
            "durable_database_outages",
            "Outages of the system database this process lived through (ended ones).",
            outage.generation,
        )
        down = _gauge("durable_database_down", "1 while the system database is lost.", [])
        down.add_metric([], 0 if outage.down_since is None else 1)
        yield down
        yield _counter(
            "durable_lease_takeovers",
            "Workflows taken back from executors found dead or restarted (leases cut short).",
            db.counters.takeovers,
        )
        yield _counter(
            "durable_database_statements",
            "Statements sent to the system database.",
            db.counters.statements,
        )
        running = _gauge("durable_worker_running_workflows", "Runs this worker holds now.", [])
        running.add_metric([], engine.runner.running_count() + engine.runner.async_running_count())
        yield running
        if outage.renewed_at:
            age = _gauge(
                "durable_worker_heartbeat_age_seconds",
                "Seconds since this worker's heartbeat last renewed its leases.",
                [],
            )
            age.add_metric([], time.monotonic() - outage.renewed_at)
            yield age


# -- serving ----------------------------------------------------------------------------------


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry in Prometheus' text format, with its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry), CONTENT_TYPE_LATEST


def serve(metrics: WorkerMetrics, host: str, port: int) -> http.server.ThreadingHTTPServer:
    """Serve /metrics, /healthz (liveness) and /readyz (readiness) on a daemon thread;
    the caller shuts the server down."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, kind = exposition(metrics.registry)
                self._answer(200, body, kind)
                return
            if path in ("/healthz", "/livez", "/readyz"):
                ok, why = metrics.ready() if path == "/readyz" else metrics.live()
                self._answer(200 if ok else 503, f"{why}\n".encode(), "text/plain")
                return
            self._answer(404, b"not found: /metrics, /healthz, /readyz\n", "text/plain")

        def _answer(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None  # scrapes and probes every few seconds: not worth a log line

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="durable-metrics", daemon=True).start()
    return server
