"""`durable callbacks serve`: serve callback URLs (durable.callback_url) where no console
runs. The same route as the console's (durable/ui/_callbacks.py), on uvicorn: its imports
are the console's extra (`durable-pg[ui]`)."""

from __future__ import annotations

import click

from durable.cli._common import _client, _handle_errors
from durable.cli._options import schema_option, url_option


@click.group()
def callbacks() -> None:
    """Serve the callback URLs that complete waits (durable.callback_url)."""


@callbacks.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8322, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--max-body-bytes",
    default=1024 * 1024,
    show_default=True,
    type=click.IntRange(1),
    help="The largest body a POST may carry (413 past it).",
)
@url_option
@schema_option
@_handle_errors
def serve(host: str, port: int, max_body_bytes: int, database_url: str | None, schema: str) -> None:
    """Answer POST /callbacks/<token> (pip install 'durable-pg[ui]'). Each URL's token is
    its own credential: no operator token is asked for. Put https in front of it."""
    try:
        import uvicorn

        from durable.ui._callbacks import create_callback_app
    except ImportError as exc:
        hint = "install the console's extra with pip install 'durable-pg[ui]'"
        raise click.UsageError(f"{exc}: {hint}") from None
    with _client(database_url, schema) as client:
        app = create_callback_app(client, max_body_bytes=max_body_bytes)
        click.echo(f"durable callbacks on http://{host}:{port}/callbacks/ (Ctrl-C stops)", err=True)
        uvicorn.run(app, host=host, port=port, log_level="warning")
