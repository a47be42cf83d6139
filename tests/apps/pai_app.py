"""A pydantic-ai agent with a scripted model (FunctionModel) and two tools, made durable
by durable.integrations.pydantic_ai. Every model call and tool call is written to the
`agent_world` table (what really happened, whatever crashes).

    python -m tests.apps.pai_app WORKFLOW_ID      (DURABLE_CRASH_POINTS to die mid-run)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import psycopg
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import durable
from durable.integrations.pydantic_ai import DurableAgent
from durable.llm import Price

registry = durable.Registry()


def world(what: str) -> None:
    with psycopg.connect(os.environ["DURABLE_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS agent_world (id bigserial, what text, pid int)")
        conn.execute("INSERT INTO agent_world (what, pid) VALUES (%s, %s)", [what, os.getpid()])


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Look up the tides, then the moon, then answer (by how many tool results it has)."""
    done = sum(1 for m in messages for p in getattr(m, "parts", []) if p.part_kind == "tool-return")
    world(f"model:{done}")
    if done == 0:
        return ModelResponse(parts=[ToolCallPart("lookup", {"topic": "tides"})])
    if done == 1:
        return ModelResponse(parts=[ToolCallPart("lookup", {"topic": "moon"})])
    return ModelResponse(parts=[TextPart("the moon pulls the tides")])


agent = Agent(
    FunctionModel(script, model_name="scripted"),
    name="researcher",
    capabilities=[DurableAgent(name="researcher", prices={"scripted": Price(1.0, 2.0)})],
)


@agent.tool_plain
def lookup(topic: str) -> str:
    world(f"tool:{topic}")
    return f"facts about {topic}"


@durable.workflow(registry=registry, name="pai.research", budget=durable.Budget(dollars=5.0))
async def research(question: str) -> str:
    result = await agent.run(question)
    return result.output


async def main(workflow_id: str) -> None:
    url = os.environ["DURABLE_DATABASE_URL"]
    async with durable.Engine(url, registry=registry, lease_seconds=1) as engine:
        handle = await engine.start_async(research, "why tides?", workflow_id=workflow_id)
        print(json.dumps(await handle.result(timeout=60)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
