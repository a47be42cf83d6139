"""A journal written in a newer format than the code knows (workflows.journal_version above
durable._base.labels.JOURNAL_VERSION: a newer release wrote it, and the code was rolled back or
the workflow imported here) is never run: workers do not claim it, and starting,
resuming, forking or importing it raises JournalVersionError. Its rows are left exactly as
they were, for a release that reads them.

A newer release is simulated by raising the stored version of a workflow written by this
one (there is no newer format yet to write it in).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import durable
from durable import errors
from durable._base import labels

NEWER = labels.JOURNAL_VERSION + 1


def rows(url: str, workflow_id: str) -> list[Any]:
    """Everything stored about the workflow, to compare before and after."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT to_jsonb(w) FROM durable.workflows AS w WHERE workflow_id = %s",
            [workflow_id],
        ).fetchone()
        steps = conn.execute(
            "SELECT to_jsonb(s) FROM durable.steps AS s WHERE workflow_id = %s ORDER BY step_seq",
            [workflow_id],
        ).fetchall()
    return [row, steps]


def test_a_workflow_records_the_journal_version_of_its_code(database_url: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg, name="one")
    def one() -> int:
        return 1

    @durable.workflow(registry=reg, name="wf")
    def wf() -> int:
        return one()

    queue = durable.Queue("q", registry=reg)
    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(wf, workflow_id="started").result(timeout=10)
        engine.client.submit(wf, workflow_id="submitted")
        engine.client.enqueue(queue, wf, workflow_id="queued")
        engine.fork("started", from_step=1, new_id="forked").result(timeout=10)
        for workflow_id in ("started", "submitted", "queued", "forked"):
            assert engine.get_workflow(workflow_id).journal_version == labels.JOURNAL_VERSION
        data = engine.client.export_workflow("started")
    assert data["journal_version"] == labels.JOURNAL_VERSION
    assert data["tables"]["workflows"][0]["journal_version"] == labels.JOURNAL_VERSION


def test_a_newer_journal_is_refused_and_left_untouched(database_url: str) -> None:
    reg = durable.Registry()
    ran: list[str] = []

    @durable.step(registry=reg, name="tick")
    def tick(i: int) -> int:
        ran.append(f"tick{i}")
        return i

    @durable.workflow(registry=reg, name="wf")
    def wf(fail: bool) -> list[int]:
        first = tick(0)
        if fail:
            raise RuntimeError("stopped")
        return [first, tick(1)]

    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(errors.WorkflowFailedError):
            engine.start(wf, True, workflow_id="failed").result(timeout=10)
        engine.start(wf, False, workflow_id="done").result(timeout=10)
    ran.clear()
    with psycopg.connect(database_url, autocommit=True) as conn:
        # A newer release's journals: one left runnable, one failed, one finished.
        conn.execute("UPDATE durable.workflows SET journal_version = %s", [NEWER])
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs, journal_version)"
            " SELECT 'pending', name, 'PENDING', inputs, journal_version"
            " FROM durable.workflows WHERE workflow_id = 'done'"
        )
        conn.execute(
            "INSERT INTO durable.steps (workflow_id, step_seq, step_name, kind, output)"
            " VALUES ('pending', 0, 'tick', 'step', '0')"
        )
    before = {w: rows(database_url, w) for w in ("pending", "failed", "done")}

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        # Workers pass it by, as they pass by a workflow whose code they do not have.
        assert engine.recover() == []
        with pytest.raises(errors.JournalVersionError, match=f"version {NEWER}, newer") as caught:
            engine.start(wf, False, workflow_id="pending")
        assert caught.value.workflow_id == "pending"
        assert (caught.value.found, caught.value.known) == (NEWER, labels.JOURNAL_VERSION)
        for workflow_id in ("pending", "failed"):
            with pytest.raises(errors.JournalVersionError):
                engine.resume(workflow_id)
        with pytest.raises(errors.JournalVersionError):
            engine.fork("done", from_step=1)
        exported = engine.client.export_workflow("pending")  # reading it is fine
    assert ran == []
    assert {w: rows(database_url, w) for w in ("pending", "failed", "done")} == before

    # Nor is it imported where this code runs.
    exported = json.loads(json.dumps(exported))
    exported["tables"]["workflows"][0]["workflow_id"] = "elsewhere"
    for table in exported["tables"].values():
        for row in table:
            row["workflow_id"] = "elsewhere"
    exported["workflow_ids"] = ["elsewhere"]
    with durable.Client(database_url) as client:
        with pytest.raises(errors.JournalVersionError, match="'elsewhere'"):
            client.import_workflow(exported)
        with pytest.raises(errors.WorkflowNotFoundError):
            client.get_workflow("elsewhere")


def test_an_export_from_before_journal_versions_imports_as_version_1(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs)"
            " VALUES ('old', 'wf', 'SUCCESS', '{\"args\": [], \"kwargs\": {}}')"
        )
    with durable.Client(database_url) as client:
        data = client.export_workflow("old")
        del data["journal_version"]
        for row in data["tables"]["workflows"]:
            del row["journal_version"]  # as an export of a release before 0020 holds it
            row["workflow_id"] = "old-2"
        data["workflow_ids"] = ["old-2"]
        assert client.import_workflow(data) == ["old-2"]
        assert client.get_workflow("old-2").journal_version == 1
