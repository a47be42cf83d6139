"""POST /callbacks/<token>: the HTTP side of callback URLs (durable.callback_url), served by
the console's app (before its guard: a third party presents no operator token, the URL's
own token is the credential) and, for workers that run no console, by `durable callbacks
serve` (create_callback_app). What a POST does is durable/_client/callbacks.py's.

The body is JSON, at most `max_body_bytes` (413 past it, read no further), and parses or
is refused (400); a token that is not one durable makes is a 404 before the database is
asked. Answers are JSON, never cached.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Scope

from durable._client.callbacks import NOT_FOUND, TOKEN, Answer, complete
from durable._client.client import Client
from durable._core.callbacks import PATH
from durable._host.engine import Engine
from durable.errors import ConfigurationError, DatabaseUnavailableError

# The largest body a POST may carry (a webhook's JSON, not a file).
MAX_BODY_BYTES = 1024 * 1024


def is_callback(scope: Scope) -> bool:
    """Whether a request is for a callback URL (which the console's guard lets through)."""
    path = str(scope.get("path", ""))[len(str(scope.get("root_path", ""))) :]
    return scope.get("type") == "http" and path.startswith(PATH)


def _json(answer: Answer) -> Response:
    response = JSONResponse(answer.body, answer.status)
    response.headers["Cache-Control"] = "no-store"
    if answer.retry_after is not None:
        response.headers["Retry-After"] = str(answer.retry_after)
    return response


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def _read(request: Request, limit: int) -> bytes | None:
    """The body, read no further than `limit` bytes (None past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
    except ClientDisconnect:
        return b""
    return b"".join(chunks)


def callback_route(client: Client, max_body_bytes: int = MAX_BODY_BYTES) -> Route:
    """The route of callback URLs, over a connected client."""

    async def post(request: Request) -> Response:
        token = str(request.path_params["token"])
        if not TOKEN.fullmatch(token):
            return _json(NOT_FOUND)
        body = await _read(request, max_body_bytes)
        if body is None:
            too_big = f"the body is over {max_body_bytes} bytes"
            return _json(Answer(413, {"error": too_big}))
        try:
            value = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError too
            return _json(Answer(400, {"error": f"the body is not JSON: {exc}"}))
        address = request.client.host if request.client else "unknown"
        try:
            answer = await run_in_threadpool(complete, client, token, value, address)
        except DatabaseUnavailableError:
            answer = Answer(503, {"error": "the database cannot be reached now"}, 5)
        return _json(answer)

    return Route(PATH + "{token}", post, methods=["POST"])


def create_callback_app(
    client: Client | Engine, *, max_body_bytes: int = MAX_BODY_BYTES
) -> Starlette:
    """An ASGI app that serves callback URLs only (`durable callbacks serve`), over a
    connected client (or a launched engine's)."""
    if isinstance(client, Engine):
        client = client.client
    if not isinstance(max_body_bytes, int) or max_body_bytes <= 0:
        raise ConfigurationError(f"max_body_bytes={max_body_bytes!r}: give a number of bytes > 0")
    return Starlette(routes=[callback_route(client, max_body_bytes)])
