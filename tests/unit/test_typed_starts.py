"""A start keeps mypy's check of the workflow's arguments when it is given options through
durable.with_options, and its handle's result() is typed by the workflow's return type
(an async def workflow's: what its coroutine returns); recv and get_event are typed by the
`type=` they are given. One strict mypy run (tests/unit/strict_mypy.py) over one snippet: each
line marked `# E<n>` must be an error, and no other line; each `# R<n>` must reveal the type
written after it."""

from __future__ import annotations

import re

import pytest

from tests.unit.strict_mypy import GROUP, checked

SNIPPET = """
from typing import Any

import durable

q = durable.Queue("q")


@durable.workflow()
def add(x: int, y: int) -> int:
    return x + y


@durable.workflow()
async def greet(name: str) -> str:
    return name


@durable.workflow()
def waits() -> None:
    order: dict[str, Any] = durable.recv("orders", type=dict)
    maybe: dict[str, Any] = durable.recv("orders", timeout=5, type=dict)  # E1
    reveal_type(durable.recv("orders", timeout=5, type=str))  # R1 str | None
    reveal_type(durable.get_event("other", "k", type=int))  # R2 int | None
    reveal_type(durable.recv("orders"))  # R3 Any
    print(order, maybe)


def sync(engine: durable.Engine, client: durable.Client) -> None:
    ok = engine.start(durable.with_options(add, workflow_id="a", timeout=60), 1, 2)
    reveal_type(ok.result())  # R4 int
    total: str = ok.result()  # E2
    engine.start(durable.with_options(add, workflow_id="a"), 1, "2")  # E3
    engine.submit(durable.with_options(add, attributes={"k": "v"}), 1)  # E4
    client.submit(durable.with_options(add, workflow_id="b"), x=1, z=2)  # E5
    engine.start(durable.with_options(add, workflow_id=3), 1, 2)  # E6
    q.enqueue(durable.with_options(add, dedup_key="k", priority=1), 1, "2")  # E7
    engine.enqueue(q, durable.with_options(add, delay=5), "1", 2)  # E8
    client.enqueue(q, durable.with_options(add, priority="high"), 1, 2)  # E9
    reveal_type(engine.start(greet, "ann").result())  # R5 str
    queued = q.enqueue(durable.with_options(add, workflow_id="c"), 1, 2)
    reveal_type(queued)  # R6 durable._run.handles.WorkflowHandle[int]
    old = engine.start(add, 1, 2, workflow_id="d")
    reveal_type(old)  # R7 durable._run.handles.WorkflowHandle[Any]
    wid: str = durable.workflow_id()
    print(total, wid)


async def awaited(engine: durable.Engine, client: durable.Client) -> None:
    handle = await engine.start_async(durable.with_options(greet, workflow_id="e"), "ann")
    reveal_type(await handle.result())  # R8 str
    await engine.start_async(durable.with_options(greet, workflow_id="e"), 1)  # E10
    await client.enqueue_async(q, durable.with_options(greet, dedup_key="k"), name=2)  # E11
    queued = await engine.enqueue_async(q, durable.with_options(add, workflow_id="f"), 1, 2)
    reveal_type(queued)  # R9 durable._run.handles.AsyncWorkflowHandle[int]
"""


@GROUP
def test_options_through_with_options_keep_the_argument_check_and_handles_are_typed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    done = checked("typed_starts", tmp_path_factory)
    lines = SNIPPET.splitlines()
    errors: set[str] = set()
    revealed: dict[str, str] = {}
    for row in done.rows:
        found = re.match(rf"{re.escape(str(done.path))}:(\d+): (error|note): (.*)", row)
        if found is None:
            continue
        line = lines[int(found[1]) - 1]
        mark = re.search(r"# ([ER]\d+)(?: (.*))?$", line)
        if found[2] == "error":
            errors.add(mark[1] if mark else f"unexpected: {row}")
        elif found[3].startswith("Revealed type is") and mark:
            revealed[mark[1]] = found[3].removeprefix("Revealed type is ").strip('"')
    out = "\n".join(done.rows)
    assert errors == {f"E{i}" for i in range(1, 12)}, out
    expected = {m[1]: m[2] for line in lines if (m := re.search(r"# (R\d+) (.*)$", line))}
    assert revealed == expected, out
