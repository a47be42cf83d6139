"""durable.llm in one process, against the local model stub: a replay sends nothing, an
unpriced model fails before any request, a model priced None is charged tokens only, and
outside a workflow the wrapped client is the plain client. A reply without usage (a proxy
that drops it) fails the call under a dollar or token limit and is charged nothing without
one; a usage that is not a count of tokens fails it, naming the server's field."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

import durable
from durable import errors, llm
from tests.apps.model_stub import ModelStub, usage_of


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    server = ModelStub().start()
    yield server
    server.stop()


def test_a_replay_sends_no_request_and_an_unpriced_model_sends_none(
    database_url: str, stub: ModelStub
) -> None:
    reg = durable.Registry()
    client = llm.wrap(
        openai.OpenAI(base_url=stub.url, api_key="test", max_retries=0),
        prices={"local-model": None, "gpt-4o-mini": llm.Price(0.15, 0.60)},
    )
    fail = {"once": True}

    @durable.step(registry=reg)
    def flaky() -> None:
        if fail["once"]:
            raise RuntimeError("after the model calls")

    @durable.workflow(registry=reg, budget=durable.Budget(tokens=10_000))
    def agent() -> list[str]:
        text = client.chat.completions.create(
            model="local-model",
            messages=[{"role": "user", "content": "plan"}],
            max_completion_tokens=100,
        )
        chunks = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "write"}],
            max_completion_tokens=100,
            stream=True,
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        flaky()
        return [text.choices[0].message.content or "", streamed]

    @durable.workflow(registry=reg)
    def unpriced() -> None:
        client.chat.completions.create(model="mystery-1", messages=[])

    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(errors.WorkflowFailedError):
            engine.start(agent, workflow_id="agent").result(timeout=20)
        assert stub.count() == 2
        fail["once"] = False
        assert engine.resume("agent").result(timeout=20) == ["answer to plan", "answer to write"]
        assert stub.count() == 2  # replayed: the stream too
        ledger = engine.budget("agent")
        assert ledger is not None
        assert ledger["spent"]["tokens"] == sum(usage_of("plan")) + sum(usage_of("write"))
        tin, tout = usage_of("write")  # local-model is priced None: tokens only
        assert ledger["spent"]["dollars"] == pytest.approx((0.15 * tin + 0.60 * tout) / 1e6)
        names = [s.step_name for s in engine.steps("agent")]
        assert names[:2] == ["openai.chat.completions.create"] * 2

        with pytest.raises(errors.WorkflowFailedError, match="UnknownModelPriceError"):
            engine.start(unpriced, workflow_id="unpriced").result(timeout=20)
        assert stub.count() == 2  # nothing was sent
        assert engine.steps("unpriced") == []  # nothing was stored

    # Outside a workflow: the plain client (no engine needed, nothing charged).
    plain = client.chat.completions.create(
        model="local-model", messages=[{"role": "user", "content": "hello"}]
    )
    assert plain.choices[0].message.content == "answer to hello"
    assert isinstance(client.models, openai.resources.Models)  # the rest passes through
    with pytest.raises(errors.ConfigurationError, match="openai or anthropic"):
        llm.wrap(object())


# -- usage the server left out, or that is not a count --------------------------------------------

PRICES: dict[str, llm.Price | None] = {"paid-model": llm.Price(1.00, 2.00), "free-model": None}
ENDPOINTS = [
    pytest.param(endpoint, stream, id=f"{endpoint}{'-stream' if stream else ''}")
    for endpoint in ("chat", "responses", "messages")
    for stream in (False, True)
]

Agents = dict[str, Any]


def agents(reg: durable.Registry, stub: ModelStub, name: str, budget: durable.Budget) -> Agents:
    """A sync and an async workflow (`name`, `name-async`) under `budget`, each making one
    model call through a wrapped client: `endpoint` is chat, responses or messages."""
    oa = llm.wrap(openai.OpenAI(base_url=stub.url, api_key="t", max_retries=0), prices=PRICES)
    oa_async = llm.wrap(
        openai.AsyncOpenAI(base_url=stub.url, api_key="t", max_retries=0), prices=PRICES
    )
    base = stub.url.removesuffix("/v1")
    an = llm.wrap(anthropic.Anthropic(base_url=base, api_key="t", max_retries=0), prices=PRICES)
    an_async = llm.wrap(
        anthropic.AsyncAnthropic(base_url=base, api_key="t", max_retries=0), prices=PRICES
    )
    messages = [{"role": "user", "content": "hi"}]

    @durable.workflow(registry=reg, name=name, budget=budget)
    def ask(endpoint: str, stream: bool, model: str) -> str:
        if endpoint == "chat":
            reply = oa.chat.completions.create(
                model=model, messages=messages, max_completion_tokens=9, stream=stream
            )
        elif endpoint == "responses":
            reply = oa.responses.create(model=model, input="hi", max_output_tokens=9, stream=stream)
        else:
            reply = an.messages.create(model=model, max_tokens=9, messages=messages, stream=stream)
        return str(len(list(reply)) if stream else type(reply).__name__)

    @durable.workflow(registry=reg, name=f"{name}-async", budget=budget)
    async def ask_async(endpoint: str, stream: bool, model: str) -> str:
        if endpoint == "chat":
            reply = await oa_async.chat.completions.create(
                model=model, messages=messages, max_completion_tokens=9, stream=stream
            )
        elif endpoint == "responses":
            reply = await oa_async.responses.create(
                model=model, input="hi", max_output_tokens=9, stream=stream
            )
        else:
            reply = await an_async.messages.create(
                model=model, max_tokens=9, messages=messages, stream=stream
            )
        return str(len([c async for c in reply]) if stream else type(reply).__name__)

    return {"sync": ask, "async": ask_async}


def outcome(engine: durable.Engine, agent: Any, workflow_id: str, *args: Any) -> Any:
    """What the workflow returned, or the WorkflowFailedError it ended with."""
    try:
        return engine.start(agent, *args, workflow_id=workflow_id).result(timeout=30)
    except errors.WorkflowFailedError as failed:
        return failed


def spent(engine: durable.Engine, workflow_id: str) -> tuple[float, int]:
    ledger = engine.budget(workflow_id)
    assert ledger is not None
    return ledger["spent"]["dollars"], ledger["spent"]["tokens"]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("endpoint", "stream"), ENDPOINTS)
def test_a_reply_without_usage_fails_the_call_under_a_dollar_or_token_limit(
    database_url: str, mode: str, endpoint: str, stream: bool
) -> None:
    stub = ModelStub(usage=lambda usage: None).start()  # a proxy that drops usage
    try:
        reg = durable.Registry()
        dollars = agents(reg, stub, "dollars", durable.Budget(dollars=5.0))[mode]
        tokens = agents(reg, stub, "tokens", durable.Budget(tokens=100_000))[mode]
        with durable.Engine(database_url, registry=reg) as engine:
            failed = [
                outcome(engine, dollars, "d", endpoint, stream, "paid-model"),
                # Priced None: only a token limit needs the usage.
                outcome(engine, tokens, "t", endpoint, stream, "free-model"),
            ]
            assert [spent(engine, "d"), spent(engine, "t")] == [(0.0, 0), (0.0, 0)]
            steps = engine.steps("d")
    finally:
        stub.stop()
    for error, limit in zip(failed, ["dollar", "token"], strict=True):
        assert isinstance(error, errors.WorkflowFailedError), error
        assert error.error_type == "durable.errors.ModelUsageError"
        assert "usage" in error.error_message
        assert f"the workflow's {limit} limit" in error.error_message
        assert "the request was sent" in error.error_message
    assert stub.count() == 2  # one request each: the call was not retried
    assert len(steps) == 1 and steps[0].error is not None  # the call is journaled as failed


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("endpoint", "stream"), ENDPOINTS)
def test_a_reply_without_usage_is_charged_nothing_without_such_a_limit(
    database_url: str, mode: str, endpoint: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="durable.llm")
    stub = ModelStub(usage=lambda usage: None).start()
    try:
        reg = durable.Registry()
        steps_only = agents(reg, stub, "steps", durable.Budget(steps=10))[mode]
        dollars = agents(reg, stub, "dollars", durable.Budget(dollars=5.0))[mode]
        with durable.Engine(database_url, registry=reg) as engine:
            results = [
                outcome(engine, steps_only, "s", endpoint, stream, "paid-model"),
                # A dollar limit and a model priced None: its tokens cost no dollars.
                outcome(engine, dollars, "d", endpoint, stream, "free-model"),
            ]
            assert [spent(engine, "s"), spent(engine, "d")] == [(0.0, 0), (0.0, 0)]
    finally:
        stub.stop()
    assert not any(isinstance(r, errors.WorkflowFailedError) for r in results), results
    assert stub.count() == 2
    said = [r.getMessage() for r in caplog.records if r.name == "durable.llm"]
    assert len(said) == 2 and all("no dollar or token limit needs it" in m for m in said), said


def test_a_reply_that_leaves_out_one_count_names_it(database_url: str) -> None:
    # Input tokens left out (output kept), and cached tokens left out (optional: charged
    # at the full input price, which is never less).
    def no_input(usage: dict[str, Any]) -> dict[str, Any]:
        usage.pop("prompt_tokens", None)
        usage.pop("input_tokens", None)
        usage.pop("prompt_tokens_details", None)
        usage.pop("input_tokens_details", None)
        return usage

    stub = ModelStub(usage=no_input).start()
    try:
        reg = durable.Registry()
        ask = agents(reg, stub, "dollars", durable.Budget(dollars=5.0))
        with durable.Engine(database_url, registry=reg) as engine:
            failed = {
                (endpoint, stream): outcome(
                    engine, ask["sync"], f"{endpoint}-{stream}", endpoint, stream, "paid-model"
                )
                for endpoint in ("chat", "responses", "messages")
                for stream in (False, True)
            }
    finally:
        stub.stop()
    fields = {
        "chat": "usage.prompt_tokens",
        "responses": "usage.input_tokens",
        "messages": "usage.input_tokens",
    }
    for (endpoint, _), error in failed.items():
        assert isinstance(error, errors.WorkflowFailedError), error
        assert error.error_type == "durable.errors.ModelUsageError"
        assert f"has no {fields[endpoint]}," in error.error_message


def _set(field: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def rewrite(usage: dict[str, Any]) -> dict[str, Any]:
        if field in usage:
            usage[field] = value
        return usage

    return rewrite


def _cached_over_input(usage: dict[str, Any]) -> dict[str, Any]:
    if "prompt_tokens" in usage:
        usage["prompt_tokens_details"] = {"cached_tokens": usage["prompt_tokens"] + 1_000_000}
    return usage


BAD_USAGE = [
    pytest.param(_set("prompt_tokens", -5), "usage.prompt_tokens", "-5", id="negative"),
    pytest.param(_set("prompt_tokens", "lots"), "usage.prompt_tokens", "'lots'", id="string"),
    pytest.param(_set("prompt_tokens", 12.5), "usage.prompt_tokens", "12.5", id="fraction"),
    pytest.param(_set("prompt_tokens", {"n": 1}), "usage.prompt_tokens", "{'n': 1}", id="dict"),
    pytest.param(lambda usage: "lots", "usage is 'lots', not an object", "", id="not-an-object"),
    pytest.param(
        _set("completion_tokens", float("inf")), "usage.completion_tokens", "inf", id="infinite"
    ),
    pytest.param(
        _set("completion_tokens", 1e300), "usage.completion_tokens", "1e+300", id="huge-float"
    ),
    pytest.param(
        _set("completion_tokens", 10**30),
        "usage.completion_tokens",
        str(10**30),
        id="past-the-ledger",
    ),
    pytest.param(
        _cached_over_input,
        "usage.prompt_tokens_details.cached_tokens",
        str(usage_of("hi")[0] + 1_000_000),
        id="more-cached-than-input",
    ),
    pytest.param(_set("output_tokens", -1), "usage.output_tokens", "-1", id="anthropic-negative"),
]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("rewrite", "field", "shown"), BAD_USAGE)
def test_usage_that_is_not_a_count_of_tokens_names_the_servers_field(
    database_url: str,
    mode: str,
    rewrite: Callable[[dict[str, Any]], dict[str, Any]],
    field: str,
    shown: str,
) -> None:
    # Even with no dollar or token limit: such a reply is broken, whatever it is charged to.
    endpoint = "messages" if field == "usage.output_tokens" else "chat"
    stub = ModelStub(usage=rewrite).start()
    try:
        reg = durable.Registry()
        ask = agents(reg, stub, "steps", durable.Budget(steps=10))[mode]
        with durable.Engine(database_url, registry=reg) as engine:
            failed = [
                outcome(engine, ask, f"w-{stream}", endpoint, stream, "paid-model")
                for stream in (False, True)
            ]
            assert [spent(engine, "w-False"), spent(engine, "w-True")] == [(0.0, 0), (0.0, 0)]
    finally:
        stub.stop()
    for error in failed:
        assert isinstance(error, errors.WorkflowFailedError), error
        assert error.error_type == "durable.errors.ModelUsageError", error.error_message
        assert field in error.error_message
        assert shown in error.error_message


@pytest.mark.parametrize(
    "rates",
    [(-1.0, 2.0, None), (1.0, float("nan"), None), (1.0, 2.0, float("inf")), ("1", 2.0, None),
     (True, 2.0, None), (1.0, 2.0, -0.5)],
    ids=["negative", "nan", "infinite-cached", "string", "bool", "negative-cached"],
)  # fmt: skip
def test_a_price_that_is_not_one_is_refused_where_it_is_written(rates: tuple[Any, ...]) -> None:
    # Not after the request was sent, inside the step that charges it.
    with pytest.raises(errors.InvalidBudgetError, match="dollars per million tokens"):
        llm.Price(*rates)


@pytest.mark.parametrize(
    ("prices", "named"),
    [({"gpt-4o": 3.0}, "'gpt-4o'"), ({"": llm.Price(1, 1)}, "''"), ({5: None}, "5")],
)
def test_a_price_table_that_is_not_one_is_refused_by_wrap(prices: Any, named: str) -> None:
    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="t")
    with pytest.raises(errors.ConfigurationError, match=named):
        llm.wrap(client, prices=prices)


# -- the cap decides before the vendor is paid ----------------------------------------------------

# $0.01 a token: "q<i>" costs 114 + 22 tokens at the stub, $1.36. Its worst case, set aside
# before it is sent, is the request's size (under 100 bytes: a token is at least one
# byte of text) plus max_completion_tokens=100: under $2.
DEAR = {"dear-model": llm.Price(10_000.0, 10_000.0)}


def _wait_suspended(engine: durable.Engine, workflow_id: str) -> None:
    deadline = time.monotonic() + 30
    while engine.get_workflow(workflow_id).status != "SUSPENDED":
        assert time.monotonic() < deadline, engine.get_workflow(workflow_id)
        time.sleep(0.05)


def _prompts(stub: ModelStub) -> list[str]:
    return [str(body["messages"][-1]["content"]) for _, body in stub.requests]


def test_a_call_the_cap_cannot_cover_is_not_sent_and_none_is_sent_twice(
    database_url: str, stub: ModelStub
) -> None:
    """Two calls of $1.36 in sequence under $2.50: the second's worst case does not fit
    beside the first's cost, so it waits at the gate unsent; raised, the workflow finishes
    with each request sent once, and every request the vendor saw is charged."""
    reg = durable.Registry()
    client = llm.wrap(openai.OpenAI(base_url=stub.url, api_key="t", max_retries=0), prices=DEAR)

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=2.5))
    def two() -> list[str]:
        return [
            str(
                client.chat.completions.create(
                    model="dear-model",
                    messages=[{"role": "user", "content": f"q{i}"}],
                    max_completion_tokens=100,
                )
                .choices[0]
                .message.content
            )
            for i in range(2)
        ]

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(two, workflow_id="two")
        _wait_suspended(engine, "two")
        assert _prompts(stub) == ["q0"]  # the second was not sent
        assert spent(engine, "two") == (1.36, 136)  # what the vendor was paid, to the cent
        engine.raise_budget("two", dollars=5.0)
        assert handle.result(timeout=30) == ["answer to q0", "answer to q1"]
        assert _prompts(stub) == ["q0", "q1"]  # none twice
        assert spent(engine, "two") == (2.72, 272)


def test_gathered_calls_past_the_cap_are_not_sent_and_none_is_sent_twice(
    database_url: str, stub: ModelStub
) -> None:
    """Five gathered calls under $4: two worst cases fit, so two requests are sent and
    charged and three wait at the gate unsent; raised, the three are sent, once each."""
    reg = durable.Registry()
    client = llm.wrap(
        openai.AsyncOpenAI(base_url=stub.url, api_key="t", max_retries=0), prices=DEAR
    )

    async def one(i: int) -> str:
        reply = await client.chat.completions.create(
            model="dear-model",
            messages=[{"role": "user", "content": f"q{i}"}],
            max_completion_tokens=100,
        )
        return str(reply.choices[0].message.content)

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=4.0))
    async def fan_out() -> list[str]:
        return list(await asyncio.gather(*(one(i) for i in range(5))))

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(fan_out, workflow_id="fan")
        _wait_suspended(engine, "fan")
        assert stub.count() == 2
        assert spent(engine, "fan") == (2.72, 272)  # both requests sent, both charged
        engine.raise_budget("fan", dollars=10.0)
        assert handle.result(timeout=30) == [f"answer to q{i}" for i in range(5)]
        assert sorted(_prompts(stub)) == [f"q{i}" for i in range(5)]  # none twice
        assert spent(engine, "fan") == (6.8, 680)


def test_a_reply_that_costs_more_than_was_set_aside_is_kept_and_charged_past_the_cap(
    database_url: str, stub: ModelStub
) -> None:
    """The stub counts 7 tokens a character of the prompt, more than its bytes: the reply
    costs more than was set aside and takes the total past the cap. It was paid for, so it
    is charged and journaled, never sent again; the next call waits at the budget gate."""
    reg = durable.Registry()
    client = llm.wrap(
        openai.OpenAI(base_url=stub.url, api_key="t", max_retries=0), prices={"m": None}
    )
    long = "x" * 40  # 380 + 60 tokens

    @durable.workflow(registry=reg, budget=durable.Budget(tokens=300))
    def over(prompts: list[str]) -> int:
        for p in prompts:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": p}], max_completion_tokens=10
            )
        return len(prompts)

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(over, [long, "q1"], workflow_id="over")
        _wait_suspended(engine, "over")
        assert _prompts(stub) == [long]
        assert spent(engine, "over") == (0.0, 440)  # past the cap: it was paid for
        assert [s.step_seq for s in engine.steps("over")] == [0]
        assert [g["name"] for g in engine.list_approvals("over")] == ["budget@1"]
        engine.raise_budget("over", tokens=1000)
        assert handle.result(timeout=30) == 2
        assert _prompts(stub) == [long, "q1"]
        assert spent(engine, "over") == (0.0, 440 + 136)


def test_a_call_with_no_output_bound_under_a_cap_is_refused_unsent(
    database_url: str, stub: ModelStub
) -> None:
    """With no max_tokens there is no worst case to set aside: under a limit the call's
    cost counts against, it fails before it is sent, naming the fix. Without such a limit
    (steps only; a dollar limit and a model priced None) it is sent as before."""
    reg = durable.Registry()
    prices: dict[str, llm.Price | None] = {"paid-model": llm.Price(1.0, 2.0), "free-model": None}
    oa = llm.wrap(openai.OpenAI(base_url=stub.url, api_key="t", max_retries=0), prices=prices)
    messages = [{"role": "user", "content": "hi"}]

    def call(endpoint: str, model: str) -> None:
        if endpoint == "chat":
            oa.chat.completions.create(model=model, messages=messages)
        else:
            oa.responses.create(model=model, input="hi")

    @durable.workflow(registry=reg, name="dollars", budget=durable.Budget(dollars=5.0))
    def dollars(endpoint: str, model: str) -> None:
        call(endpoint, model)

    @durable.workflow(registry=reg, name="tokens", budget=durable.Budget(tokens=100_000))
    def tokens(endpoint: str, model: str) -> None:
        call(endpoint, model)

    @durable.workflow(registry=reg, name="steps", budget=durable.Budget(steps=10))
    def steps(endpoint: str, model: str) -> None:
        call(endpoint, model)

    with durable.Engine(database_url, registry=reg) as engine:
        refused = {
            (endpoint, name): outcome(engine, wf, f"{name}-{endpoint}", endpoint, "paid-model")
            for endpoint in ("chat", "responses")
            for name, wf in (("dollar", dollars), ("token", tokens))
        }
        assert stub.count() == 0
        assert outcome(engine, steps, "s", "chat", "paid-model") is None
        assert outcome(engine, dollars, "d-free", "chat", "free-model") is None
        assert stub.count() == 2
    bound = {"chat": "max_completion_tokens", "responses": "max_output_tokens"}
    for (endpoint, limit), error in refused.items():
        assert isinstance(error, errors.WorkflowFailedError), error
        assert error.error_type == "durable.errors.UnboundedModelCallError"
        assert f"the workflow's {limit} limit" in error.error_message
        assert f"{bound[endpoint]}=" in error.error_message
        assert "nothing was sent" in error.error_message


def test_each_endpoints_output_bound_and_the_prompts_size() -> None:
    # The bound the request gives, for each choice; the SDK's NOT_GIVEN or a non-count is none.
    assert llm._openai_chat_bound({"max_completion_tokens": 10, "n": 3}) == 30
    assert llm._openai_chat_bound({"max_tokens": 10, "max_completion_tokens": 20}) == 20
    assert llm._openai_chat_bound({"max_completion_tokens": openai.NOT_GIVEN}) is None
    assert llm._openai_chat_bound({"max_completion_tokens": True}) is None
    assert llm._openai_responses_bound({"max_output_tokens": 7, "max_tokens": 99}) == 7
    assert llm._anthropic_bound({"max_tokens": 5}) == 5
    # The size is never less than the prompt's UTF-8 bytes (a token is at least one byte).
    for text in ("plain words", "naïve café", "日本語のテキスト", "emoji \U0001f600"):
        request = {"model": "m", "messages": [{"role": "user", "content": text}]}
        assert llm._prompt_tokens(request) >= len(text.encode())
    assert llm._prompt_tokens({"model": "m", "timeout": object(), 1: "key"}) > 0
