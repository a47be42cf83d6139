"""`durable mcp`: serve the MCP server (durable.integrations.mcp) over stdio, for a coding
assistant to read workflows and, given the console's operator token, act on them.

Its imports are optional (`durable-pg[mcp]`). Standard output carries the protocol: this
command writes nothing else there.
"""

from __future__ import annotations

import click

from durable.cli._common import _client, _handle_errors
from durable.cli._options import schema_option, url_option


@click.command("mcp")
@click.option(
    "--token",
    envvar="DURABLE_UI_TOKEN",
    default=None,
    help="The console's operator token ($DURABLE_UI_TOKEN): with it, the operator actions "
    "(cancel, resume, fork, decide, raise_budget) are offered too; without it, reads only.",
)
@url_option
@schema_option
@_handle_errors
def mcp(token: str | None, database_url: str | None, schema: str) -> None:
    """Serve an MCP server over stdio (pip install 'durable-pg[mcp]'): tools to list,
    search and read workflows, their journals, errors, events, budgets, queues and the
    audit log; with --token, to cancel, resume, fork, decide approvals and raise budgets,
    each recorded in the audit log as `user@host via mcp`."""
    # MissingExtraError (exit 1, the pip line) without the extra.
    from durable.integrations.mcp import create_server

    with _client(database_url, schema, via="mcp") as client:
        mode = "reads and operator actions" if token else "reads only (no --token)"
        click.echo(f"durable MCP server on stdio: {mode}", err=True)
        create_server(client, token=token).run("stdio")
