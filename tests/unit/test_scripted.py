"""The scripted driver (tests/unit/scripted.py) refuses a statement the real driver could
not run: a name missing from queries.sql, or a parameter the statement binds left out."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from durable._core import Execute, WriteSteps
from tests.unit.scripted import WORKFLOW_ID, Script, ScriptError, held


def asks(*ops: Any) -> Generator[Any, Any, str]:
    for op in ops:
        _answer = yield op  # the answers are sent in: not `yield from` a tuple
    return "done"


def test_a_known_statement_with_its_parameters_passes() -> None:
    op = Execute("get_workflow_status", {"workflow_id": WORKFLOW_ID}, "one")
    assert Script().run(asks(op)) == "done"


def test_a_statement_missing_from_queries_sql_is_refused() -> None:
    op = Execute("get_workflow_statuz", {"workflow_id": WORKFLOW_ID}, "one")
    with pytest.raises(ScriptError, match="no such statement"):
        Script().run(asks(op))


def test_a_statement_without_a_parameter_it_binds_is_refused() -> None:
    op = Execute("get_workflow_status", {"workflow": WORKFLOW_ID}, "one")
    with pytest.raises(ScriptError, match="workflow_id"):
        Script().run(asks(op))


def test_a_journal_row_without_a_column_is_refused() -> None:
    row = held(0, "a")
    del row["epoch"]
    with pytest.raises(ScriptError, match="epoch"):
        Script().run(asks(WriteSteps([row])))
    assert Script().run(asks(WriteSteps([held(0, "a")]))) == "done"


def test_an_answer_of_another_shape_than_the_fetch_is_refused() -> None:
    asked = Execute("get_workflow_status", {"workflow_id": WORKFLOW_ID}, "one")
    counted = Execute("get_workflow_status", {"workflow_id": WORKFLOW_ID})
    row = {"status": "SUCCESS"}
    assert Script(statements={"get_workflow_status": row}).run(asks(asked)) == "done"
    with pytest.raises(ScriptError, match="fetches 'count'"):
        Script(statements={"get_workflow_status": row}).run(asks(counted))
    with pytest.raises(ScriptError, match="no such fetch"):
        Script().run(asks(Execute("get_workflow_status", {"workflow_id": WORKFLOW_ID}, "row")))
