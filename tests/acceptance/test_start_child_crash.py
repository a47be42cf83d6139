"""A start from workflow code cut off by a SIGKILL, through real worker processes: the
worker dies after the child's row is committed and before the parent's journal row of the
start, or after both, before the parent's next step; a fresh worker recovers the parent,
which adopts the child it stored (its id is derived from the parent and the position)
instead of starting another. The other ways to start (a Client's submit, a queue's
enqueue) also die in one process: tests/integration/test_crash_inprocess.py."""

from __future__ import annotations

import signal

import psycopg
import pytest

import durable
from tests.acceptance.workers import start_worker, stop_worker, world
from tests.apps import children_app, counter_app

APP = "tests.apps.children_app"


@pytest.mark.parametrize("how", ["start_child"])
def test_a_start_cut_off_before_its_journal_row_keeps_one_child(
    database_url: str, subprocess_env: dict[str, str], how: str
) -> None:
    counter_app.setup(database_url)
    with durable.Client(database_url) as client:
        handle = client.submit(children_app.parent, how, workflow_id="parent")
        first = start_worker(subprocess_env, database_url, app=APP, crash="after_child_start:1")
        assert first.wait(timeout=60) == -signal.SIGKILL
        with psycopg.connect(database_url) as conn:
            cut = conn.execute(
                "SELECT (SELECT count(*) FROM durable.workflows WHERE parent_id = 'parent'),"
                " (SELECT count(*) FROM durable.steps WHERE workflow_id = 'parent')"
            ).fetchone()
        assert cut == (1, 0)  # the child's row is there, the parent's journal row is not
        second = start_worker(subprocess_env, database_url, app=APP)
        try:
            child_id = handle.result(timeout=60)
            assert client.retrieve(child_id).result(timeout=60) == 1
        finally:
            stop_worker(second)
    with psycopg.connect(database_url) as conn:
        children = conn.execute(
            "SELECT workflow_id, parent_id, parent_step_seq FROM durable.workflows"
            " WHERE name = 'children.kid'"
        ).fetchall()
        journal = conn.execute(
            "SELECT step_seq, child_workflow_id FROM durable.steps"
            " WHERE workflow_id = 'parent' AND kind = 'child'"
        ).fetchall()
    assert children == [("parent:child:0", "parent", 0)]
    assert journal == [(0, "parent:child:0")]
    # Whatever ran before the kill, only that one child ever ran (its step may have run
    # again after the kill: the world records each run of it).
    kid_runs = [w for w, what, _ in world(database_url) if what == "kid ran"]
    assert kid_runs and set(kid_runs) == {"parent:child:0"}
    assert [what for _, what, _ in world(database_url, "parent")] == ["started parent:child:0"]


@pytest.mark.parametrize(
    ("how", "name"), [("submit quiet", "children.quiet"), ("trigger", "children.tick")]
)
def test_a_start_killed_after_it_is_adopted_by_the_recovered_parent(
    database_url: str, subprocess_env: dict[str, str], how: str, name: str
) -> None:
    """Killed at the parent's first step, after the start (a Client's submit, a schedule's
    trigger) from its code: the recovered parent replays the start and gets the same run
    back, journaled as its child, rather than starting a second one."""
    counter_app.setup(database_url)
    with durable.Client(database_url) as client:
        handle = client.submit(children_app.parent, how, workflow_id="parent")
        first = start_worker(subprocess_env, database_url, app=APP, crash="before_step:1")
        assert first.wait(timeout=60) == -signal.SIGKILL
        second = start_worker(subprocess_env, database_url, app=APP)
        try:
            child_id = handle.result(timeout=60)
        finally:
            stop_worker(second)
    with psycopg.connect(database_url) as conn:
        runs = conn.execute(
            "SELECT workflow_id, parent_id, parent_step_seq FROM durable.workflows WHERE name = %s",
            (name,),
        ).fetchall()
        journal = conn.execute(
            "SELECT step_seq, child_workflow_id FROM durable.steps"
            " WHERE workflow_id = 'parent' AND kind = 'child'"
        ).fetchall()
    assert runs == [(child_id, "parent", 0)]
    assert journal == [(0, child_id)]
    assert [what for _, what, _ in world(database_url, "parent")] == [f"started {child_id}"]
