"""Code ported from DBOS: DBOS's option names given to durable's decorators or to a start
raise DBOSNameError naming durable's (still a TypeError, as an unknown keyword was); and
`durable.workflow_id` used as DBOS's property says to call it."""

from __future__ import annotations

from typing import Any

import pytest

import durable
from durable._run.dbos_names import START, STEP, TRANSACTION, WORKFLOW
from durable.errors import DBOSNameError, NoEngineError, WorkflowIdNotCalledError

reg = durable.Registry()


@pytest.mark.parametrize(
    ("name", "durable_name"),
    [
        ("retries_allowed", "retries="),
        ("max_attempts", "retries="),
        ("interval_seconds", "initial_delay="),
        ("backoff_rate", "backoff="),
    ],
)
def test_dbos_step_options_name_durables(name: str, durable_name: str) -> None:
    with pytest.raises(DBOSNameError, match=f"{name}= is DBOS's name; durable's is {durable_name}"):
        durable.step(registry=reg, **{name: 3})  # type: ignore[call-overload]


def test_dbos_workflow_and_transaction_options_name_durables() -> None:
    with pytest.raises(DBOSNameError, match="serialization_type= is DBOS's name"):
        durable.workflow(registry=reg, serialization_type="json")  # type: ignore[call-overload]
    options: dict[str, Any] = {"read_only": True}
    with pytest.raises(DBOSNameError, match="read_only= is DBOS's name"):
        durable.transaction(registry=reg, **options)
    # A name neither library has is still Python's TypeError.
    with pytest.raises(TypeError, match="unexpected keyword argument 'retrys'") as caught:
        durable.step(registry=reg, retrys=3)  # type: ignore[call-overload]
    assert not isinstance(caught.value, DBOSNameError)
    # The names both libraries share work as they are.
    durable.workflow(registry=reg, name="dn.shared", max_recovery_attempts=3)
    durable.transaction(registry=reg, isolation_level="SERIALIZABLE")


@pytest.mark.parametrize(
    ("name", "durable_name"),
    [
        ("queue_name", "durable.Queue(name).enqueue"),
        ("workflow_timeout", "timeout="),
        ("deduplication_id", "dedup_key="),
        ("app_version", "@durable.workflow(version=...)"),
    ],
)
def test_dbos_start_options_name_durables_before_anything_is_stored(
    name: str, durable_name: str
) -> None:
    @durable.workflow(registry=durable.Registry(), name=f"dn.start.{name}")
    def wf(x: int) -> int:
        return x

    # No engine is needed to be told: the start refuses the keyword first (a start that
    # took it would store it as the workflow's argument).
    engine = durable.Engine("postgresql://127.0.0.1:1/none", registry=durable.Registry())
    client = engine.client
    queue = durable.Queue(f"dn.q.{name}", registry=durable.Registry())
    for start in (
        lambda: engine.start(wf, 1, **{name: "x"}),
        lambda: engine.submit(wf, 1, **{name: "x"}),
        lambda: client.submit(wf, 1, **{name: "x"}),
        lambda: client.enqueue(queue, wf, 1, **{name: "x"}),
        lambda: queue.enqueue(durable.with_options(wf, workflow_id="a"), 1, **{name: "x"}),
    ):
        with pytest.raises(DBOSNameError, match=f"{name}= is DBOS's name") as caught:
            start()
        assert durable_name in str(caught.value)
        assert isinstance(caught.value, TypeError)


def test_a_workflow_parameter_named_like_a_dbos_option_is_its_argument() -> None:
    from durable._run.dbos_names import refuse_start_options

    def wf(x: int, queue_name: str) -> str:
        return queue_name

    refuse_start_options("start()", wf, {"queue_name": "mine"})  # its own: no error
    with pytest.raises(DBOSNameError):
        refuse_start_options("start()", wf, {"workflow_timeout": 5})


def test_every_table_says_what_to_use() -> None:
    for table in (WORKFLOW, STEP, TRANSACTION, START):
        assert table and all(isinstance(v, str) and v for v in table.values())


def test_workflow_id_used_as_a_value_says_to_call_it() -> None:
    for use in (
        lambda: f"{durable.workflow_id}",
        lambda: str(durable.workflow_id),
        lambda: durable.workflow_id == "wf-1",
        lambda: durable.workflow_id != "wf-1",
        lambda: bool(durable.workflow_id),
        lambda: "id: %s" % durable.workflow_id,  # noqa: UP031
    ):
        with pytest.raises(WorkflowIdNotCalledError, match=r"call it, durable\.workflow_id\(\)"):
            use()
    assert issubclass(WorkflowIdNotCalledError, TypeError)
    # Called, it is what it was: outside a workflow, NoEngineError.
    with pytest.raises(NoEngineError, match="outside a workflow"):
        durable.workflow_id()
    assert "workflow_id" in repr(durable.workflow_id)
    assert {durable.workflow_id: 1}[durable.workflow_id] == 1  # hashable by identity


def test_the_guide_lists_every_name_of_the_table() -> None:
    from tests.conftest import ROOT

    guide = (ROOT / "docs" / "coming-from-dbos.md").read_text("utf-8")
    for table in (WORKFLOW, STEP, TRANSACTION, START):
        for name in table:
            assert f"| `{name}=` |" in guide, name
