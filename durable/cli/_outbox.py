"""`durable outbox install` and `durable outbox drain`: the outbox of an application
database that is not the system database (conn= of a start, an enqueue or a send there;
see "Starting inside your transaction" in the README)."""

from __future__ import annotations

import click

from durable._client.client import Client
from durable.cli._common import _handle_errors, _resolve_url
from durable.cli._options import schema_option, url_option

app_url_option = click.option(
    "--url",
    "app_url",
    required=True,
    help="The application database's URL (where the outbox table lives).",
)


@click.group()
def outbox() -> None:
    """The outbox of an application database that is not durable's."""


@outbox.command("install")
@app_url_option
@url_option
@schema_option
@_handle_errors
def install(app_url: str, database_url: str | None, schema: str) -> None:
    """Create the outbox table in the application database (idempotent). Then give the
    engine `outbox_url=` that URL: its worker drains the outbox."""
    with Client(_resolve_url(database_url), schema=schema, connect_timeout=10) as client:
        client.install_outbox(app_url)
    click.echo(f"outbox installed in the application database ({schema}.outbox)")


@outbox.command("drain")
@app_url_option
@url_option
@schema_option
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1_000_000))
@_handle_errors
def drain(app_url: str, database_url: str | None, schema: str, limit: int) -> None:
    """Move what the outbox holds into the system database once (workers whose engine has
    `outbox_url=` do this every round)."""
    resolved = _resolve_url(database_url)
    with Client(resolved, schema=schema, connect_timeout=10, outbox_url=app_url) as client:
        moved = 0
        while moved < limit and (done := client.drain_outbox(min(500, limit - moved))):
            moved += done
    click.echo(f"{moved} row(s) moved from the outbox")
