"""`durable worker` and `durable executors ...`: run a worker process, and inspect or prune
the executors that have run.

Loading the user's app (`--app module[:engine]`) belongs here, with the one command that
runs it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from typing import TYPE_CHECKING

import click
from rich.table import Table

from durable._base.names import workflow_label
from durable._base.terminal import inert
from durable._io.config import Config, describe_database
from durable.cli._common import _client, _console, _handle_errors
from durable.cli._options import (
    _DAY,
    _HOUR,
    DURATION,
    _checked_name,
    _FiniteRange,
    json_option,
    schema_option,
    url_option,
)
from durable.cli._processes import PROCESS_ENV, SUPERVISOR_FD_ENV
from durable.errors import DurableError, ExecutorIdInUseError

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    from durable._host.engine import Engine
    from durable._host.metrics import WorkerMetrics


@click.group()
def executors() -> None:
    """Inspect executors (worker processes and engines)."""


@executors.command("list")
@url_option
@schema_option
@json_option
@click.option("--all", "show_all", is_flag=True, help="Include executors silent for over --stale.")
@click.option("--stale", type=DURATION, default="2m", show_default=True)
@_handle_errors
def executors_list(
    database_url: str | None, schema: str, as_json: bool, show_all: bool, stale: dt.timedelta
) -> None:
    """List live executors with their heartbeat age and running workflows."""
    with _client(database_url, schema) as client:
        rows = [
            r for r in client.executors() if show_all or r["heartbeat_age"] <= stale or r["running"]
        ]
        waiting = client.waiting_for_worker()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "executors": [
                        {
                            "executor_id": r["executor_id"],
                            "hostname": r["hostname"],
                            "pid": r["pid"],
                            "heartbeat_age_seconds": r["heartbeat_age"].total_seconds(),
                            "running": r["running"],
                        }
                        for r in rows
                    ],
                    "waiting_for_worker": [w["workflow_id"] for w in waiting],
                },
                indent=2,
            )
        )
        return
    table = Table("executor", "host", "pid", "heartbeat age (s)", "running")
    for r in rows:
        table.add_row(
            r["executor_id"],
            r["hostname"],
            str(r["pid"]),
            f"{r['heartbeat_age'].total_seconds():.1f}",
            str(r["running"]),
        )
    console = _console()
    console.print(table)
    if waiting:
        console.print(
            f"{len(waiting)} workflow(s) waiting for a worker that has their code: "
            + ", ".join(
                f"{w['workflow_id']} ({workflow_label(w['name'], w['version'])})"
                for w in waiting[:10]
            )
        )


def _load_app(
    app: str,
    database_url: str | None,
    concurrency: int | None,
    lease: float | None,
    poll: float | None,
    schema: str = "durable",
    executor_id: str | None = None,
    queues: tuple[str, ...] | None = None,
) -> Engine:
    import importlib

    from durable._base.registry import Registry, default_registry
    from durable._host.engine import Engine

    module_name, _, attr = app.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        engine = getattr(module, attr) if attr else None
    except (ImportError, ValueError, AttributeError) as exc:
        raise click.UsageError(
            f"--app {app!r} cannot be loaded ({exc}): give an importable module, or "
            "module:engine, run from the directory that holds it"
        ) from None
    if attr:
        if not isinstance(engine, Engine):
            raise click.UsageError(f"{app} is not a durable.Engine")
        changes: dict[str, object] = {}
        if concurrency is not None:
            changes["max_workers"] = concurrency
        if lease is not None:
            changes["lease_seconds"] = float(lease)
        if poll is not None:
            changes["poll_interval"] = poll
        if executor_id is not None:
            changes.update(executor_id=executor_id, explicit_id=True)
        if queues is not None:
            changes["queues"] = queues
        if changes:
            engine._override(**changes)
        return engine
    registry = getattr(module, "registry", None)
    if not isinstance(registry, Registry):
        registry = default_registry
    return Engine(
        database_url,
        schema=schema,
        executor_id=executor_id,
        registry=registry,
        max_workers=concurrency or 8,
        lease_seconds=lease or 30.0,
        poll_interval=poll or 1.0,
        queues=queues,
    )


def _log_database(url: str | None, config: Config) -> None:
    """Which database the worker uses, as a log line (one a log shipper can parse with
    --log-format json), and a warning when its project is only a guess."""
    log = logging.getLogger("durable.worker")
    if url:
        about = describe_database(url)
        log.info("using %s", about, extra={"event": "database_in_use", "database": about})
        return
    project = config.embedded_project()
    about = project.describe()
    log.info("using %s", about, extra={"event": "database_in_use", "database": about})
    guess = project.how_chosen()
    if guess is not None:
        log.warning("%s", guess, extra={"event": "project_guessed", "project": str(project.root)})


@executors.command("prune")
@click.option("--stale", type=DURATION, default="10m", show_default=True)
@url_option
@schema_option
@_handle_errors
def executors_prune(stale: dt.timedelta, database_url: str | None, schema: str) -> None:
    """Forget executors silent for longer than --stale that own no running workflow."""
    with _client(database_url, schema) as client:
        n = client.prune_executors(stale.total_seconds())
    click.echo(f"removed {n} executor(s)")


@click.command()
@click.option("--app", required=True, help="Module defining the workflows, or module:engine.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 10_000),
    default=None,
    help="Workflows run at once (default 8).",
)
@click.option("--lease-seconds", type=_FiniteRange(0.1, _DAY), default=None)
@click.option("--poll-interval", type=_FiniteRange(0.01, _HOUR), default=None)
@click.option("--grace-seconds", type=_FiniteRange(0, _DAY), default=30.0, show_default=True)
@click.option(
    "--prune-finished-after",
    type=DURATION,
    default=None,
    help="Retention: delete journals of workflows finished longer ago than this (e.g. 7d).",
)
@click.option(
    "--prune-effects-after",
    type=DURATION,
    default=None,
    help="Retention: keep the effect ledger this long (default 90d when pruning).",
)
@click.option("--prune-interval", type=DURATION, default="5m", show_default=True)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per log line, with the event's fields (for log shippers).",
)
@click.option(
    "--executor-id",
    default=None,
    callback=lambda _ctx, _param, value: _checked_name("executor_id", value),
    help="Stable identity of this worker (unique per process): a restart takes back its "
    "interrupted workflows at once instead of after their lease. A worker whose id another "
    "process took over (it was paused past its lease) exits with code 1.",
)
@click.option(
    "--queues",
    "queues",
    default=None,
    callback=lambda _ctx, _param, value: _queue_names(value),
    help="Run only these queues' entries (comma-separated names, e.g. emails,reports), "
    "interrupted ones included; work that came from no queue is run all the same. Default: "
    "every queue the app declares (or DURABLE_QUEUES).",
)
@click.option(
    "--processes",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Worker processes to run, each with these options, its own executor id and "
    "heartbeat (a worker's Python runs on one core): they share the claims row by row.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics (/metrics) and health checks (/healthz, /readyz) on this "
    "port (needs the metrics extra: pip install 'durable-pg[metrics]'). With --processes N, "
    "process k serves on PORT+k.",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics port listens on (0.0.0.0 for a scraper or probes elsewhere).",
)
# Set by the environment: the log level, and for a process of `--processes N`, its number
# and the pipe it watches (its supervisor sets them).
@click.option("--log-level", envvar="DURABLE_LOG_LEVEL", default="INFO", hidden=True)
@click.option("--worker-process", "nth", envvar=PROCESS_ENV, default=None, hidden=True)
@click.option("--supervisor-fd", envvar=SUPERVISOR_FD_ENV, type=int, default=None, hidden=True)
@click.option(
    "--outbox-url",
    default=None,
    help="An application database whose outbox this worker drains (see `durable outbox`).",
)
@url_option
@schema_option
@_handle_errors
def worker(
    app: str,
    concurrency: int | None,
    lease_seconds: float | None,
    poll_interval: float | None,
    grace_seconds: float,
    prune_finished_after: dt.timedelta | None,
    prune_effects_after: dt.timedelta | None,
    prune_interval: dt.timedelta,
    database_url: str | None,
    schema: str,
    executor_id: str | None,
    log_format: str,
    processes: int,
    queues: tuple[str, ...] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    log_level: str = "INFO",
    nth: str | None = None,
    supervisor_fd: int | None = None,
    outbox_url: str | None = None,
) -> None:
    """Run the recovery daemon and workflow executor until SIGTERM or SIGINT.

    With --prune-finished-after it also applies retention (as Engine(retention=...) does).
    """
    import signal
    import threading

    from durable._base.logging import configure

    configure(log_level, log_format)
    if processes > 1:
        from durable.cli._processes import supervise

        if metrics_port is not None:
            from durable._host.metrics import new_registry

            new_registry()  # the extra is missing: say so once, not once per process
            if metrics_port and metrics_port + processes - 1 > 65535:
                raise click.UsageError(
                    f"--metrics-port {metrics_port} --processes {processes}: process k "
                    "listens on PORT+k, past 65535: give a lower port"
                )

        # Each process runs this command line (after the program's name) without --processes.
        sys.exit(supervise(sys.argv[1:], processes, grace_seconds))
    engine = _load_app(
        app, database_url, concurrency, lease_seconds, poll_interval, schema, executor_id, queues
    )
    if outbox_url is not None:
        engine._override(outbox_url=outbox_url)
    if nth is None or nth == "0":  # once for `--processes N`, not once per process
        _log_database(engine.config.database_url, engine.config)
    metrics = _metrics_server(metrics_host, metrics_port, nth)
    if nth is not None and executor_id is None and engine.config.explicit_id:
        # One of `--processes N`, on an engine given its executor id in code: one id each.
        engine._override(executor_id=f"{engine.config.executor_id}-{nth}", explicit_id=True)
    if prune_finished_after is not None or prune_effects_after is not None:
        from durable._io.retention import RetentionPolicy

        base = engine.config.retention or RetentionPolicy()
        policy = RetentionPolicy(
            finished_after=prune_finished_after or base.finished_after,
            effects_after=prune_effects_after or base.effects_after,
            batch_size=base.batch_size,
            interval=prune_interval,
        )
        engine._override(retention=policy)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("durable.worker").info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    from durable.cli._processes import EXIT_ID_IN_USE, watch_supervisor

    # One of `--processes N`: it stops when the command is gone.
    watch_supervisor(stop, supervisor_fd)
    try:
        engine.launch()
    except ExecutorIdInUseError as exc:
        click.echo(f"error: {inert(str(exc))}", err=True)
        sys.exit(EXIT_ID_IN_USE)  # the holder may be a predecessor still stopping: retry
    if metrics is not None:
        metrics[0].attach(engine)
    try:
        engine.run_worker(stop, grace_seconds=grace_seconds)
    except DurableError as exc:
        if engine.runner.loop_failure is None:
            raise
        # The event loop of async workflows died: its runs were given up. Their tasks,
        # frozen on it, and the threads they started must neither hold the process up
        # nor run their code as it ends: release what is left, then leave at once.
        engine.shutdown(wait=True)
        click.echo(f"error: {exc}", err=True)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    finally:
        engine.shutdown(wait=not engine.ownership.superseded)
        if metrics is not None:
            metrics[1].shutdown()
    if engine.ownership.superseded:
        # Another process holds this worker's executor id (the engine logged it, as an
        # error): exit now, non-zero, for a supervisor to restart it. Not a clean exit,
        # which would wait for the runs still inside a step: this process can no longer
        # renew their leases, so another worker may take them over while they run.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _queue_names(value: str | None) -> tuple[str, ...] | None:
    """--queues a,b: the names (None: the option was not given)."""
    if value is None:
        return None
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",")))
    if not all(names):
        raise click.BadParameter(
            f"{value!r}: give queue names separated by commas, e.g. --queues emails,reports"
        )
    for name in names:
        _checked_name("queue name", name)
    return names


def _metrics_server(
    host: str, port: int | None, nth: str | None
) -> tuple[WorkerMetrics, ThreadingHTTPServer] | None:
    """The worker's metrics and health endpoints, listening before the engine launches (a
    port already taken, or the extra missing, stops the worker at once)."""
    if port is None:
        return None
    from durable._host.metrics import WorkerMetrics, serve

    metrics = WorkerMetrics()  # MissingExtraError names the pip install
    # Alive, not ready, until the engine is attached: its launch may wait up to a lease on
    # a predecessor's heartbeat, and a liveness probe must not restart it meanwhile.
    metrics.starting = True
    if nth is not None and port:
        port += int(nth)  # one of --processes N: each process its own port
    if port > 65535:
        raise click.UsageError(
            f"--metrics-port: process {nth} would listen on port {port}, past 65535 "
            "(with --processes N, process k listens on PORT+k): give a lower port"
        )
    try:
        server = serve(metrics, host, port)
    except OSError as exc:
        raise click.UsageError(f"--metrics-port {port}: cannot listen on {host}: {exc}") from None
    bound = server.server_address[1]  # the one the system chose, for --metrics-port 0
    logging.getLogger("durable.worker").info(
        "serving metrics on http://%s:%d/metrics (health: /healthz, /readyz)", host, bound
    )
    return metrics, server
