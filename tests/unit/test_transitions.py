"""The status machines (`_core/transitions.py`) against the code that moves statuses.

Each table is walked (every status reachable from a new row, finished statuses final,
no dead ends), and held to the SQL: every statement of `_io/sql/queries.sql` that writes a
workflow's or an effect's status is listed below with the moves it makes; the test reads
each statement's `SET status` and its `WHERE ... status` tests to check the list, then
checks that the table allows each move and that each move of the table is made by some
statement. A new statement that writes a status, or a changed one, fails here until the
list (and, if needed, the table) says what it does.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path

import pytest

from durable._base.models import EffectStatus, WorkflowStatus
from durable._core import transitions as t
from durable._io.systemdb import load_queries

W = WorkflowStatus
E = EffectStatus
CORE = Path(t.__file__).parent

# The statuses settle_effect is given (its %(status)s), as the core passes them.
SETTLED = frozenset({E.APPLIED, E.FAILED})

Move = tuple[StrEnum | None, StrEnum]


def every(sources: Iterable[StrEnum | None], targets: Iterable[StrEnum]) -> frozenset[Move]:
    return frozenset((s, g) for s in sources for g in targets)


# statement -> the moves it makes (source None: it inserts the row). A move to the same
# status (a cancel of a workflow that stays pending) is written where the SQL writes it.
WORKFLOW_STATEMENTS: Mapping[str, frozenset[Move]] = {
    "insert_workflow": every([None], [W.RUNNING]),
    "insert_workflow_pending": every([None], [W.PENDING]),
    "fork_workflow": every([None], [W.PENDING]),
    "enqueue_workflow": every([None], [W.ENQUEUED]),
    "dequeue": every([W.ENQUEUED], [W.RUNNING]),
    "dequeue_cas": every([W.ENQUEUED], [W.RUNNING]),
    "dequeue_partitioned": every([W.ENQUEUED], [W.RUNNING]),
    "claim_batch": every([W.PENDING], [W.RUNNING])
    | every([W.RUNNING], [W.RUNNING, W.MAX_RECOVERY_ATTEMPTS_EXCEEDED]),
    "claim_batch_cas": every([W.PENDING], [W.RUNNING])
    | every([W.RUNNING], [W.RUNNING, W.MAX_RECOVERY_ATTEMPTS_EXCEEDED]),
    # PAUSED when a pause was asked of the run (paused_at), else PENDING.
    "release_workflow": every([W.RUNNING], [W.PENDING, W.PAUSED]),
    "release_owned": every([W.RUNNING], [W.PENDING, W.PAUSED]),
    "cancel_workflows": every(
        [W.ENQUEUED, W.PENDING, W.SUSPENDED, W.PAUSED], [W.PENDING, W.CANCELLED]
    )
    | every([W.RUNNING], [W.RUNNING, W.PENDING, W.CANCELLED]),
    # An operator's hard stop: CANCELLED at once, whatever it was doing.
    "terminate_workflows": every(
        [W.ENQUEUED, W.PENDING, W.RUNNING, W.SUSPENDED, W.PAUSED], [W.CANCELLED]
    ),
    "resume_workflow": every([W.CANCELLED, W.ERROR, W.MAX_RECOVERY_ATTEMPTS_EXCEEDED], [W.PENDING]),
    # `CASE WHEN status = 'RUNNING' THEN 'PENDING' ELSE status END`: a pending, queued or
    # suspended workflow keeps its status (only its version changes).
    "move_workflow": every([W.RUNNING], [W.PENDING]),
    "finish_workflow": every([W.RUNNING], t.FINISHED_BY_A_RUN),
    "finish_workflows": every([W.RUNNING], t.FINISHED_BY_A_RUN),
    "finish_with_steps": every([W.RUNNING], t.FINISHED_BY_A_RUN),
    "suspend_until": every([W.RUNNING], [W.SUSPENDED, W.PENDING, W.PAUSED]),
    "suspend_for_any": every([W.RUNNING], [W.SUSPENDED, W.PENDING, W.PAUSED]),
    "suspend_for_approval": every([W.RUNNING], [W.SUSPENDED, W.PENDING, W.PAUSED]),
    # A live run keeps RUNNING (asked: it stops at its next step boundary); the rest,
    # and a run whose lease lapsed, become PAUSED.
    "pause_workflow": every([W.ENQUEUED, W.PENDING, W.SUSPENDED], [W.PAUSED])
    | every([W.RUNNING], [W.RUNNING, W.PAUSED]),
    # A running one asked to pause keeps RUNNING (the request is withdrawn).
    "unpause_workflow": every([W.PAUSED], [W.PENDING, W.ENQUEUED])
    | every([W.RUNNING], [W.RUNNING]),
    "wake_due": every([W.SUSPENDED], [W.PENDING]),
    "wake_if_message": every([W.SUSPENDED], [W.PENDING]),
    "wake_if_decided": every([W.SUSPENDED], [W.PENDING]),
    "wake_if_any": every([W.SUSPENDED], [W.PENDING]),
    "wake_workflow": every([W.SUSPENDED], [W.PENDING]),
    # `CASE WHEN status = 'SUSPENDED' THEN 'PENDING' ELSE status END`: a running workflow
    # keeps its status (it sees the message or decision itself).
    "send_message": every([W.SUSPENDED], [W.PENDING]),
    "adopt_early_messages": every([W.SUSPENDED], [W.PENDING]),
    "decide_approval": every([W.SUSPENDED], [W.PENDING]),
    "expire_approvals": every([W.SUSPENDED], [W.PENDING]),
}

EFFECT_STATEMENTS: Mapping[str, frozenset[Move]] = {
    "effect_intent": every([None], [E.PENDING]),
    "effect_pending": every([E.INTENT, E.PENDING], [E.PENDING]),
    "settle_effect": every([E.INTENT, E.PENDING], SETTLED),
}


# -- the tables themselves --------------------------------------------------------------------


def _reachable(table: Mapping[StrEnum | None, frozenset[StrEnum]]) -> set[StrEnum]:
    seen: set[StrEnum] = set()
    todo = list(table[None])
    while todo:
        state = todo.pop()
        if state not in seen:
            seen.add(state)
            todo += table[state]
    return seen


TABLES = [
    pytest.param(t.EFFECT_EVENTS, t.EFFECT_TRANSITIONS, E, t.EFFECT_NEVER_WRITTEN, id="effects"),
    pytest.param(
        t.WORKFLOW_EVENTS, t.WORKFLOW_TRANSITIONS, W, t.WORKFLOW_NEVER_WRITTEN, id="workflows"
    ),
]


@pytest.mark.parametrize(("events", "table", "states", "never"), TABLES)
def test_every_status_is_in_the_table_and_reachable_from_a_new_row(
    events: Mapping[StrEnum | None, Mapping[str, StrEnum]],
    table: Mapping[StrEnum | None, frozenset[StrEnum]],
    states: type[StrEnum],
    never: frozenset[StrEnum],
) -> None:
    assert set(table) == {None, *states}
    assert table == {s: frozenset(moves.values()) for s, moves in events.items()}
    reachable = _reachable(table)
    assert reachable == set(states) - never
    assert not reachable & never


@pytest.mark.parametrize(("events", "table", "states", "never"), TABLES)
def test_no_status_follows_itself_and_none_is_a_dead_end(
    events: Mapping[StrEnum | None, Mapping[str, StrEnum]],
    table: Mapping[StrEnum | None, frozenset[StrEnum]],
    states: type[StrEnum],
    never: frozenset[StrEnum],
) -> None:
    final = {s for s in states if not table[s]}
    for state, targets in table.items():
        assert state not in targets, state
        if state is None or state in never:
            continue
        # From every status a row may hold, some final status is within reach.
        assert final & ({state} | _reachable({**table, None: frozenset({state})})), state


def test_settled_effects_have_no_exits() -> None:
    assert {s for s in E if t.is_settled(s)} == {E.APPLIED, E.FAILED}
    for status in (E.APPLIED, E.FAILED):
        assert t.EFFECT_EVENTS[status] == {}


def test_finished_workflows_leave_only_by_a_resume() -> None:
    """A finished workflow (WorkflowStatus.is_terminal) never moves again by itself: the
    only way out is an operator's resume, and only for the statuses resume accepts."""
    for status in W:
        if status.is_terminal:
            assert set(t.WORKFLOW_EVENTS[status]) <= {"resume"}, status
    resumable = {s for s in W if t.WORKFLOW_EVENTS[s]} & {s for s in W if s.is_terminal}
    assert resumable == {W.ERROR, W.CANCELLED, W.MAX_RECOVERY_ATTEMPTS_EXCEEDED}
    assert {s for s in W if not t.WORKFLOW_EVENTS[s]} == {
        W.SUCCESS,
        W.COMPENSATED,
        W.COMPENSATION_FAILED,
        W.COMPENSATING,
    }
    assert {t.WORKFLOW_EVENTS[W.RUNNING][e] for e in t.WORKFLOW_EVENTS[W.RUNNING]} >= (
        t.FINISHED_BY_A_RUN
    )
    assert all(s.is_terminal for s in t.FINISHED_BY_A_RUN)


def test_assert_transition_refuses_a_move_the_table_lacks() -> None:
    t.assert_transition(t.EFFECT_TRANSITIONS, E.PENDING, E.APPLIED)
    t.assert_transition(t.WORKFLOW_TRANSITIONS, None, W.ENQUEUED)
    with pytest.raises(t.TransitionError, match="no transition from applied to pending"):
        t.assert_transition(t.EFFECT_TRANSITIONS, E.APPLIED, E.PENDING)
    with pytest.raises(t.TransitionError, match="from a new row to SUCCESS"):
        t.assert_transition(t.WORKFLOW_TRANSITIONS, None, W.SUCCESS)
    with pytest.raises(t.TransitionError):
        t.assert_transition(t.WORKFLOW_TRANSITIONS, W.SUCCESS, W.PENDING)


# -- the SQL against the tables ---------------------------------------------------------------

QUERIES = load_queries()
WRITES_WORKFLOW_STATUS = re.compile(
    r"UPDATE \{schema\}\.workflows(?: AS \w+)?\s+SET status|"
    r"INSERT INTO \{schema\}\.workflows \([^)]*\bstatus\b"
)
WRITES_EFFECT_STATUS = re.compile(
    r"UPDATE \{schema\}\.effects(?: AS \w+)?\s+SET status|"
    r"INSERT INTO \{schema\}\.effects \([^)]*\bstatus\b"
)


def _literals(text: str, states: type[StrEnum]) -> set[StrEnum]:
    values = {s.value: s for s in states}
    return {values[v] for v in re.findall(r"'(\w+)'", text) if v in values}


def _set_status(text: str, table: str) -> tuple[str, str]:
    """The expression a statement's UPDATE of `table` gives `status`, and the statement
    without it (where the statuses it starts from are tested)."""
    update = re.search(rf"UPDATE \{{schema\}}\.{table}(?: AS \w+)?\s+SET status = ", text)
    assert update is not None
    start = update.end()
    if text.startswith("CASE", start):
        end = text.index(" END", start) + len(" END")
    else:
        end = re.compile(r"[,\s]").search(text, start).start()  # type: ignore[union-attr]
    return text[start:end], text[:start] + text[end:]


def _targets(expression: str, text: str, states: type[StrEnum]) -> set[StrEnum] | None:
    """The statuses an expression writes; None for a parameter (the core's value)."""
    if expression.strip().endswith("next_status"):  # resolved through its CTE
        case = re.search(r"CASE (.*?) END AS next_status", text, re.DOTALL)
        assert case is not None
        expression = case.group(1)
    if expression.startswith("CASE"):
        values = {s.value: s for s in states}
        found = re.findall(r"(?:THEN|ELSE)\s+'(\w+)'", expression)
        return {values[v] for v in found}
    if "%(" in expression or expression.strip().startswith("f."):
        return None
    return _literals(expression, states)


STATEMENT_TABLES = [
    pytest.param(
        WORKFLOW_STATEMENTS,
        WRITES_WORKFLOW_STATUS,
        "workflows",
        W,
        t.WORKFLOW_TRANSITIONS,
        id="workflows",
    ),
    pytest.param(
        EFFECT_STATEMENTS, WRITES_EFFECT_STATUS, "effects", E, t.EFFECT_TRANSITIONS, id="effects"
    ),
]


@pytest.mark.parametrize(("listed", "writes", "table_name", "states", "table"), STATEMENT_TABLES)
def test_every_statement_that_writes_a_status_is_listed_and_read_right(
    listed: Mapping[str, frozenset[Move]],
    writes: re.Pattern[str],
    table_name: str,
    states: type[StrEnum],
    table: Mapping[StrEnum | None, frozenset[StrEnum]],
) -> None:
    found = {name for name, text in QUERIES.items() if writes.search(text)}
    assert found == set(listed)
    for name, moves in listed.items():
        text = QUERIES[name]
        sources = {s for s, _ in moves}
        targets = {g for _, g in moves}
        if sources == {None}:  # an INSERT: the statuses it writes are its literals
            written = _literals(text, states)
            assert written == targets, name
            continue
        expression, rest = _set_status(text, table_name)
        parsed = _targets(expression, text, states)
        if parsed is None:  # the core's value: held to the table by the core's own checks
            assert targets == set(t.FINISHED_BY_A_RUN) or targets == set(SETTLED), name
        else:
            assert parsed == targets, name
        # The statuses a move starts from are ones the statement tests for.
        assert sources <= _literals(rest, states), name


@pytest.mark.parametrize(("listed", "writes", "table_name", "states", "table"), STATEMENT_TABLES)
def test_the_statements_make_exactly_the_moves_of_the_table(
    listed: Mapping[str, frozenset[Move]],
    writes: re.Pattern[str],
    table_name: str,
    states: type[StrEnum],
    table: Mapping[StrEnum | None, frozenset[StrEnum]],
) -> None:
    made: set[Move] = set()
    for name, moves in listed.items():
        for source, target in moves:
            if source == target:
                continue  # the status stays: no move
            assert target in table[source], (name, source, target)
            made.add((source, target))
    in_table = {(s, g) for s, targets in table.items() for g in targets}
    assert made == in_table


def _status_arguments(module: str, enum: str) -> set[str]:
    tree = ast.parse((CORE / module).read_text("utf-8"))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == enum
    }


def test_the_core_finishes_and_settles_only_with_statuses_the_table_allows() -> None:
    """The statuses passed to the statements whose status is a parameter: a run's outcome
    (workflow.py) and an effect's settlement (effects.py)."""
    # RUNNING: the status an outcome follows (finish checks the move from it).
    named = _status_arguments("workflow.py", "WorkflowStatus") - {"RUNNING"}
    finished = {WorkflowStatus[name] for name in named}
    assert finished <= t.FINISHED_BY_A_RUN
    assert t.FINISHED_BY_A_RUN <= t.WORKFLOW_TRANSITIONS[W.RUNNING]
    # PENDING: the status a settlement follows (_settle checks the move from it).
    settled = {EffectStatus[n] for n in _status_arguments("effects.py", "EffectStatus")} - {
        E.PENDING
    }
    assert settled == SETTLED
    assert all(t.allowed(t.EFFECT_TRANSITIONS, E.PENDING, s) for s in SETTLED)
