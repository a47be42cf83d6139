"""`durable migrate`, `durable prune` and `durable db ...`: the schema, retention and the
embedded server.

The commands that look after the database itself rather than the workflows in it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import click

from durable._base.terminal import inert
from durable._client.client import Client
from durable._io import citus as _citus
from durable._io.config import check_schema
from durable.cli._common import (
    _client,
    _handle_errors,
    _Progress,
    _resolve_url,
    embedded_data_dir,
)
from durable.cli._options import DURATION, json_option, progress_option, schema_option, url_option


@click.command()
@url_option
@schema_option
@progress_option
@click.option(
    "--citus",
    is_flag=True,
    help="Then distribute the tables over a Citus cluster (see docs/scaling.md).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="With --citus: print the statements it would run, connect to nothing.",
)
@_handle_errors
def migrate(
    database_url: str | None, schema: str, progress: bool | None, citus: bool, dry_run: bool
) -> None:
    """Create or upgrade durable's tables (safe to run concurrently: a second run waits for
    the first, then finds nothing to do)."""
    if dry_run and not citus:
        raise click.UsageError("--dry-run goes with --citus")
    if dry_run:
        check_schema(schema)  # what the real run would refuse, refused here too
        for statement in _citus.statements(schema):
            click.echo(f"{statement};")
        return
    client = Client(_resolve_url(database_url), schema=schema, migrate=True, connect_timeout=10)
    with _Progress(progress) as shown:
        if shown.active:

            def report(version: int, name: str, index: int, count: int, took: float | None) -> None:
                label = f"migration {version:04d}_{name}"
                if took is None:
                    shown.update("migrations", index - 1, count, f" (applying {label})")
                else:
                    shown.update("migrations", index, count, f" ({label} took {took:.2f} s)")

            client._migration_progress = report
        with client:
            applied = client.applied_migrations
            distributed = client.distribute_citus() if citus else None
    click.echo(f"applied migrations: {applied}" if applied else "schema is up to date")
    if distributed is not None:
        click.echo(f"distributed {distributed} tables over Citus")


@click.command()
@click.option("--finished-after", type=DURATION, default="7d", show_default=True)
@click.option("--effects-after", type=DURATION, default="90d", show_default=True)
@click.option("--batch-size", type=click.IntRange(1, 1_000_000), default=500, show_default=True)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@url_option
@schema_option
@json_option
@progress_option
@_handle_errors
def prune(
    finished_after: dt.timedelta,
    effects_after: dt.timedelta,
    batch_size: int,
    dry_run: bool,
    database_url: str | None,
    schema: str,
    as_json: bool,
    progress: bool | None,
) -> None:
    """Delete journals of long-finished workflows and old effect records (retention).

    Workflows that can still run, or wait, are never touched; safe while workers run."""
    from durable._io.retention import RetentionPolicy

    policy = RetentionPolicy(
        finished_after=finished_after, effects_after=effects_after, batch_size=batch_size
    )
    with _client(database_url, schema) as client, _Progress(progress) as shown:
        report = client.prune(
            policy, dry_run=dry_run, progress=shown.update if shown.active else None
        )
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(report)))
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{verb} {report.workflows} finished workflows ({report.steps} journal rows) and "
        f"{report.effects} effect records"
    )
    if report.early_messages:
        click.echo(f"{verb} {report.early_messages} messages kept for workflows that never started")


@click.group()
def db() -> None:
    """Manage the embedded PostgreSQL server."""


@db.command("url")
@_handle_errors
def db_url() -> None:
    """Start the embedded server and create this project's database if needed (the
    project: the nearest directory up from here with a pyproject.toml or a .git), then print
    its URL: `psql "$(durable db url)"` works at once. Which project and database it is
    goes to stderr."""
    from durable import _embedded

    root = _embedded.project_root()
    url = _embedded.project_url(root, embedded_data_dir())
    click.echo(url)
    click.echo(inert(f"project {root}: database {_embedded.project_database(root)}"), err=True)


@db.command("stop")
@_handle_errors
def db_stop() -> None:
    """Stop the embedded server."""
    from durable import _embedded

    click.echo("stopped" if _embedded.stop_server(embedded_data_dir()) else "not running")
