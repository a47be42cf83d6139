"""`durable audit`: the operator actions recorded in the audit log (who cancelled, resumed,
moved, forked, imported, decided, raised a budget, paused or deleted a schedule; when and
from where), newest first."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click
from rich.table import Table

from durable.cli._common import _client, _console, _handle_errors, _short
from durable.cli._options import json_option, schema_option, url_option


def audit_table(rows: list[dict[str, Any]], title: str, with_workflow: bool = False) -> Table:
    """The audit rows as a table (stored text is shown inert by the console)."""
    columns = ["at (UTC)", *(["workflow"] if with_workflow else []), "actor", "action"]
    table = Table(*columns, "on", "detail", title=title)
    for r in rows:
        at = r["at"].astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        workflow = [r["workflow_id"] or "-"] if with_workflow else []
        table.add_row(
            at, *workflow, r["actor"], r["action"], r["subject"] or "", _short(r["detail"], 60)
        )
    return table


@click.command("audit")
@click.option("--workflow", "workflow_id", default=None, help="Only the actions on this workflow.")
@click.option("--action", default=None, help="Only this action (cancel, resume, fork, ...).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000))
@url_option
@schema_option
@json_option
@_handle_errors
def audit(
    workflow_id: str | None,
    action: str | None,
    limit: int,
    database_url: str | None,
    schema: str,
    as_json: bool,
) -> None:
    """List the operator actions recorded in the audit log, newest first: who (the OS user
    and host of a command, the client address and session of the console), what, on which
    workflow or schedule, and when."""
    with _client(database_url, schema) as client:
        rows = client.audit_log(workflow_id, action=action, limit=limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    _console().print(audit_table(rows, "operator actions (newest first)", with_workflow=True))
