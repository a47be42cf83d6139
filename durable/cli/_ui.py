"""`durable ui`: serve the web console.

Its token rules (when one is needed, what it guards) are the console's, and its imports are
optional (`durable-pg[ui]`), so it stands alone.
"""

from __future__ import annotations

import click

from durable.cli._common import _client, _handle_errors
from durable.cli._options import schema_option, url_option


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8321, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    envvar="DURABLE_UI_TOKEN",
    default=None,
    help="What actions must present ($DURABLE_UI_TOKEN; default: a new one, printed); "
    "beyond loopback, 32 characters or more.",
)
@click.option(
    "--read-only",
    is_flag=True,
    help="No actions at all (and no token, unless it listens beyond loopback).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Another name to answer to, e.g. a reverse proxy's (its pages need the token).",
)
@url_option
@schema_option
@_handle_errors
def ui(
    host: str,
    port: int,
    token: str | None,
    read_only: bool,
    allowed_hosts: tuple[str, ...],
    database_url: str | None,
    schema: str,
) -> None:
    """Serve the web console (pip install 'durable-pg[ui]'). Bound beyond loopback (--host
    0.0.0.0), every page needs the token, not only the actions."""
    try:
        import uvicorn

        from durable.ui import create_app
        from durable.ui._app import _is_loopback
        from durable.ui._auth import check_strong
    except ImportError as exc:
        hint = "install the console with pip install 'durable-pg[ui]'"
        raise click.UsageError(f"{exc}: {hint}") from None
    beyond = not _is_loopback(host.strip("[]").lower())
    if beyond or allowed_hosts or not read_only:
        if token and (beyond or allowed_hosts):
            check_strong(token)  # WeakTokenError, before anything listens
        if not token:
            import secrets

            token = secrets.token_urlsafe(32)
            needs = (
                "every page needs"
                if beyond
                else "pages under an --allowed-host name need"
                if read_only
                else "actions need"
            )
            click.echo(f"{needs} this token (or set DURABLE_UI_TOKEN): {token}", err=True)
    else:
        token = None
    if beyond:
        click.echo(
            f"listening beyond loopback ({host}): every page needs the token, not only the "
            "actions (a browser shows a sign-in form for it; scripts send the "
            "X-Durable-Token header, a Bearer token, or Basic authentication with the token "
            "as the password); wrong tokens are throttled per client address; use https in "
            "front of it on an untrusted network",
            err=True,
        )
    with _client(database_url, schema) as client:
        app = create_app(
            client,
            token=token,
            read_only=read_only,
            reads_need_token=beyond,
            allowed_hosts=allowed_hosts,
        )
        click.echo(f"durable console on http://{host}:{port}/ (Ctrl-C stops)", err=True)
        uvicorn.run(app, host=host, port=port, log_level="warning")
