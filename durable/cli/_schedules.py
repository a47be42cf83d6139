"""`durable schedules ...` and `durable queues list`: the cron schedules and the queues.

Both are shared, long-lived settings of an application rather than one workflow's state.
"""

from __future__ import annotations

import datetime as dt
import json

import click
from rich.table import Table

from durable._base.registry import Registry
from durable._base.terminal import inert
from durable._client.schedules import backfill
from durable.cli._common import _client, _console, _handle_errors
from durable.cli._options import json_option, schema_option, url_option


@click.group()
def schedules() -> None:
    """List, pause, resume, delete, backfill and trigger cron schedules."""


@schedules.command("list")
@url_option
@schema_option
@json_option
@_handle_errors
def schedules_list(database_url: str | None, schema: str, as_json: bool) -> None:
    """Stored schedules with their policy, state and latest tick."""
    with _client(database_url, schema) as client:
        rows = client.list_schedules()
    if as_json:
        keys = ("schedule_name", "workflow_name", "cron", "timezone", "catch_up", "paused")
        out = [
            {
                **{k: r[k] for k in keys},
                "last_tick": r["last_tick"].isoformat() if r["last_tick"] else None,
            }
            for r in rows
        ]
        click.echo(json.dumps(out, indent=2))
        return
    table = Table("schedule", "workflow", "cron", "timezone", "catch up", "state", "last tick")
    for r in rows:
        table.add_row(
            r["schedule_name"],
            r["workflow_name"],
            r["cron"],
            r["timezone"],
            str(r["catch_up"]),
            "paused" if r["paused"] else "active",
            r["last_tick"].isoformat() if r["last_tick"] else "",
        )
    _console().print(table)


def _pause_command(paused: bool) -> click.Command:
    @click.argument("name")
    @url_option
    @schema_option
    @_handle_errors
    def command(name: str, database_url: str | None, schema: str) -> None:
        with _client(database_url, schema) as client:
            client.pause_schedule(name, paused)
        click.echo(inert(f"{'paused' if paused else 'resumed'} schedule {name}"))

    command.__doc__ = (
        "Stop firing a schedule."
        if paused
        else "Fire a paused schedule again (missed ticks follow its catch-up policy)."
    )
    return click.command("pause" if paused else "resume")(command)


schedules.add_command(_pause_command(True))
schedules.add_command(_pause_command(False))


@schedules.command("delete")
@click.argument("name")
@url_option
@schema_option
@_handle_errors
def schedules_delete(name: str, database_url: str | None, schema: str) -> None:
    """Delete a stored schedule: it fires no more. Runs its ticks started are kept. A
    schedule declared in code is stored again by the next worker started with that code."""
    with _client(database_url, schema) as client:
        client.delete_schedule(name)
    click.echo(
        inert(
            f"deleted schedule {name}: it fires no more; the runs of its ticks are kept (a "
            "schedule declared in code comes back with the next worker of that code)"
        )
    )


def _app_registry(app: str | None) -> Registry | None:
    """The registry of `--app MODULE[:ENGINE]` (imported here, as a worker does): the
    module's `registry`, the engine's, or the default one its decorators filled."""
    if app is None:
        return None
    import importlib
    import os
    import sys

    from durable._base.registry import default_registry
    from durable._host.engine import Engine

    module_name, _, attr = app.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        found = getattr(module, attr) if attr else getattr(module, "registry", None)
    except (ImportError, ValueError, AttributeError) as exc:
        raise click.UsageError(
            f"--app {app!r} cannot be loaded ({exc}): give an importable module, or "
            "module:engine, run from the directory that holds it"
        ) from None
    if isinstance(found, Engine):
        return found.registry
    return found if isinstance(found, Registry) else default_registry


def _when(value: str, label: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: give an ISO date or time, e.g. 2026-01-05 or 2026-01-05T08:00+01:00",
            param_hint=label,
        ) from None


app_option = click.option(
    "--app",
    default=None,
    help="Module defining the schedule's workflow (or module:engine): its code is needed "
    "to record a run.",
)


@schedules.command("backfill")
@click.argument("name")
@click.option("--from", "start", required=True, help="First instant (included), ISO 8601.")
@click.option("--to", "end", required=True, help="Last instant (excluded), ISO 8601.")
@app_option
@url_option
@schema_option
@json_option
@_handle_errors
def schedules_backfill(
    name: str,
    start: str,
    end: str,
    app: str | None,
    database_url: str | None,
    schema: str,
    as_json: bool,
) -> None:
    """Run a schedule's ticks between --from and --to, as if it had fired them (a naive
    time is in the schedule's timezone). A tick that already ran starts nothing new."""
    first, last = _when(start, "--from"), _when(end, "--to")
    registry = _app_registry(app)
    with _client(database_url, schema) as client:
        ids, started = backfill(client, name, first, last, client.default_durability, registry)
    if as_json:
        click.echo(json.dumps({"workflow_ids": ids, "started": started}, indent=2))
        return
    click.echo(
        inert(
            f"schedule {name}: {len(ids)} ticks from {first.isoformat()} to "
            f"{last.isoformat()}, {started} started, {len(ids) - started} there already"
        )
    )


@schedules.command("trigger")
@click.argument("name")
@click.option("--id", "workflow_id", default=None, help="The run's id (default: a new one).")
@app_option
@url_option
@schema_option
@_handle_errors
def schedules_trigger(
    name: str, workflow_id: str | None, app: str | None, database_url: str | None, schema: str
) -> None:
    """Run a schedule's workflow now, as a run of its own (the current time is its tick);
    the schedule's own ticks are unchanged. Prints the run's id."""
    registry = _app_registry(app)
    with _client(database_url, schema) as client:
        handle = client.trigger_schedule(name, workflow_id=workflow_id, registry=registry)
    click.echo(inert(handle.workflow_id))


@click.group()
def queues() -> None:
    """Inspect queues."""


@queues.command("list")
@url_option
@schema_option
@json_option
@_handle_errors
def queues_list(database_url: str | None, schema: str, as_json: bool) -> None:
    """Queues with entries: waiting for a slot, holding one, finished."""
    with _client(database_url, schema) as client:
        rows = client.queues()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("queue", "queued", "active", "finished")
    for r in rows:
        table.add_row(r["queue_name"], str(r["queued"]), str(r["active"]), str(r["finished"]))
    _console().print(table)


@queues.command("partitions")
@click.argument("queue_name")
@url_option
@schema_option
@json_option
@_handle_errors
def queues_partitions(
    queue_name: str, database_url: str | None, schema: str, as_json: bool
) -> None:
    """A queue's partitions with unfinished entries: waiting for a slot, holding one."""
    with _client(database_url, schema) as client:
        rows = client.queue_partitions(queue_name)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("partition", "queued", "active")
    for r in rows:
        table.add_row(r["partition_key"], str(r["queued"]), str(r["active"]))
    _console().print(table)
