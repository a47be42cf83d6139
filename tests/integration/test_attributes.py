"""Attributes on workflow runs and the filters that read them, over a real database: set at
a start (start, submit, enqueue, a `workflow_attributes` block) and from workflow code
(journaled: a replay writes nothing again), matched by equality and by ranges on numbers
and times, carried by an export; and bulk actions by filter (dry run, batches, a second
run that does nothing, the audit rows)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import durable
from durable.errors import ConfigurationError

reg = durable.Registry()
elsewhere = durable.Registry()  # code no worker of these tests has: its runs stay PENDING
queue = durable.Queue("at.q", registry=elsewhere)


@durable.workflow(registry=reg, name="at.order")
def order(amount: int) -> int:
    durable.set_attributes({"stage": "paid", "amount": amount})
    note = durable.recv("go", timeout=3600)
    durable.set_attributes({"stage": "shipped", "note": note})
    return amount


@durable.workflow(registry=elsewhere, name="at.idle")
def idle(n: int) -> int:
    return n


@pytest.fixture
def engine(database_url: str) -> Iterator[durable.Engine]:
    with durable.Engine(database_url, registry=reg) as eng:
        yield eng


def _ids(infos: list[durable.WorkflowInfo]) -> set[str]:
    return {i.workflow_id for i in infos}


def test_attributes_from_starts_and_filters_by_equality_and_ranges(database_url: str) -> None:
    due = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
    with durable.Client(database_url) as client:
        client.submit(idle, 1, workflow_id="a1", attributes={"customer": "c-1", "amount": 120})
        client.submit(
            idle, 2, workflow_id="a2", attributes={"customer": "c-1", "amount": 80, "due": due}
        )
        client.enqueue(queue, idle, 3, workflow_id="a3", attributes={"customer": "c-2"})
        with durable.workflow_attributes({"region": "eu"}):
            client.submit(idle, 4, workflow_id="a4", attributes={"amount": 100.5})
        client.submit(idle, 5, workflow_id="a5")

        assert client.get_workflow("a1").attributes == {"customer": "c-1", "amount": 120}
        assert client.get_workflow("a2").attributes["due"] == "2026-03-01T12:00:00+00:00"
        assert client.get_workflow("a4").attributes == {"region": "eu", "amount": 100.5}
        assert client.get_workflow("a5").attributes == {}

        def match(*expressions: str, **fields: object) -> set[str]:
            chosen = durable.RunFilter.parse(expressions, **fields)
            found = _ids(client.list_workflows(filter=chosen))
            assert client.count_workflows(filter=chosen) == len(found)
            return found

        assert match("customer=c-1") == {"a1", "a2"}
        assert match("customer=c-1", "amount>=100") == {"a1"}
        assert match("amount>=100") == {"a1", "a4"}
        assert match("amount<100.5") == {"a1", "a2"} - {"a1"}
        assert match("due<2026-03-02") == {"a2"}
        assert match("due>2026-03-02T00:00:00+00:00") == set()
        assert match("customer>1") == set()  # a string never matches a number's range
        assert match("region=eu", "amount=100.5") == {"a4"}
        assert match("customer=c-2", status="ENQUEUED") == {"a3"}
        assert match(status=("ENQUEUED", "PENDING"), name="at.idle") == {
            "a1",
            "a2",
            "a3",
            "a4",
            "a5",
        }
        assert match(status="SUCCESS") == set()
        in_code = durable.RunFilter(
            attributes={"customer": "c-1"},
            ranges=(durable.AttributeRange("amount", "<", 100),),
        )
        assert _ids(client.list_workflows(filter=in_code)) == {"a2"}

        with pytest.raises(ConfigurationError, match="key=value"):
            durable.RunFilter.parse(["amount"])
        with pytest.raises(ConfigurationError, match="time zone"):
            client.submit(idle, 6, attributes={"due": dt.datetime(2026, 1, 1)})
        with pytest.raises(ConfigurationError, match="not an attribute value"):
            client.submit(idle, 6, attributes={"items": [1, 2]})

        exported = client.export_workflow("a1")
        assert exported["tables"]["workflows"][0]["attributes"] == {
            "customer": "c-1",
            "amount": 120,
        }


def test_set_attributes_is_journaled_and_a_replay_does_not_write_again(
    engine: durable.Engine, database_url: str
) -> None:
    handle = engine.start(order, 7, workflow_id="o1", attributes={"customer": "c-9"})
    client = engine.client
    paid = durable.RunFilter.parse(["stage=paid", "customer=c-9"], status="SUSPENDED")
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=20)
    while _ids(client.list_workflows(filter=paid)) != {"o1"}:
        assert dt.datetime.now(dt.UTC) < deadline, "the run never set its attributes"
        time.sleep(0.05)
    # Changed behind the run's back: the run resumes by a replay of its journal, which
    # would put amount=7 back if it wrote its first call again.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable.workflows SET attributes = attributes || '{\"amount\": 999}' "
            "WHERE workflow_id = 'o1'"
        )
    engine.send("o1", "fragile", topic="go")
    assert handle.result(timeout=20) == 7
    info = client.get_workflow("o1")
    assert info.attributes == {
        "customer": "c-9",
        "amount": 999,
        "stage": "shipped",
        "note": "fragile",
    }
    calls = [s for s in client.steps("o1") if s.step_name == "durable.attributes"]
    assert len(calls) == 2
    assert json.loads(calls[0].output or "") == {"stage": "paid", "amount": 7}
    with pytest.raises(durable.errors.NoEngineError, match="set_attributes"):
        durable.set_attributes({"a": 1})


def test_bulk_actions_by_filter_count_first_act_in_batches_and_do_nothing_twice(
    database_url: str,
) -> None:
    with durable.Client(database_url, actor="ops") as client:
        for i in range(7):
            client.submit(
                idle, i, workflow_id=f"b{i}", attributes={"customer": "c-1" if i < 5 else "c-2"}
            )
        chosen = durable.RunFilter.parse(["customer=c-1"])

        dry = client.bulk("cancel", chosen, dry_run=True, sample=3)
        assert (dry.matched, dry.changed, len(dry.sample)) == (5, 0, 3)
        assert client.get_workflow("b0").status is durable.WorkflowStatus.PENDING

        class Interrupted(Exception):
            pass

        def interrupt(done: int, total: int) -> None:
            raise Interrupted  # after the first batch of two

        with pytest.raises(Interrupted):
            client.bulk("cancel", chosen, batch_size=2, progress=interrupt)
        cancelled = durable.RunFilter.parse(["customer=c-1"], status="CANCELLED")
        assert client.count_workflows(filter=cancelled) == 2
        pages: list[int] = []
        done = client.bulk("cancel", chosen, batch_size=2, progress=lambda n, _: pages.append(n))
        assert (done.matched, done.changed, done.unchanged) == (3, 3, 0)  # the rest, once
        assert pages == [2, 3]
        statuses = {i.workflow_id: i.status for i in client.list_workflows(name="at.idle")}
        assert {k for k, v in statuses.items() if v is durable.WorkflowStatus.CANCELLED} == {
            f"b{i}" for i in range(5)
        }
        again = client.bulk("cancel", chosen)
        assert (again.matched, again.changed) == (0, 0)
        cancels = [r for r in client.audit_log() if r["action"] == "cancel"]
        assert len(cancels) == 5
        summary = [r for r in client.audit_log() if r["action"] == "bulk cancel"]
        assert len(summary) == 1 and summary[0]["subject"] == "customer=c-1"

        # Retry: a fork from the start under a derived id, once.
        retried = client.bulk("retry", chosen)
        assert retried.changed == 5 and set(retried.started) == {f"b{i}:retry" for i in range(5)}
        assert client.get_workflow("b0:retry").attributes == {"customer": "c-1"}
        assert client.bulk("retry", chosen).changed == 0

        # Resume: the cancelled runs become runnable, once.
        resumed = client.bulk("resume", chosen)
        assert resumed.changed == 5
        assert client.bulk("resume", chosen).changed == 0

        # Move: the runs of c-2 to version v2, once.
        other = durable.RunFilter.parse(["customer=c-2"])
        assert client.bulk("move", other, version="v2").changed == 2
        assert client.get_workflow("b6").version == "v2"
        assert client.bulk("move", other, version="v2").changed == 0
        assert client.count_workflows(filter=durable.RunFilter(version="v2")) == 2
        with pytest.raises(ConfigurationError, match="version="):
            client.bulk("move", other)
        with pytest.raises(ConfigurationError, match="bulk action"):
            client.bulk("explode", other)


def test_cli_lists_shows_and_acts_in_bulk_by_attributes(database_url: str) -> None:
    from click.testing import CliRunner

    from durable.cli import main

    with durable.Client(database_url) as client:
        for i, amount in enumerate((50, 150, 250)):
            client.submit(idle, i, workflow_id=f"c{i}", attributes={"amount": amount, "k": "v"})
        client.submit(idle, 9, workflow_id="c9", attributes={"amount": 500, "k": "other"})

    def cli(*args: str) -> Any:
        result = CliRunner().invoke(main, [*args, "--database-url", database_url])
        return result

    listed = cli("workflows", "list", "--attr", "k=v", "--attr", "amount>=100", "--json")
    assert listed.exit_code == 0, listed.output
    assert {r["workflow_id"] for r in json.loads(listed.stdout)} == {"c1", "c2"}
    assert json.loads(listed.stdout)[0]["attributes"] == {"amount": 250, "k": "v"}
    table = cli("workflows", "list", "--attr", "amount<100")
    # The id column's cells (the database's name, printed above the table, is random hex).
    assert "│ c0 " in table.output and "amount=50" in table.output
    assert "│ c1 " not in table.output
    assert cli("workflows", "list", "--attr", "amount").exit_code == 2
    shown = cli("workflows", "show", "c0")
    assert "attributes: amount=50 k=v" in shown.output

    dry = cli("workflows", "bulk", "cancel", "--attr", "k=v", "--attr", "amount>=100", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "2 run(s) match" in dry.output and "c1" in dry.output
    # Not a terminal and no --yes: nothing is done.
    refused = cli("workflows", "bulk", "cancel", "--attr", "k=v", "--attr", "amount>=100")
    assert refused.exit_code == 2 and "--yes" in refused.output
    done = cli("workflows", "bulk", "cancel", "--attr", "k=v", "--attr", "amount>=100", "--yes")
    assert done.exit_code == 0, done.output
    assert "2 changed" in done.output
    with durable.Client(database_url) as client:
        statuses = {i.workflow_id: i.status.value for i in client.list_workflows()}
        assert statuses == {"c0": "PENDING", "c1": "CANCELLED", "c2": "CANCELLED", "c9": "PENDING"}
        actors = {r["actor"] for r in client.audit_log() if r["action"] == "cancel"}
        assert len(actors) == 1 and next(iter(actors)).endswith("via cli")
    moved = cli("workflows", "bulk", "move", "--attr", "k=other", "--to-version", "v3", "--yes")
    assert "1 changed" in moved.output
    assert cli("workflows", "bulk", "move", "--attr", "k=other", "--yes").exit_code == 2
