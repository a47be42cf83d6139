"""durable.llm in one process, against the local model stub: a replay sends nothing, an
unpriced model fails before any request, a model priced None is charged tokens only, and
outside a workflow the wrapped client is the plain client."""

from __future__ import annotations

from collections.abc import Iterator

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
            model="local-model", messages=[{"role": "user", "content": "plan"}]
        )
        chunks = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "write"}], stream=True
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
