from __future__ import annotations

import pytest

import durable
from durable import errors


def make_app() -> tuple[durable.Registry, dict[str, int], object, object]:
    reg = durable.Registry()
    calls: dict[str, int] = {}

    @durable.step(registry=reg)
    def add(a: int, b: int) -> int:
        calls["add"] = calls.get("add", 0) + 1
        return a + b

    @durable.workflow(registry=reg)
    def total(xs: list[int]) -> int:
        acc = 0
        for x in xs:
            acc = add(acc, x)
        return acc

    return reg, calls, add, total


def test_start_and_result(database_url: str) -> None:
    reg, _calls, _add, total = make_app()
    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(total, [1, 2, 3], workflow_id="wf-1")
        assert handle.result(timeout=10) == 6
        assert handle.status() == durable.WorkflowStatus.SUCCESS
        assert handle.workflow_id == "wf-1"
        steps = engine.steps("wf-1")
        assert [s.step_seq for s in steps] == [0, 1, 2]
        assert all(s.step_name.endswith("add") for s in steps)
        # direct call runs durably too
        assert total([4, 5]) == 9  # type: ignore[operator]
        assert len(engine.list_workflows(status="SUCCESS")) == 2


def test_same_id_returns_existing(database_url: str) -> None:
    reg, calls, _add, total = make_app()
    with durable.Engine(database_url, registry=reg) as engine:
        h1 = engine.start(total, [1, 2], workflow_id="same")
        assert h1.result(timeout=10) == 3
        h2 = engine.start(total, [100], workflow_id="same")
        assert h2.result(timeout=10) == 3
        assert calls["add"] == 2


def test_no_engine() -> None:
    _reg, _calls, add, total = make_app()
    assert add(1, 2) == 3  # type: ignore[operator]
    with pytest.raises(errors.NoEngineError, match=r"durable\.Engine"):
        total([1])  # type: ignore[operator]
