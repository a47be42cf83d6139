"""A research agent on durable: plan, tools, budget, working state and one real effect.

`durable worker --app examples.research_agent.workflow` runs it. The "LLM" is a script
(responses and token prices fixed below, no network), so every run is the same. Where the
tools and the outbox write is RESEARCH_OUTBOX (a directory): `tool_runs.jsonl` gets one
line each time a tool's code really runs, and each report sent is one file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import durable

registry = durable.Registry()

# What the scripted model answers and what each answer costs (dollars, tokens).
PLAN = [
    {"tool": "search_web", "args": {"query": "tidal energy cost per MWh"}},
    {"tool": "read_page", "args": {"url": "https://example.org/tidal-2026"}},
    {"tool": "search_web", "args": {"query": "tidal projects under construction"}},
]
PRICES = {"plan": (0.06, 1200), "decide": (0.04, 800), "write": (0.15, 3000)}
TOOL_PRICES = {"search_web": 0.01, "read_page": 0.02}
PAGES = {
    "tidal energy cost per MWh": ["levelised cost fell to ~$180/MWh", "Orkney trials"],
    "tidal projects under construction": ["MeyGen phase 2", "Normandie Hydro"],
}
BUDGET = durable.Budget(dollars=0.20, tokens=50_000)


def outbox() -> Path:
    path = Path(os.environ["RESEARCH_OUTBOX"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def _tool_ran(name: str, args: dict[str, Any]) -> None:
    """The world's own record: appended each time a tool's code really runs."""
    with (outbox() / "tool_runs.jsonl").open("a") as f:
        f.write(json.dumps({"tool": name, "args": args, "pid": os.getpid()}) + "\n")


def _left() -> str:
    left = durable.budget_left()
    return f"${left.dollars:.2f} left"


@durable.step(registry=registry, name="research.llm")
def llm(kind: str, context: Any) -> Any:
    """The scripted model: a plan, the next tool call for a task, or the report."""
    dollars, tokens = PRICES[kind]
    durable.charge(dollars=dollars, tokens=tokens)
    if kind == "plan":
        answer: Any = PLAN
    elif kind == "decide":
        answer = context
    else:
        answer = "Tidal energy report\n" + "\n".join(f"- {note}" for note in context)
    print(f"  llm       {kind:<7} {tokens:>5} tokens  ${dollars:.2f}   {_left()}", flush=True)
    return answer


@durable.tool(registry=registry, name="research.search_web")
def search_web(query: str) -> list[str]:
    _tool_ran("search_web", {"query": query})
    durable.charge(dollars=TOOL_PRICES["search_web"])
    print(f"  tool      search_web({query!r})   {_left()}", flush=True)
    return PAGES[query]


@durable.tool(registry=registry, name="research.read_page")
def read_page(url: str) -> list[str]:
    _tool_ran("read_page", {"url": url})
    durable.charge(dollars=TOOL_PRICES["read_page"])
    print(f"  tool      read_page({url!r})   {_left()}", flush=True)
    return [f"{url}: 2026 capacity 40 MW, 3 new arrays"]


@durable.effect(registry=registry, name="research.send_report", idempotent=True)
def send_report(report: str, *, idempotency_key: str) -> str:
    """The one tool that changes the world: a file per key (a second send is a no-op)."""
    _tool_ran("send_report", {"key": idempotency_key})
    target = outbox() / f"report-{idempotency_key.replace(':', '_')}.txt"
    try:
        with target.open("x") as f:  # exclusive create: the key is the file's name
            f.write(report)
    except FileExistsError:
        pass
    print(f"  effect    send_report -> {target.name}", flush=True)
    return target.name


TOOLS = {"search_web": search_web, "read_page": read_page}


@durable.workflow(registry=registry, name="research.agent", budget=BUDGET)
def research_agent(question: str) -> dict[str, Any]:
    durable.append_turn("user", question)
    plan = llm("plan", question)
    durable.state.set({"plan": [p["args"] for p in plan], "done": 0, "notes": []})
    for task in plan:
        action = llm("decide", task)
        found = TOOLS[action["tool"]](**action["args"])
        durable.append_turn("tool", {"tool": action["tool"], "result": found})
        progress = durable.state.get()
        durable.state.set(
            {**progress, "done": progress["done"] + 1, "notes": progress["notes"] + found}
        )
    report = llm("write", durable.state.get()["notes"])
    durable.append_turn("assistant", report)
    sent = send_report(report)
    return {"sent": sent, "notes": len(durable.state.get()["notes"])}
