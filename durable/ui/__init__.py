"""The web console: workflows, one workflow's journal and ledgers, an approvals inbox,
operator actions, executors, queues and schedules. Server-rendered (Starlette + Jinja2,
`pip install 'durable-pg[ui]'`), no build step; every read and action goes through a
`durable.Client`.

Run it with `durable ui`, or mount it in your own ASGI app:

    from starlette.routing import Mount
    console = durable.ui.create_app(client, token=os.environ["DURABLE_UI_TOKEN"])
    app.routes.append(Mount("/durable", app=console))

Safe by default: actions need the token (a person signs in with it once and holds a
session cookie bound to it; scripts send the `X-Durable-Token` header), forms carry a CSRF
token bound to a SameSite=Strict cookie, a read-only console has no actions at all, and
every stored value is escaped when rendered. Over loopback it answers only to loopback's
names (no DNS rebinding); reached any other way, every page needs the token too.

The console (unless read-only) also serves callback URLs (durable.callback_url): POST
/callbacks/<token>, which needs no operator token (the URL's token is its credential).
`create_callback_app(client)` serves them alone (`durable callbacks serve`), to run or to
mount in an application of your own.
"""

from __future__ import annotations

from durable._base.extras import extra

with extra("ui"):
    from durable.ui._app import create_app
    from durable.ui._auth import TOKEN_HEADER
    from durable.ui._callbacks import create_callback_app

__all__ = ["TOKEN_HEADER", "create_app", "create_callback_app"]
