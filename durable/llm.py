"""Model calls as durable steps that charge themselves.

`durable.llm.wrap(client)` takes an official `openai` (OpenAI, AsyncOpenAI) or `anthropic`
(Anthropic, AsyncAnthropic) client and returns one that looks the same. Inside a workflow,
`client.chat.completions.create(...)`, `client.responses.create(...)` and
`client.messages.create(...)` are journaled steps: the response is recorded once and a
replay returns it rebuilt as the SDK's own type, with no second request. The call's usage
(input, cached input and output tokens) is read from the response and charged to the
workflow's budget (`durable.charge`), in tokens and in dollars from a price table. Outside
a workflow the wrapped client is the plain client. Everything else on the client is
passed through untouched.

`stream=True` works too: the stream is consumed inside the step, the chunks (events) are
what is journaled, and the caller gets an iterator (an async one for async clients) over
them, the same on the first run and on a replay. The calls that consume the stream, not
the iteration, are the step: a crash while the caller iterates replays the chunks.

Prices are dollars per million tokens per model, matched by the longest model-name prefix.
`DEFAULT_PRICES` lists a few models' list prices as published on `PRICES_AS_OF`: vendors
change them, so pass your own table (`prices=`) for anything that matters. A model with
no price raises `UnknownModelPriceError` before the request is made; `prices={"my-model":
None}` charges its tokens without dollars.

Install the SDKs with `pip install 'durable-pg[llm]'`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from durable import _driver, _driver_async
from durable._budget import charge
from durable._context import current_step
from durable._models import StepKind
from durable._registry import StepDef
from durable.errors import ConfigurationError, UnknownModelPriceError

__all__ = ["DEFAULT_PRICES", "PRICES_AS_OF", "Price", "Usage", "wrap"]


@dataclass(frozen=True)
class Price:
    """Dollars per million tokens. `cached_input` defaults to the input price."""

    input: float
    output: float
    cached_input: float | None = None

    def dollars(self, usage: Usage) -> Decimal:
        cached_rate = self.input if self.cached_input is None else self.cached_input
        fresh = usage.input_tokens - usage.cached_input_tokens
        cost = (
            Decimal(str(self.input)) * fresh
            + Decimal(str(cached_rate)) * usage.cached_input_tokens
            + Decimal(str(self.output)) * usage.output_tokens
        )
        return cost / Decimal(1_000_000)


@dataclass(frozen=True)
class Usage:
    """Tokens of one model call. `input_tokens` includes the cached ones."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


PRICES_AS_OF = "2025-06-01"
DEFAULT_PRICES: Mapping[str, Price] = {
    # OpenAI list prices (standard tier) on PRICES_AS_OF.
    "gpt-4o": Price(2.50, 10.00, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "gpt-4.1": Price(2.00, 8.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "o4-mini": Price(1.10, 4.40, 0.275),
    # Anthropic list prices on PRICES_AS_OF (cache reads; cache writes are charged as input).
    "claude-opus-4": Price(15.00, 75.00, 1.50),
    "claude-sonnet-4": Price(3.00, 15.00, 0.30),
    "claude-3-5-haiku": Price(0.80, 4.00, 0.08),
}


# -- the endpoints ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Endpoint:
    """One wrapped method: where it is on the client, what its step is called, how its
    response and stream are rebuilt and where their usage is."""

    path: tuple[str, ...]
    step_name: str
    rebuild: Callable[[Any], Any]
    rebuild_chunk: Callable[[Any], Any]
    usage: Callable[[dict[str, Any]], Usage]
    stream_usage: Callable[[list[dict[str, Any]]], Usage]
    stream_options: Callable[[dict[str, Any]], dict[str, Any]] = lambda request: request


def _get(data: Any, *keys: str) -> int:
    for key in keys:
        if not isinstance(data, dict):
            return 0
        data = data.get(key)
    return int(data or 0)


def _openai_chat_usage(data: dict[str, Any]) -> Usage:
    usage = data.get("usage") or {}
    return Usage(
        _get(usage, "prompt_tokens"),
        _get(usage, "completion_tokens"),
        _get(usage, "prompt_tokens_details", "cached_tokens"),
    )


def _openai_chat_stream_usage(chunks: list[dict[str, Any]]) -> Usage:
    for chunk in reversed(chunks):
        if chunk.get("usage"):
            return _openai_chat_usage(chunk)
    return Usage()


def _include_usage(request: dict[str, Any]) -> dict[str, Any]:
    """A streamed chat completion reports its usage only when asked to."""
    options = dict(request.get("stream_options") or {})
    options.setdefault("include_usage", True)
    return {**request, "stream_options": options}


def _openai_responses_usage(data: dict[str, Any]) -> Usage:
    usage = data.get("usage") or {}
    return Usage(
        _get(usage, "input_tokens"),
        _get(usage, "output_tokens"),
        _get(usage, "input_tokens_details", "cached_tokens"),
    )


def _openai_responses_stream_usage(events: list[dict[str, Any]]) -> Usage:
    for event in reversed(events):
        response = event.get("response")
        if isinstance(response, dict) and response.get("usage"):
            return _openai_responses_usage(response)
    return Usage()


def _anthropic_usage(data: dict[str, Any]) -> Usage:
    usage = data.get("usage") or {}
    cached = _get(usage, "cache_read_input_tokens")
    written = _get(usage, "cache_creation_input_tokens")
    return Usage(
        _get(usage, "input_tokens") + cached + written, _get(usage, "output_tokens"), cached
    )


def _anthropic_stream_usage(events: list[dict[str, Any]]) -> Usage:
    start = Usage()
    output = 0
    for event in events:
        if event.get("type") == "message_start":
            start = _anthropic_usage(event.get("message") or {})
        elif event.get("type") == "message_delta":
            output = _get(event, "usage", "output_tokens") or output
    return Usage(start.input_tokens, output or start.output_tokens, start.cached_input_tokens)


def _validator(type_path: str) -> Callable[[Any], Any]:
    """Rebuild an SDK object from its JSON as the SDK builds one from a response: leniently
    (`construct`, which both SDKs make recursive), so a field the server left out stays
    out instead of failing validation. A union (stream events) is resolved by `type`."""

    @functools.cache
    def target() -> Any:
        import importlib

        module, _, name = type_path.rpartition(".")
        return getattr(importlib.import_module(module), name)

    def build(data: Any) -> Any:
        kind: Any = target()
        if isinstance(kind, type):
            return kind.construct(**data)  # type: ignore[attr-defined]
        member = _member(kind, data.get("type") if isinstance(data, dict) else None)
        return data if member is None else member.construct(**data)

    return build


def _member(union: Any, tag: Any) -> Any:
    """The class of a (possibly Annotated) union whose `type` field is the literal `tag`."""
    import typing

    args = typing.get_args(union)
    if typing.get_origin(union) is typing.Annotated:
        args = typing.get_args(args[0])
    for cls in args:
        field = getattr(cls, "model_fields", {}).get("type")
        if field is not None and tag in typing.get_args(field.annotation):
            return cls
    return None


_ENDPOINTS: dict[str, tuple[_Endpoint, ...]] = {
    "openai": (
        _Endpoint(
            ("chat", "completions", "create"),
            "openai.chat.completions.create",
            _validator("openai.types.chat.ChatCompletion"),
            _validator("openai.types.chat.ChatCompletionChunk"),
            _openai_chat_usage,
            _openai_chat_stream_usage,
            _include_usage,
        ),
        _Endpoint(
            ("responses", "create"),
            "openai.responses.create",
            _validator("openai.types.responses.Response"),
            _validator("openai.types.responses.ResponseStreamEvent"),
            _openai_responses_usage,
            _openai_responses_stream_usage,
        ),
    ),
    "anthropic": (
        _Endpoint(
            ("messages", "create"),
            "anthropic.messages.create",
            _validator("anthropic.types.Message"),
            _validator("anthropic.types.RawMessageStreamEvent"),
            _anthropic_usage,
            _anthropic_stream_usage,
        ),
    ),
}


# -- the wrapper -----------------------------------------------------------------------------


def wrap(client: Any, *, prices: Mapping[str, Price | None] | None = None) -> Any:
    """The client, with its model calls made durable steps that charge the budget.

    `prices`: dollars per million tokens by model name (longest prefix wins); default
    DEFAULT_PRICES. A model priced None is charged in tokens only."""
    vendor = type(client).__module__.split(".")[0]
    if vendor not in _ENDPOINTS:
        raise ConfigurationError(
            f"durable.llm.wrap({type(client).__qualname__}): give an openai or anthropic "
            "client (OpenAI, AsyncOpenAI, Anthropic, AsyncAnthropic)"
        )
    table = dict(DEFAULT_PRICES if prices is None else prices)
    # AsyncOpenAI / AsyncAnthropic (their `create` methods are wrapped, so asking them
    # whether they are coroutine functions is not reliable).
    is_async = type(client).__name__.startswith("Async")
    return _Proxy(client, client, (), _Calls(vendor, table, is_async))


class _Calls:
    """What the wrapped methods share: the vendor, the prices, one StepDef per method."""

    def __init__(self, vendor: str, prices: dict[str, Price | None], is_async: bool) -> None:
        self.vendor = vendor
        self.is_async = is_async
        self.prices = prices
        self.endpoints = {e.path: e for e in _ENDPOINTS[vendor]}
        self.prefixes = {e.path[:i] for e in _ENDPOINTS[vendor] for i in range(1, len(e.path))}

    def price(self, model: Any) -> Price | None:
        if not isinstance(model, str) or not model:
            raise ConfigurationError(f"model={model!r}: give the model's name")
        for name in sorted(self.prices, key=len, reverse=True):
            if model == name or model.startswith(name):
                return self.prices[name]
        raise UnknownModelPriceError(model)


class _Proxy:
    """The client (or one of its resources) with the wrapped methods in place."""

    def __init__(self, client: Any, target: Any, path: tuple[str, ...], calls: _Calls) -> None:
        self._client = client
        self._target = target
        self._path = path
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        path = (*self._path, name)
        value = getattr(self._target, name)
        endpoint = self._calls.endpoints.get(path)
        if endpoint is not None:
            return _method(value, endpoint, self._calls)
        if path in self._calls.prefixes:
            return _Proxy(self._client, value, path, self._calls)
        return value

    def __repr__(self) -> str:
        return f"durable.llm.wrap({self._target!r})"


def _method(create: Callable[..., Any], endpoint: _Endpoint, calls: _Calls) -> Callable[..., Any]:
    """The wrapped `create`: a step named after the endpoint, sync or async like the
    client. The price is looked up first, so an unpriced model fails before any request."""
    is_async = calls.is_async

    def charged(
        data: dict[str, Any] | list[dict[str, Any]], stream: bool, price: Price | None
    ) -> None:
        usage = endpoint.stream_usage(data) if stream else endpoint.usage(data)  # type: ignore[arg-type]
        scope = current_step.get()
        if scope is None or not scope.charging:
            return  # outside a workflow: a plain call, nothing to charge
        dollars = 0.0 if price is None else float(price.dollars(usage))
        charge(dollars=dollars, tokens=usage.total)

    if is_async:

        async def call_async(request: dict[str, Any], price: Price | None) -> Any:
            stream = bool(request.get("stream"))
            response = await create(**request)
            if stream:
                data: Any = [_dump(chunk) async for chunk in response]
            else:
                data = _dump(response)
            charged(data, stream, price)
            return data

        defn = StepDef(endpoint.step_name, call_async, StepKind.STEP)

        @functools.wraps(create)
        async def wrapped_async(**request: Any) -> Any:
            price = calls.price(request.get("model"))
            if request.get("stream"):
                request = endpoint.stream_options(request)
            data = await _driver_async.call_step(defn, (request, price), {})
            if request.get("stream"):
                return _aiterate(data, endpoint)
            return endpoint.rebuild(data)

        return wrapped_async

    def call(request: dict[str, Any], price: Price | None) -> Any:
        stream = bool(request.get("stream"))
        response = create(**request)
        if stream:
            data: Any = [_dump(chunk) for chunk in response]
        else:
            data = _dump(response)
        charged(data, stream, price)
        return data

    sync_defn = StepDef(endpoint.step_name, call, StepKind.STEP)

    @functools.wraps(create)
    def wrapped(**request: Any) -> Any:
        price = calls.price(request.get("model"))
        if request.get("stream"):
            request = endpoint.stream_options(request)
        data = _driver.call_step(sync_defn, (request, price), {})
        if request.get("stream"):
            return _iterate(data, endpoint)
        return endpoint.rebuild(data)

    return wrapped


def _dump(obj: Any) -> Any:
    """What the server sent, as JSON (fields it left out stay out)."""
    return obj.model_dump(mode="json", exclude_unset=True)


def _iterate(chunks: list[dict[str, Any]], endpoint: _Endpoint) -> Iterator[Any]:
    for chunk in chunks:
        yield endpoint.rebuild_chunk(chunk)


async def _aiterate(chunks: list[dict[str, Any]], endpoint: _Endpoint) -> AsyncIterator[Any]:
    for chunk in chunks:
        yield endpoint.rebuild_chunk(chunk)
