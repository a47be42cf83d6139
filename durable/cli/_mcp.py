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
@click.option(
    "--http",
    is_flag=True,
    help="Serve streamable HTTP (at /mcp) instead of stdio; given a token, every request "
    "must present it (Authorization: Bearer T).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="--http: address to bind.")
@click.option("--port", default=8323, show_default=True, type=click.IntRange(0, 65535))
@url_option
@schema_option
@_handle_errors
def mcp(
    token: str | None,
    http: bool,
    host: str,
    port: int,
    database_url: str | None,
    schema: str,
) -> None:
    """Serve an MCP server over stdio (pip install 'durable-pg[mcp]'): tools to list,
    search and read workflows, their journals, errors, events, budgets, queues and the
    audit log; with --token, to cancel, resume, fork, decide approvals and raise budgets,
    each recorded in the audit log as `user@host via mcp`."""
    # MissingExtraError (exit 1, the pip line) without the extra.
    from durable.integrations.mcp import create_server, http_app

    if http and not _is_loopback(host.strip("[]").lower()):
        if not token:
            raise click.UsageError(
                f"--host {host} is beyond loopback: give a --token (32 characters or more) "
                "that every request must present"
            )
        from durable.ui._auth import check_strong

        check_strong(token)  # WeakTokenError, before anything listens
    mode = "reads and operator actions" if token else "reads only (no --token)"
    with _client(database_url, schema, via="mcp") as client:
        server = create_server(client, token=token)
        if not http:
            click.echo(f"durable MCP server on stdio: {mode}", err=True)
            server.run("stdio")
            return
        import uvicorn

        app = http_app(server, token=token, host=host)
        click.echo(f"durable MCP server on http://{host}:{port}/mcp: {mode}", err=True)
        uvicorn.run(app, host=host, port=port, log_level="warning")


def _is_loopback(host: str) -> bool:
    """Whether a host name or address is this machine's loopback (as the console's; that
    module needs the console's extra)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback
