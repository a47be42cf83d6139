"""`durable approvals ...`: list human approval gates, approve or deny one.

The approve and deny commands are built by one function, as they differ only in the
decision they record.
"""

from __future__ import annotations

import json
import os

import click
from rich.table import Table

from durable._base.terminal import inert
from durable.cli._common import _client, _console, _handle_errors, _short
from durable.cli._options import json_option, schema_option, url_option
from durable.cli._tracebacks import json_value


@click.group()
def approvals() -> None:
    """List and decide human approval gates."""


@approvals.command("list")
@url_option
@schema_option
@click.option("--all", "show_all", is_flag=True, help="Include decided gates.")
@json_option
@_handle_errors
def approvals_list(database_url: str | None, schema: str, show_all: bool, as_json: bool) -> None:
    """Gates waiting for a decision (the workflows hold no worker while they wait)."""
    with _client(database_url, schema) as client:
        rows = client.list_approvals(waiting_only=not show_all, limit=500)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "workflow_id": r["workflow_id"],
                        "name": r["name"],
                        "status": r["status"],
                        "payload": json_value(r["payload"]),
                        "comment": r["comment"],
                        "decided_by": r["decided_by"],
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
        return
    table = Table("workflow", "gate", "status", "payload", "requested", "expires")
    for r in rows:
        table.add_row(
            r["workflow_id"],
            r["name"],
            r["status"],
            _short(r["payload"], 50),
            r["requested_at"].strftime("%Y-%m-%d %H:%M:%S"),
            r["expires_at"].strftime("%Y-%m-%d %H:%M:%S") if r["expires_at"] else "",
        )
    _console().print(table)


def _decision_command(approve: bool) -> click.Command:
    verb = "approve" if approve else "deny"

    @click.argument("workflow_id")
    @click.argument("name")
    @click.option("--comment", default=None)
    @click.option("--by", default=lambda: os.environ.get("USER"), help="Who decides.")
    @url_option
    @schema_option
    @_handle_errors
    def command(
        workflow_id: str,
        name: str,
        comment: str | None,
        by: str | None,
        database_url: str | None,
        schema: str,
    ) -> None:
        with _client(database_url, schema) as client:
            client.decide(workflow_id, name, approve, comment=comment, decided_by=by)
        click.echo(inert(f"{'approved' if approve else 'denied'} {name} of {workflow_id}"))

    command.__doc__ = (
        "Approve a gate: its workflow resumes on any worker."
        if approve
        else "Deny a gate: its workflow resumes and sees the denial."
    )
    return approvals.command(verb)(command)


approve = _decision_command(True)
deny = _decision_command(False)
