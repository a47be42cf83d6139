# Generated from durable/_run/llm_steps_async.py by tools/async_to_sync.py: do not edit.
# Edit the source, then run `python tools/async_to_sync.py`
# (tests/unit/test_generated_sync.py fails while this file is out of date).
"""The wrapped model call of durable.llm (see there): a step named after the endpoint
that sends the request, charges what the reply used and journals the reply as JSON; a
replay rebuilds the SDK's objects from it.

This module is the source of the call wrapped for an async client (AsyncOpenAI,
AsyncAnthropic); `_run/llm_steps.py`, for a plain client, is generated from it by
tools/async_to_sync.py. What the two share (the price, setting the call's worst case
aside, charging the reply) comes from durable.llm as arguments.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from durable._base.models import StepKind
from durable._base.registry import StepDef
from durable._run import driver as _driver


class Endpoint(Protocol):
    """What the wrapper needs of an endpoint (durable.llm's _Endpoint)."""

    @property
    def step_name(self) -> str: ...

    @property
    def rebuild(self) -> Callable[[Any], Any]: ...

    @property
    def rebuild_chunk(self) -> Callable[[Any], Any]: ...

    @property
    def stream_options(self) -> Callable[[dict[str, Any]], dict[str, Any]]: ...


def wrapped(
    create: Callable[..., Any],
    endpoint: Endpoint,
    price_of: Callable[[Any], Any],
    set_aside: Callable[[dict[str, Any], Any], AbstractContextManager[Any]],
    charged: Callable[[Any, bool, Any], None],
) -> Callable[..., Any]:
    """`create` as a step named after `endpoint`: the price of the request's model is
    looked up first (`price_of`), so an unpriced model fails before any request; inside
    the step the call's worst case is set aside before the request is sent (`set_aside`)
    and the reply is charged (`charged`) once it is paid for."""

    def call(request: dict[str, Any], price: Any) -> Any:
        stream = bool(request.get("stream"))
        with set_aside(request, price):  # refused: nothing is sent
            response = create(**request)
            if stream:
                response = list(response)
                data: Any = [_dump(chunk) for chunk in response]
            else:
                data = _dump(response)
            charged(response, stream, price)
        return data

    defn = StepDef(endpoint.step_name, call, StepKind.STEP)

    @functools.wraps(create)
    def durable_create(**request: Any) -> Any:
        price = price_of(request.get("model"))
        if request.get("stream"):
            request = endpoint.stream_options(request)
        data = _driver.call_step(defn, (request, price), {})
        if request.get("stream"):
            return _iterate(data, endpoint)
        return endpoint.rebuild(data)

    return durable_create


def _dump(obj: Any) -> Any:
    """What the server sent, as JSON (fields it left out stay out). A field of the wrong
    type is dumped without pydantic's warning: the usage, read from the object itself,
    names a wrong count."""
    return obj.model_dump(mode="json", exclude_unset=True, warnings=False)


def _iterate(chunks: list[dict[str, Any]], endpoint: Endpoint) -> Iterator[Any]:
    for chunk in chunks:
        yield endpoint.rebuild_chunk(chunk)
