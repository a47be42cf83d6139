"""`durable schedules ...` and `durable queues list`: the cron schedules and the queues.

Both are shared, long-lived settings of an application rather than one workflow's state.
"""

from __future__ import annotations

import json

import click
from rich.table import Table

from durable._terminal import inert
from durable.cli._common import _client, _console, _handle_errors
from durable.cli._options import json_option, schema_option, url_option


@click.group()
def schedules() -> None:
    """List, pause and resume cron schedules."""


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
