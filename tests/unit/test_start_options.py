"""Start options (`workflow_id=`, `timeout=`, and a queue's `dedup_key=`, `priority=`,
`delay=`, `partition_key=`) are typed keyword-only options that strict mypy accepts, and
cannot swallow a workflow's own argument: `@workflow` refuses a parameter that a start would
take as an option."""

from __future__ import annotations

import pytest

import durable
from durable.errors import DefinitionError
from tests.unit.strict_mypy import GROUP, checked

HEADER = """
import datetime

import durable

q = durable.Queue("q", priority=True)
pq = durable.Queue("pq", concurrency=10, partition_concurrency=2)


@durable.workflow()
def wf(x: int) -> int:
    return x


@durable.workflow()
async def awf(x: int) -> int:
    return x
"""

ACCEPTED = (
    HEADER
    + """

async def main(engine: durable.Engine, client: durable.Client) -> None:
    engine.start(wf, 1, workflow_id="a")
    engine.start(wf, x=1, workflow_id="a")
    engine.start(wf, 1)
    await engine.start_async(awf, 1, workflow_id="b")
    client.submit(wf, 1, workflow_id="c")
    engine.submit(wf, 1, workflow_id="c")
    engine.enqueue(q, wf, 1, workflow_id="d", priority=2)
    engine.enqueue(q, wf, 1, dedup_key="k", delay=5)
    client.enqueue(q, wf, 1, delay=1.5)
    await client.enqueue_async(q, awf, 1, priority=1)
    await engine.enqueue_async(q, awf, 1, dedup_key="k")
    q.enqueue(wf, 1, delay=0)
    q.enqueue(wf, x=1, workflow_id="e", dedup_key="k", priority=1, delay=2.0)
    q.enqueue(wf, 1)
    engine.start(wf, 1, timeout=5)
    engine.start(wf, 1, workflow_id="f", timeout=datetime.timedelta(minutes=5))
    await engine.start_async(awf, 1, timeout=5)
    client.submit(wf, 1, timeout=0.5)
    engine.enqueue(q, wf, 1, timeout=60)
    await client.enqueue_async(q, awf, 1, priority=1, timeout=60)
    q.enqueue(wf, 1, timeout=60)
    engine.enqueue(pq, wf, 1, partition_key="user-1")
    client.enqueue(pq, wf, x=1, workflow_id="g", partition_key="user-1", timeout=60)
    await engine.enqueue_async(pq, awf, 1, partition_key="user-2")
    pq.enqueue(wf, 1, partition_key="user-3", dedup_key="k")
"""
)

REFUSED = (
    HEADER
    + """

async def main(engine: durable.Engine, client: durable.Client) -> None:
    engine.start(wf, "one")  # E1
    engine.start(wf, 1, workflow_id=3)  # E2
    client.submit(wf)  # E3
    q.enqueue(wf, 1, delay="soon")  # E4
    engine.enqueue(q, wf, 1, priority="high")  # E5
    q.enqueue(wf, y=1)  # E6
    engine.start(wf, 1, timeout="soon")  # E7
    pq.enqueue(wf, 1, partition_key=42)  # E8
"""
)


@GROUP
def test_options_pass_strict_mypy(tmp_path_factory: pytest.TempPathFactory) -> None:
    done = checked("options_accepted", tmp_path_factory)
    assert done.errors == [], "\n".join(done.rows)


@GROUP
def test_wrong_arguments_and_wrong_options_fail_strict_mypy(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    done = checked("options_refused", tmp_path_factory)
    lines = REFUSED.splitlines()
    flagged = {lines[done.line_of(row) - 1].split("# ")[-1] for row in done.errors}
    assert flagged == {f"E{i}" for i in range(1, 9)}, "\n".join(done.rows)


@pytest.mark.parametrize(
    "option", ["workflow_id", "dedup_key", "priority", "delay", "partition_key", "timeout"]
)
def test_a_parameter_named_like_an_option_is_refused_at_decoration(option: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"def notify(user, {option}=None):\n    return user\n", namespace)
    with pytest.raises(DefinitionError, match=rf"parameter named '{option}'.*positional-only"):
        durable.workflow(registry=durable.Registry())(namespace["notify"])  # type: ignore[arg-type]


def test_a_keyword_only_parameter_named_like_an_option_is_refused() -> None:
    def notify(user: str, *, workflow_id: str) -> str:
        return user

    with pytest.raises(DefinitionError, match="workflow_id"):
        durable.workflow(registry=durable.Registry())(notify)


def test_a_positional_only_parameter_cannot_be_swallowed_and_is_allowed() -> None:
    def notify(user: str, delay: float, /, **extra: object) -> str:
        return user

    registry = durable.Registry()
    durable.workflow(registry=registry)(notify)
    assert registry.workflows()
