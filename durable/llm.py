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

Under a dollar or token limit a call is decided before it is sent. Its worst case is set
aside from what the budget has left: the request's size as input tokens (a token of text
is at least one byte), plus its own bound on its output (`max_completion_tokens` or
`max_tokens` for chat completions, times `n`; `max_output_tokens` for responses;
`max_tokens` for messages), at the model's dearer input rate and its output rate. If that
does not fit, nothing is sent and the step waits at the budget gate. A call with no
output bound has no worst case: under a limit its cost counts against, it fails unsent
with `UnboundedModelCallError`, naming the parameter to pass. A reply that was sent is
then charged what it really used, even past the cap (it was paid for: it is journaled,
never thrown away to be sent again), and the budget gate stops the next step. Only what
the size estimate misses can pass the cap: an image or a file given by URL or id, whose
reference is short and whose tokens are not.

A reply's usage is checked before it is charged. A count that is not a whole number of
tokens (negative, a string, a fraction, more cached tokens than input) fails the call with
`ModelUsageError` naming the server's field (`usage.prompt_tokens`). A reply that leaves
its usage out (a proxy that drops it, a server that reports none for streams) fails the
call the same way when the workflow's budget has a token limit, or a dollar limit and the
model a price: charging nothing would let it spend past the limit. Without such a limit
the call goes on, charged only the tokens that were reported (none for what was left
out), and a warning is logged once per client and field. Either way the request was sent.

Prices are dollars per million tokens per model, matched by the longest model-name prefix.
`DEFAULT_PRICES` lists a few models' list prices as published on `PRICES_AS_OF`: vendors
change them, so pass your own table (`prices=`) for anything that matters. A model with
no price raises `UnknownModelPriceError` before the request is made; `prices={"my-model":
None}` charges its tokens without dollars.

Install the SDKs with `pip install 'durable-pg[llm]'`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from durable._base import labels
from durable._run import llm_steps, llm_steps_async
from durable._run.budget import call_limit, reserve_call, settle
from durable._run.context import current_step
from durable.errors import (
    ConfigurationError,
    InvalidBudgetError,
    ModelUsageError,
    UnknownModelPriceError,
)

__all__ = ["DEFAULT_PRICES", "PRICES_AS_OF", "Price", "Usage", "wrap"]

logger = logging.getLogger("durable.llm")


@dataclass(frozen=True)
class Price:
    """Dollars per million tokens. `cached_input` defaults to the input price."""

    input: float
    output: float
    cached_input: float | None = None

    def __post_init__(self) -> None:
        # Checked here, not when a reply is charged: by then the request was sent.
        for name in ("input", "output", "cached_input"):
            rate = getattr(self, name)
            if rate is None and name == "cached_input":
                continue
            if (
                isinstance(rate, bool)
                or not isinstance(rate, int | float | Decimal)
                or not math.isfinite(rate)
                or rate < 0
            ):
                raise InvalidBudgetError(
                    f"Price({name}={rate!r}): give dollars per million tokens, a number of "
                    "zero or more"
                )

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
    """One wrapped method: where it is on the client, what its step is called (a name
    journals store: see _labels), how its response and stream are rebuilt and where their
    usage is."""

    path: tuple[str, ...]
    step_name: str
    rebuild: Callable[[Any], Any]
    rebuild_chunk: Callable[[Any], Any]
    usage: Callable[[Any], _Reading]
    stream_usage: Callable[[list[Any]], _Reading]
    # The request's bound on its output tokens (None: it has none), and the parameter
    # that gives it, named when a call under a limit leaves it out.
    output_bound: Callable[[dict[str, Any]], int | None]
    bound_field: str
    stream_options: Callable[[dict[str, Any]], dict[str, Any]] = lambda request: request


# The largest count of tokens one reply may report: the largest whole number every JSON
# reader keeps exactly (and far below what the ledger's sums can hold).
_MAX_TOKENS = 2**53 - 1


class _NotACount(Exception):
    """A count the server sent that is not a count of tokens (turned into ModelUsageError,
    which names the step, by the caller)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass
class _Reading:
    """The usage read from one reply, and the required counts the server left out, each
    as (field, what is missing where: "the response has no usage.prompt_tokens")."""

    usage: Usage = Usage()
    missing: list[tuple[str, str]] = field(default_factory=list)


def _at(value: Any, key: str) -> Any:
    """`value[key]` of a dict, or the field `key` of an SDK object as the server sent it
    (the SDKs build their objects without validating them, so a count keeps the type the
    server gave it; their JSON dump would turn `true` into 1 and `Infinity` into null)."""
    if isinstance(value, dict):
        return value.get(key)
    return getattr(value, key, None)


def _is_object(value: Any) -> bool:
    return isinstance(value, dict) or hasattr(type(value), "model_fields")


def _count(data: Any, path: str, where: str, missing: list[tuple[str, str]] | None) -> int:
    """The count at `path` (dotted) in `data`: 0 if it is not there (noted in `missing`
    when it is required, by the first part of the path that is not there). A value there
    that is not a whole number from 0 to _MAX_TOKENS (or a part of the path that is not an
    object) is an error naming the field."""
    value: Any = data
    keys = path.split(".")
    for i, key in enumerate(keys):
        value = _at(value, key)
        here = ".".join(keys[: i + 1])
        if value is None:
            if missing is not None and all(f != here for f, _ in missing):
                missing.append((here, f"{where} has no {here}"))
            return 0
        if i < len(keys) - 1 and not _is_object(value):
            raise _NotACount(here, f"{where}'s {here} is {value!r:.80}, not an object")
    sent = value
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 12.0: a count all the same
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TOKENS:
        raise _NotACount(
            path,
            f"{where}'s {path} is {sent!r:.80}, not a count of tokens (a whole number from 0 "
            f"to {_MAX_TOKENS})",
        )
    return value


def _reading(
    data: Any,
    where: str,
    input_field: str,
    output_field: str,
    cached_field: str,
    also_input: tuple[str, ...] = (),
) -> _Reading:
    """Input, output and cached input tokens of one usage object. Input and output are
    required; the cached count is optional (left out, the input is charged at the full
    input price, which is never less). `also_input` are optional counts that add to the
    input (Anthropic reports cache reads and writes beside `input_tokens`)."""
    missing: list[tuple[str, str]] = []
    tokens_in = _count(data, input_field, where, missing)
    tokens_out = _count(data, output_field, where, missing)
    cached = _count(data, cached_field, where, None)
    tokens_in += sum(_count(data, name, where, None) for name in also_input)
    if cached > tokens_in:
        raise _NotACount(
            cached_field,
            f"{where}'s {cached_field} is {cached}, more than its {tokens_in} input tokens "
            f"({input_field})",
        )
    return _Reading(Usage(tokens_in, tokens_out, cached), missing)


def _openai_chat_usage(data: Any, where: str = "the response") -> _Reading:
    return _reading(
        data,
        where,
        "usage.prompt_tokens",
        "usage.completion_tokens",
        "usage.prompt_tokens_details.cached_tokens",
    )


def _openai_chat_stream_usage(chunks: list[Any]) -> _Reading:
    for chunk in reversed(chunks):
        if _at(chunk, "usage") is not None:
            return _openai_chat_usage(chunk, "the stream's last chunk with usage")
    return _Reading(missing=[("usage", "the stream has no chunk with usage")])


def _include_usage(request: dict[str, Any]) -> dict[str, Any]:
    """A streamed chat completion reports its usage only when asked to."""
    options = dict(request.get("stream_options") or {})
    options.setdefault("include_usage", True)
    return {**request, "stream_options": options}


def _openai_responses_usage(data: Any, where: str = "the response") -> _Reading:
    return _reading(
        data,
        where,
        "usage.input_tokens",
        "usage.output_tokens",
        "usage.input_tokens_details.cached_tokens",
    )


def _openai_responses_stream_usage(events: list[Any]) -> _Reading:
    for event in reversed(events):
        response = _at(event, "response")
        if response is not None and _at(response, "usage") is not None:
            where = f"the stream's {_at(event, 'type')} event's response"
            return _openai_responses_usage(response, where)
    return _Reading(missing=[("response.usage", "the stream has no event with response.usage")])


def _anthropic_usage(data: Any, where: str = "the response") -> _Reading:
    return _reading(
        data,
        where,
        "usage.input_tokens",
        "usage.output_tokens",
        "usage.cache_read_input_tokens",
        also_input=("usage.cache_read_input_tokens", "usage.cache_creation_input_tokens"),
    )


def _anthropic_stream_usage(events: list[Any]) -> _Reading:
    """Input tokens from `message_start`, output tokens from the last `message_delta` that
    has them (the count so far: the start's own is only the first token)."""
    start: _Reading | None = None
    output: int | None = None
    for event in events:
        kind = _at(event, "type")
        if kind == "message_start":
            where = "the stream's message_start event's message"
            start = _anthropic_usage(_at(event, "message") or {}, where)
        elif kind == "message_delta" and _at(_at(event, "usage"), "output_tokens") is not None:
            output = _count(event, "usage.output_tokens", "the stream's message_delta event", None)
    if start is None:
        start = _Reading(missing=[("message_start", "the stream has no message_start event")])
    missing = [m for m in start.missing if m[0] != "usage.output_tokens"]
    if output is None:
        field_ = "usage.output_tokens"
        missing.append((field_, f"the stream has no message_delta event with {field_}"))
    usage = start.usage
    if output is not None:
        usage = Usage(usage.input_tokens, output, usage.cached_input_tokens)
    return _Reading(usage, missing)


def _tokens(value: Any) -> int | None:
    """A whole number of tokens the request gives, or None (left out, or the SDKs'
    NOT_GIVEN, or not a count: the server refuses such a request anyway)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _openai_chat_bound(request: dict[str, Any]) -> int | None:
    """`max_completion_tokens` (or the older `max_tokens`) for each of the `n` choices."""
    given = [
        b
        for b in (_tokens(request.get("max_completion_tokens")), _tokens(request.get("max_tokens")))
        if b is not None
    ]
    if not given:
        return None
    return max(given) * max(1, _tokens(request.get("n")) or 1)


def _openai_responses_bound(request: dict[str, Any]) -> int | None:
    return _tokens(request.get("max_output_tokens"))


def _anthropic_bound(request: dict[str, Any]) -> int | None:
    return _tokens(request.get("max_tokens"))


def _prompt_tokens(request: dict[str, Any]) -> int:
    """The most input tokens a request's text can cost, by its size: the length of its
    JSON with every character past ASCII escaped (six bytes or more, never fewer than its
    UTF-8 bytes), since a token of text is at least one byte; the JSON's names and
    punctuation stand for the few tokens that mark each message. An image or a file
    given by URL or id counts only its reference, so it can cost more."""
    try:
        return len(json.dumps(request, default=str, separators=(",", ":")))
    except (TypeError, ValueError):  # a key that is not a string, a cycle
        return len(repr(request)) * 4


def _worst_rates(price: Price | None) -> tuple[Decimal, Decimal] | None:
    """The dollars per million input and output tokens a call can cost at most: input at
    the dearer of its fresh and cached rates (a reply says which only after the fact)."""
    if price is None:
        return None
    rate_in = Decimal(str(price.input))
    if price.cached_input is not None:
        rate_in = max(rate_in, Decimal(str(price.cached_input)))
    return rate_in, Decimal(str(price.output))


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
            labels.LLM_OPENAI_CHAT,
            _validator("openai.types.chat.ChatCompletion"),
            _validator("openai.types.chat.ChatCompletionChunk"),
            _openai_chat_usage,
            _openai_chat_stream_usage,
            _openai_chat_bound,
            "max_completion_tokens",
            _include_usage,
        ),
        _Endpoint(
            ("responses", "create"),
            labels.LLM_OPENAI_RESPONSES,
            _validator("openai.types.responses.Response"),
            _validator("openai.types.responses.ResponseStreamEvent"),
            _openai_responses_usage,
            _openai_responses_stream_usage,
            _openai_responses_bound,
            "max_output_tokens",
        ),
    ),
    "anthropic": (
        _Endpoint(
            ("messages", "create"),
            labels.LLM_ANTHROPIC_MESSAGES,
            _validator("anthropic.types.Message"),
            _validator("anthropic.types.RawMessageStreamEvent"),
            _anthropic_usage,
            _anthropic_stream_usage,
            _anthropic_bound,
            "max_tokens",
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
    for model, price in table.items():
        if not isinstance(model, str) or not model:
            raise ConfigurationError(
                f"prices: the key {model!r} is not a model's name: give {{name: Price(...)}}"
            )
        if price is not None and not isinstance(price, Price):
            raise ConfigurationError(
                f"prices[{model!r}] = {price!r:.80}: give durable.llm.Price(input=..., "
                "output=...) in dollars per million tokens, or None to charge tokens only"
            )
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
        # (step name, field) pairs already warned about: usage left out, with no limit
        # that needs it.
        self.warned: set[tuple[str, str]] = set()

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
    client. The price is looked up first, so an unpriced model fails before any request.

    Inside the step the call's worst case is set aside before the request is sent (a
    refusal sends nothing: the step waits at the budget gate), and the reply, once sent
    and paid for, is charged what it used even past the cap: it is never thrown away to
    be sent again."""

    def set_aside(request: dict[str, Any], price: Price | None) -> AbstractContextManager[Any]:
        reservation = reserve_call(
            _prompt_tokens(request),
            endpoint.output_bound(request),
            _worst_rates(price),
            endpoint.bound_field,
        )
        return contextlib.nullcontext() if reservation is None else reservation

    def charged(reply: Any, stream: bool, price: Price | None) -> None:
        """Charge what the reply (the SDK's object, or its list of chunks) used."""
        scope = current_step.get()
        if scope is None or not scope.charging:
            return  # outside a workflow: a plain call, nothing to charge
        usage = _usage_to_charge(endpoint, reply, stream, price, calls)
        settle(Decimal(0) if price is None else price.dollars(usage), usage.total)

    if calls.is_async:
        return llm_steps_async.wrapped_async(create, endpoint, calls.price, set_aside, charged)
    return llm_steps.wrapped(create, endpoint, calls.price, set_aside, charged)


def _usage_to_charge(
    endpoint: _Endpoint, reply: Any, stream: bool, price: Price | None, calls: _Calls
) -> Usage:
    """The usage of a reply (the SDK's object, or its list of chunks), to charge.

    A count that is not a count of tokens fails the call (ModelUsageError). A required
    count the server left out fails it too when the workflow's budget has a limit that
    needs it (tokens; dollars, for a priced model): charging nothing would let a proxy
    that drops usage spend past the limit. Without such a limit what was reported is
    charged (nothing for what was left out), with a warning."""
    try:
        reading = endpoint.stream_usage(reply) if stream else endpoint.usage(reply)
    except _NotACount as bad:
        raise ModelUsageError(
            endpoint.step_name,
            bad.field,
            f"{endpoint.step_name}: {bad}, so what the call cost cannot be charged; the "
            "request was sent. Fix the server, or the proxy in front of it, that reports it",
        ) from None
    if not reading.missing:
        return reading.usage
    field_, what = reading.missing[0]
    limit = call_limit(price is not None)
    if limit is not None:
        hint = (
            " (for a streamed chat completion, stream_options={'include_usage': True}, "
            "which durable sets unless the request says otherwise)"
            if stream and endpoint.stream_options is _include_usage
            else ""
        )
        raise ModelUsageError(
            endpoint.step_name,
            field_,
            f"{endpoint.step_name}: {what}, so what the call cost cannot be charged against "
            f"the workflow's {limit} limit; the request was sent. Have the server, or the "
            f"proxy in front of it, report usage{hint}, or run the workflow without a "
            "dollar or token limit",
        )
    if (endpoint.step_name, field_) not in calls.warned:
        calls.warned.add((endpoint.step_name, field_))
        logger.warning(
            "%s: %s; no dollar or token limit needs it, so the call is charged only the "
            "tokens that were reported (this is said once per client and field)",
            endpoint.step_name,
            what,
        )
    return reading.usage
