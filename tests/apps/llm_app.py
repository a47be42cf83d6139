"""Workflows that make four model calls through durable.llm-wrapped clients, pointed at
the test's model stub (LLM_STUB_URL). A run can be SIGKILLed between calls
(DURABLE_CRASH_POINTS) and resumed by `durable worker --app tests.apps.llm_app`.

    python -m tests.apps.llm_app KIND WORKFLOW_ID     KIND: openai | openai-async |
                                                      anthropic | anthropic-async | responses
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import anthropic
import openai

import durable
from durable import llm

registry = durable.Registry()
STUB = os.environ.get("LLM_STUB_URL", "http://127.0.0.1:9/v1")
PRICES = {
    "gpt-4o-mini": llm.Price(0.15, 0.60),
    "claude-sonnet-4": llm.Price(3.00, 15.00),
    # $0.01 a token: "q<i>" costs 114 + 22 tokens at the stub, $1.36, and sets aside its
    # worst case first (the request's size plus max_completion_tokens=100): under $2.
    "dear-model": llm.Price(10_000.0, 10_000.0),
}
BUDGET = durable.Budget(dollars=10.0)

oa = llm.wrap(openai.OpenAI(base_url=STUB, api_key="test", max_retries=0), prices=PRICES)
oa_async = llm.wrap(openai.AsyncOpenAI(base_url=STUB, api_key="test", max_retries=0), prices=PRICES)
an = llm.wrap(
    anthropic.Anthropic(base_url=STUB.removesuffix("/v1"), api_key="test", max_retries=0),
    prices=PRICES,
)
an_async = llm.wrap(
    anthropic.AsyncAnthropic(base_url=STUB.removesuffix("/v1"), api_key="test", max_retries=0),
    prices=PRICES,
)


def prompts(workflow_id: str) -> list[str]:
    return [f"{workflow_id} question {i}" for i in range(4)]


@durable.workflow(registry=registry, budget=BUDGET)
def openai_agent(workflow_id: str, /) -> list[str]:
    out = []
    for p in prompts(workflow_id):
        r = oa.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": p}],
            max_completion_tokens=100,
        )
        out.append(r.choices[0].message.content)
    return out


@durable.workflow(registry=registry, budget=BUDGET)
def responses_agent(workflow_id: str, /) -> list[str]:
    return [
        oa.responses.create(model="gpt-4o-mini", input=p, max_output_tokens=100).output_text
        for p in prompts(workflow_id)
    ]


@durable.workflow(registry=registry, budget=BUDGET)
async def openai_async_agent(workflow_id: str, /) -> list[str]:
    out = []
    for i, p in enumerate(prompts(workflow_id)):
        if i % 2:  # every other call streams
            stream = await oa_async.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": p}],
                max_completion_tokens=100,
                stream=True,
            )
            out.append(
                "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            )
        else:
            r = await oa_async.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": p}],
                max_completion_tokens=100,
            )
            out.append(r.choices[0].message.content or "")
    return out


@durable.workflow(registry=registry, budget=BUDGET)
def anthropic_agent(workflow_id: str, /) -> list[str]:
    out = []
    for i, p in enumerate(prompts(workflow_id)):
        messages = [{"role": "user", "content": p}]
        if i % 2:
            events = an.messages.create(
                model="claude-sonnet-4", max_tokens=100, messages=messages, stream=True
            )
            out.append("".join(e.delta.text for e in events if e.type == "content_block_delta"))
        else:
            r = an.messages.create(model="claude-sonnet-4", max_tokens=100, messages=messages)
            out.append(r.content[0].text)
    return out


@durable.workflow(registry=registry, budget=BUDGET)
async def anthropic_async_agent(workflow_id: str, /) -> list[str]:
    out = []
    for p in prompts(workflow_id):
        r = await an_async.messages.create(
            model="claude-sonnet-4", max_tokens=100, messages=[{"role": "user", "content": p}]
        )
        out.append(r.content[0].text)
    return out


async def _dear(prompt: str) -> str:
    r = await oa_async.chat.completions.create(
        model="dear-model",
        messages=[{"role": "user", "content": prompt}],
        max_completion_tokens=100,
    )
    return r.choices[0].message.content or ""


@durable.workflow(registry=registry, budget=durable.Budget(dollars=2.5))
async def capped_agent(workflow_id: str, /) -> list[str]:
    """Two calls in sequence, then three gathered, under a cap with room for one: each
    call the cap refuses waits at a budget gate until the budget is raised."""
    first = [await _dear(f"q{i}") for i in range(2)]
    return first + list(await asyncio.gather(*(_dear(f"q{i}") for i in range(2, 5))))


AGENTS = {
    "openai": openai_agent,
    "responses": responses_agent,
    "openai-async": openai_async_agent,
    "anthropic": anthropic_agent,
    "anthropic-async": anthropic_async_agent,
}


async def main(kind: str, workflow_id: str) -> None:
    url = os.environ["DURABLE_DATABASE_URL"]
    async with durable.Engine(url, registry=registry, lease_seconds=1) as engine:
        handle = await engine.start_async(AGENTS[kind], workflow_id, workflow_id=workflow_id)
        print(json.dumps(await handle.result(timeout=60)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
