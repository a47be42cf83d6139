"""The console's /metrics: what the system database holds (workflows by status and name,
queues, executors' heartbeats), in Prometheus' text format, read at each scrape. It passes
the console's guard like every page (beyond loopback, a scraper sends the token). A worker
serves the same numbers and its own process's with `durable worker --metrics-port`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from durable._client.client import Client
from durable._host.metrics import DatabaseCollector, exposition, new_registry
from durable.errors import MissingExtraError


def metrics_route(client: Client) -> Callable[[Request], Awaitable[Response]]:
    """The /metrics endpoint over `client`, with a registry of its own; without the
    metrics extra it answers 501 and names the pip install."""
    try:
        registry = new_registry()
    except MissingExtraError as exc:
        missing = str(exc)

        async def unavailable(request: Request) -> Response:
            return PlainTextResponse(f"{missing}\n", 501)

        return unavailable
    registry.register(DatabaseCollector(lambda: client.db))

    async def metrics(request: Request) -> Response:
        body, kind = await run_in_threadpool(exposition, registry)
        return Response(body, media_type=kind)

    return metrics
