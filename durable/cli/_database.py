"""`durable migrate`, `durable prune` and `durable db ...`: the schema, retention and the
embedded server.

The commands that look after the database itself rather than the workflows in it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sys
from pathlib import Path

import click

from durable._base.terminal import inert
from durable._client.client import Client
from durable._io import citus as _citus
from durable._io.config import Config, check_schema
from durable.cli._common import (
    _client,
    _console,
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
    """Manage the embedded PostgreSQL server and its projects' databases."""


@db.command("url")
@_handle_errors
def db_url() -> None:
    """Start the embedded server and create this project's database if needed (the
    project: the nearest directory up from here with a pyproject.toml or a .git, or
    DURABLE_PROJECT_DIR), then print its URL: `psql "$(durable db url)"` works at once.
    Which project and database it is goes to stderr."""
    from durable import _embedded

    project = Config.resolve().embedded_project()
    url = _embedded.project_url(data_dir=embedded_data_dir(), project=project)
    click.echo(url)
    click.echo(inert(f"project {project.root}: database {project.database}"), err=True)
    guess = project.how_chosen()
    if guess is not None:
        click.echo(inert(f"note: {guess}"), err=True)


@db.command("list")
@json_option
@_handle_errors
def db_list(as_json: bool) -> None:
    """Each project's database on the embedded server: its project directory, size and
    last use, most recent first (the server is started if it is down)."""
    from durable import _embedded

    data_dir = _resolve_data_dir(embedded_data_dir())
    found = _embedded.list_project_databases(data_dir)
    if as_json:
        rows = [{**dataclasses.asdict(d), "data_dir": str(data_dir)} for d in found]
        click.echo(json.dumps(rows))
        return
    if not found:
        click.echo(f"no project databases on the embedded server ({data_dir})")
        return
    from rich.table import Table

    table = Table(title=f"embedded PostgreSQL in {data_dir}", title_justify="left")
    for column in ("project", "database", "size", "last used"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for d in found:
        table.add_row(
            d.project or "(not recorded)",
            d.database,
            _size(d.size_bytes),
            (d.last_used or "")[:19].replace("T", " "),
        )
    _console().print(table)


def _size(n: int) -> str:
    amount = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if amount < 1024 or unit == "GB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{n} B"


def _resolve_data_dir(data_dir: Path | None) -> Path:
    from durable._embedded.layout import _resolve

    return _resolve(data_dir)


@db.command("drop")
@click.argument("project_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--yes", is_flag=True, help="Drop without asking.")
@_handle_errors
def db_drop(project_dir: Path | None, yes: bool) -> None:
    """Delete a project's database on the embedded server, with every workflow in it: the
    project PROJECT_DIR as `durable db list` shows it, else this directory's project.
    Connections to it are ended; the server keeps running for the other projects. Asks
    first on a terminal; elsewhere give --yes."""
    from durable import _embedded
    from durable._embedded.projects import Project, find_project

    if project_dir is not None:
        # As listed: the directory itself, not the project above it.
        project = find_project(pinned=project_dir)
        project = Project(project.root, marker=None, pinned=True)
    else:
        project = Config.resolve().embedded_project()
    about = f"{project.describe()} ({project.database})"
    if not yes:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise click.UsageError(f"dropping {about} deletes its workflows: give --yes")
        click.confirm(inert(f"drop {about} and every workflow in it?"), abort=True)
    if _embedded.drop_project_database(project, embedded_data_dir()):
        click.echo(inert(f"dropped {about}"))
    else:
        click.echo(inert(f"{about} does not exist: nothing to drop"))


@db.command("stop")
@_handle_errors
def db_stop() -> None:
    """Stop the embedded server."""
    from durable import _embedded

    click.echo("stopped" if _embedded.stop_server(embedded_data_dir()) else "not running")
