"""A patch point where the old code's call left its mark before its journal row.

Deploy v1 makes a refund at a position through a call that writes something before the
parent's journal row: a child started under an id of its own, a transaction committed in a
separate application database, a message delivered to another workflow. A v1 worker is
SIGKILLed right after that mark and before the journal row. Deploy v2 puts the position
behind `durable.patched(...)` with a new way to refund on the new branch. The v2 worker
that recovers the run must find the old call's mark (by what the rows say: the child's
parent and position, the app database's transaction record, the message's sender and
position), take the old branch, and so refund once: the world records every refund.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import psycopg
import pytest

import durable
from tests.acceptance.workers import start_worker, stop_worker, wait_for, world
from tests.apps import counter_app
from tests.apps.patching import seams, seams_v1

V1 = "tests.apps.patching.seams_workers:v1"
V2 = "tests.apps.patching.seams_workers:v2"


def crash_v1(
    env: dict[str, str], url: str, point: str, then: Callable[[], object] = lambda: None
) -> None:
    """Run a v1 worker until it SIGKILLs itself at `point` (`then`: once it runs)."""
    worker = start_worker(env, url, crash=point, app=V1)
    try:
        then()
        assert worker.wait(timeout=60) == -9, f"the v1 worker did not die at {point}"
    except BaseException:
        worker.kill()
        worker.wait()
        raise


def refunds_in_world(url: str, order_id: str) -> Counter[str]:
    return Counter(what for _, what, _ in world(url, order_id) if what.startswith("refund:"))


@pytest.mark.parametrize("kind", ["child", "app", "send"])
def test_a_patch_finds_what_the_old_code_started_at_its_position(
    database_url: str, bare_database_url: str, subprocess_env: dict[str, str], kind: str
) -> None:
    counter_app.setup(database_url)
    with psycopg.connect(bare_database_url, autocommit=True) as conn:
        conn.execute(seams.APP_DDL)
    env = {**subprocess_env, "SEAMS_APP_DATABASE_URL": bare_database_url}

    with durable.Client(database_url) as client:
        # One kind per database: a v1 worker started later would recover an earlier crash
        # on the old code itself.
        if kind == "child":
            run = client.submit(seams_v1.child_refund, "o-child", workflow_id="child-o")
            crash_v1(env, database_url, "after_child_start")
        elif kind == "app":
            run = client.submit(seams_v1.app_refund, "o-app", workflow_id="app-o")
            crash_v1(env, database_url, "after_transaction_commit")
        else:
            # The receiver waits in recv before the sender starts (a message that comes
            # later wakes it).
            inbox = client.submit(seams_v1.inbox, workflow_id="inbox")

            def send_when_the_inbox_waits() -> None:
                suspended = durable.WorkflowStatus.SUSPENDED
                wait_for(lambda: client.get_workflow("inbox").status == suspended)
                client.submit(seams_v1.send_refund, "o-send", "inbox", workflow_id="send-o")

            crash_v1(env, database_url, "after_send_message", send_when_the_inbox_waits)
            run = client.handle("send-o")

        # v2 recovers the run: it finds the old call at the patch's position.
        worker = start_worker(env, database_url, app=V2)
        try:
            outcome = run.result(timeout=60)
            if kind == "send":
                assert inbox.result(timeout=60) == {"refund": "o-send", "how": "old-send"}
        finally:
            stop_worker(worker)
        names = [s.step_name for s in client.steps(run.workflow_id)]

    if kind == "child":
        # The child started under its own id refunded; the new branch's step never ran.
        assert outcome == "child"
        assert set(refunds_in_world(database_url, "o-child")) == {"refund:child"}
    elif kind == "app":
        # One refund in the application database: the old transaction's, committed once.
        assert outcome == "old-transaction"
        with psycopg.connect(bare_database_url) as conn:
            rows = conn.execute("SELECT how FROM refunds WHERE order_id = 'o-app'").fetchall()
        assert rows == [("old-transaction",)]
    else:
        # One message delivered to the inbox: the old send's, not sent again under v2.
        assert outcome == "sent"
        with psycopg.connect(database_url) as conn:
            topics = conn.execute(
                "SELECT topic FROM durable.messages WHERE workflow_id = 'inbox'"
            ).fetchall()
        assert topics == [("refunds",)]
    # It replayed as v1's run: no marker journaled.
    assert not [n for n in names if n.startswith("patch:")], names
