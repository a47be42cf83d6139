"""The `durable` command: migrate the schema, inspect workflows, manage the embedded server.

Every command takes --database-url (or DURABLE_DATABASE_URL); without either it uses the
embedded server. Tables are printed for people; --json prints data for scripts. Exit codes:
0 success, 1 a durable error (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar

import click
from rich.console import Console
from rich.table import Table

from durable._models import StepRecord, WorkflowInfo, WorkflowStatus
from durable._protocol import decode_error
from durable._systemdb import SystemDB
from durable.errors import DurableError, WorkflowNotFoundError

P = ParamSpec("P")
R = TypeVar("R")

url_option = click.option(
    "--database-url",
    envvar="DURABLE_DATABASE_URL",
    default=None,
    help="System database URL (default: $DURABLE_DATABASE_URL, else the embedded server).",
)
schema_option = click.option("--schema", default="durable", show_default=True)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _resolve_url(url: str | None) -> str:
    if url:
        return url
    from durable import _embedded

    return _embedded.ensure_server()


def _handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except DurableError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)

    return wrapper


def _open(url: str | None, schema: str) -> SystemDB:
    db = SystemDB(_resolve_url(url), schema, max_size=2)
    db.open(timeout=10)
    return db


def _console() -> Console:
    return Console(width=max(100, int(os.environ.get("COLUMNS", "120"))))


@click.group()
def main() -> None:
    """durable: durable workflows journaled in PostgreSQL."""


@main.command()
@url_option
@schema_option
@_handle_errors
def migrate(database_url: str | None, schema: str) -> None:
    """Create or upgrade durable's tables (safe to run concurrently)."""
    db = _open(database_url, schema)
    try:
        applied = db.migrate()
    finally:
        db.close()
    click.echo(f"applied migrations: {applied}" if applied else "schema is up to date")


@main.group()
def workflows() -> None:
    """Inspect workflows."""


def _info_dict(info: WorkflowInfo) -> dict[str, Any]:
    return {
        "workflow_id": info.workflow_id,
        "name": info.name,
        "version": info.version,
        "status": info.status.value,
        "durability": info.durability,
        "parent_id": info.parent_id,
        "owner": info.owner,
        "epoch": info.epoch,
        "recovery_attempts": info.recovery_attempts,
        "created_at": info.created_at.isoformat(),
        "finished_at": info.finished_at.isoformat() if info.finished_at else None,
    }


@workflows.command("list")
@url_option
@schema_option
@click.option("--status", type=click.Choice([s.value for s in WorkflowStatus]), default=None)
@click.option("--name", default=None, help="Only workflows registered under this name.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@json_option
@_handle_errors
def list_cmd(
    database_url: str | None,
    schema: str,
    status: str | None,
    name: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List workflows, newest first."""
    db = _open(database_url, schema)
    try:
        rows = db.fetch_all("list_workflows", {"status": status, "name": name, "limit": limit})
    finally:
        db.close()
    infos = [WorkflowInfo.from_row(r) for r in rows]
    if as_json:
        click.echo(json.dumps([_info_dict(i) for i in infos], indent=2))
        return
    table = Table("id", "name", "status", "epoch", "created", "finished")
    for i in infos:
        table.add_row(
            i.workflow_id,
            i.name if i.version is None else f"{i.name}@{i.version}",
            i.status.value,
            str(i.epoch),
            i.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            i.finished_at.strftime("%Y-%m-%d %H:%M:%S") if i.finished_at else "",
        )
    _console().print(table)


def _short(text: str | None, width: int = 60) -> str:
    if text is None:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


@workflows.command("show")
@click.argument("workflow_id")
@url_option
@schema_option
@json_option
@_handle_errors
def show(workflow_id: str, database_url: str | None, schema: str, as_json: bool) -> None:
    """Show one workflow: inputs, status, and every journaled step."""
    db = _open(database_url, schema)
    try:
        row = db.fetch_one("get_workflow", {"workflow_id": workflow_id})
        if row is None:
            raise WorkflowNotFoundError(workflow_id)
        steps = [StepRecord.from_row(r) for r in db.fetch_all("load_journal", row)]
    finally:
        db.close()
    info = WorkflowInfo.from_row(row)
    if as_json:
        data = _info_dict(info) | {
            "inputs": info.inputs,
            "output": info.output,
            "error": json.loads(info.error) if info.error else None,
            "steps": [
                {
                    "step_seq": s.step_seq,
                    "step_name": s.step_name,
                    "kind": s.kind.value,
                    "output": s.output,
                    "error": json.loads(s.error) if s.error else None,
                    "attempts": s.attempts,
                    "child_workflow_id": s.child_workflow_id,
                    "started_at": s.started_at.isoformat() if s.started_at else None,
                    "finished_at": s.finished_at.isoformat() if s.finished_at else None,
                }
                for s in steps
            ],
        }
        click.echo(json.dumps(data, indent=2))
        return
    console = _console()
    console.print(f"[bold]{info.workflow_id}[/bold]  {info.name}  [bold]{info.status.value}[/bold]")
    console.print(f"inputs: {_short(info.inputs, 200)}")
    console.print(f"durability: {info.durability}  epoch: {info.epoch}  owner: {info.owner or '-'}")
    if info.output is not None:
        console.print(f"output: {_short(info.output, 200)}")
    if info.error is not None:
        etype, message, _ = decode_error(info.error)
        console.print(f"error: {etype}: {message}")
    table = Table("#", "step", "kind", "output / error", "attempts", "ms")
    for s in steps:
        outcome = (
            _short(s.output)
            if s.error is None
            else "ERROR " + _short(": ".join(decode_error(s.error)[:2]))
        )
        ms = ""
        if s.started_at and s.finished_at:
            ms = f"{(s.finished_at - s.started_at).total_seconds() * 1000:.1f}"
        table.add_row(str(s.step_seq), s.step_name, s.kind.value, outcome, str(s.attempts), ms)
    console.print(table)


@main.group()
def db() -> None:
    """Manage the embedded PostgreSQL server."""


@db.command("url")
@_handle_errors
def db_url() -> None:
    """Start the embedded server if needed and print its URL."""
    from durable import _embedded

    click.echo(_embedded.ensure_server())


@db.command("stop")
@_handle_errors
def db_stop() -> None:
    """Stop the embedded server."""
    from durable import _embedded

    click.echo("stopped" if _embedded.stop_server() else "not running")


if __name__ == "__main__":
    main()
