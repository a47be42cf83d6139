"""A pydantic-ai research agent made durable: a scripted model (no network), a tool that
logs every call it really makes, progress streamed to readers, and a budget with a cap.

Each question costs two model requests (one asks for the tool, one answers) at $0.10
each; the budget is $0.45, so the third question's second request is refused by the cap
before it is sent (the agent reserves $0.10 ahead of each request).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

import durable
from durable.integrations.pydantic_ai import DurableAgent
from durable.llm import Price

registry = durable.Registry()
BUDGET = durable.Budget(dollars=0.45)
QUESTIONS = ["tides", "eclipses", "seasons"]


def log(what: dict[str, Any]) -> None:
    """What really happened, outside durable: one line per real model call or tool run."""
    outbox = Path(os.environ.get("AGENT_OUTBOX", "."))
    with open(outbox / "calls.jsonl", "a") as f:
        f.write(json.dumps({**what, "pid": os.getpid()}) + "\n")


def scripted_model(messages: list[Any], info: AgentInfo) -> ModelResponse:
    topic = messages[0].parts[-1].content
    answered = any(p.part_kind == "tool-return" for m in messages for p in m.parts)
    log({"call": "model", "topic": topic})
    usage = RequestUsage(input_tokens=40_000, output_tokens=30_000)  # $0.10 at the price below
    if not answered:
        return ModelResponse(parts=[ToolCallPart("look_up", {"topic": topic})], usage=usage)
    return ModelResponse(parts=[TextPart(f"{topic}: it is the moon")], usage=usage)


agent = Agent(
    FunctionModel(scripted_model, model_name="scripted-model"),
    name="researcher",
    capabilities=[
        DurableAgent(
            name="researcher",
            prices={"scripted-model": Price(1.0, 2.0)},
            reserve=0.10,  # what a request usually costs: refused before it is sent
        )
    ],
)


@agent.tool_plain
def look_up(topic: str) -> str:
    log({"call": "tool", "topic": topic})
    return f"notes on {topic}"


@durable.workflow(registry=registry, name="examples.agent_pydantic_ai", budget=BUDGET)
async def research(questions: list[str]) -> list[str]:
    answers = []
    for i, question in enumerate(questions):
        answers.append((await agent.run(question)).output)
        left = durable.budget_left().dollars or 0.0
        await durable.write_stream_async(
            "progress", {"done": i + 1, "of": len(questions), "budget_left": round(left, 2)}
        )
    await durable.close_stream_async("progress")
    return answers
