"""An OpenAI Agents SDK agent (a real OpenAIResponsesModel talking to the local ModelStub,
two tool calls) made durable by durable.integrations.openai_agents. Every tool call is
written to the `agent_world` table (what really happened, whatever crashes); the stub, in
the test's process, counts the model requests.

    MODEL_STUB_URL=... python -m tests.apps.oa_app WORKFLOW_ID   (DURABLE_CRASH_POINTS to die)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import psycopg
from agents import Agent, OpenAIResponsesModel, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

import durable
from durable.integrations.openai_agents import DurableRunner
from durable.llm import Price

registry = durable.Registry()
runner = DurableRunner(prices={"stub-model": Price(1.0, 2.0)})
ANSWER = "the moon pulls the tides"
TOPICS = ["tides", "moon"]

set_tracing_disabled(True)  # no trace export: nothing leaves the machine


def world(what: str) -> None:
    with psycopg.connect(os.environ["DURABLE_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS agent_world (id bigserial, what text, pid int)")
        conn.execute("INSERT INTO agent_world (what, pid) VALUES (%s, %s)", [what, os.getpid()])


def tool_results(body: dict[str, Any]) -> int:
    """How many tool results a /v1/responses request carries."""
    items = body.get("input")
    if not isinstance(items, list):
        return 0
    return sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")


def call(n: int, topic: str) -> dict[str, Any]:
    arguments = json.dumps({"topic": topic})
    return {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
            "name": "lookup", "arguments": arguments, "status": "completed"}  # fmt: skip


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def script(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The model, served by ModelStub(reply=script): look up the tides, then the moon
    (by how many tool results it has), then answer."""
    done = tool_results(body)
    if done < len(TOPICS):
        return [call(done, TOPICS[done])]
    return [message(ANSWER)]


@function_tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    world(f"tool:{topic}")
    return f"facts about {topic}"


def make_agent() -> Agent[Any]:
    client = AsyncOpenAI(base_url=os.environ["MODEL_STUB_URL"], api_key="stub", max_retries=0)
    model = OpenAIResponsesModel("stub-model", client)
    return Agent(name="researcher", instructions="Answer briefly.", model=model, tools=[lookup])


@durable.workflow(registry=registry, name="oa.research", budget=durable.Budget(dollars=5.0))
async def research(question: str) -> str:
    result = await runner.run(make_agent(), question)
    return str(result.final_output)


async def main(workflow_id: str) -> None:
    url = os.environ["DURABLE_DATABASE_URL"]
    async with durable.Engine(url, registry=registry, lease_seconds=1) as engine:
        handle = await engine.start_async(research, "why tides?", workflow_id=workflow_id)
        print(json.dumps(await handle.result(timeout=60)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
