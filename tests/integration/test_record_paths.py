"""Step records and outcomes go the short way (the record and the outcome prepared once per
connection and sent on the raw connection; the default JSON serializer's short encoding,
with orjson or json's C encoder) and the general way (a serializer of the user's, which
goes through psycopg's cursors as any statement does) to the very same rows: the same
stored text for every value, the same refusals. A statement prepared on the connection
and then dropped by the server (DEALLOCATE ALL) is sent the ordinary way, and again
prepared."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import psycopg
import pytest

import durable
from durable import errors, serialization
from durable._run.context import current_run

REG = durable.Registry()

VALUES: list[Any] = [
    None,
    True,
    -7,
    2**63,
    -(2**63) - 1,
    10**100,
    0.1,
    1e-7,
    1e16,
    -0.0,
    "",
    "été ünïcødé 日本語 🎉",
    '\x01\x1f\x7f"\\/\n\t',
    "x\ud800y",
    "__durable__",
    {"__durable__": 1},
    [1, [2, {"deep": [None, True, 1.5, "é"]}]],
    {"i": 1, "ok": True, "pad": "x" * 300},
    (1, 2),  # refused: comes back a list
    {1: "a"},  # refused: the key comes back a str
    float("nan"),  # refused
    10**5000,  # refused
    Decimal("1.10"),
    dt.datetime(2026, 12, 7, 11, 0, tzinfo=dt.UTC),
    b"\x00bytes",
]

PREPARED: dict[str, list[str]] = {}


@durable.step(registry=REG, name="paths.echo")
def echo(i: int):  # type: ignore[no-untyped-def]  # no annotation: the value as it is
    return VALUES[i]


def _prepared(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute("SELECT name FROM pg_prepared_statements ORDER BY name").fetchall()
    return [r[0] for r in rows if r[0].startswith("durable_")]


@durable.workflow(registry=REG, name="paths.all")
def every_value(tag: str) -> list[str]:
    seen: list[str] = []
    for i in range(len(VALUES)):
        if i == len(VALUES) // 2:
            run = current_run.get()
            assert run is not None and run.conn is not None
            PREPARED[tag] = _prepared(run.conn)
            run.conn.execute("DEALLOCATE ALL")  # the next record goes the ordinary way
        try:
            echo(i)
            seen.append("stored")
        except errors.SerializationError as exc:
            seen.append(str(exc))
    return seen


class SubJSON(durable.JSONSerializer):
    """The default JSON, as a serializer of the user's: the general way."""


def _stored(url: str, workflow_id: str) -> tuple[list[tuple[Any, ...]], Any]:
    with psycopg.connect(url) as conn:
        steps = conn.execute(
            "SELECT step_seq, step_name, kind, output, error, attempts FROM durable.steps"
            " WHERE workflow_id = %s ORDER BY step_seq",
            [workflow_id],
        ).fetchall()
        outcome = conn.execute(
            "SELECT status, output, error FROM durable.workflows WHERE workflow_id = %s",
            [workflow_id],
        ).fetchone()
    return steps, outcome


def test_both_ways_write_the_same_records(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    PREPARED.clear()
    runs: dict[str, Any] = {}
    for tag, serializer, orjson in (
        ("short", None, True),
        ("short-json", None, False),
        ("general", SubJSON(), True),
    ):
        if not orjson:
            monkeypatch.setattr(serialization, "_orjson", None)
        kwargs = {} if serializer is None else {"serializer": serializer}
        with durable.Engine(database_url, registry=REG, **kwargs):
            runs[tag] = every_value(tag)  # on the caller's thread: the run's own connection
        monkeypatch.undo()
    short = _stored(database_url, _workflow_id(database_url, "short"))
    for tag in ("short-json", "general"):
        assert runs[tag] == runs["short"]
        assert _stored(database_url, _workflow_id(database_url, tag)) == short
    steps, outcome = short
    assert outcome[0] == "SUCCESS"
    refused = [i for i, seen in enumerate(runs["short"]) if seen != "stored"]
    assert [VALUES[i] for i in refused][:2] == [(1, 2), {1: "a"}]
    assert len(steps) == len(VALUES) - len(refused)
    assert steps[0][3] == "null" and steps[3][3] == str(2**63)
    # The record and the outcome were prepared on the run's connection.
    assert PREPARED["short"] == ["durable_record_step"]


def _workflow_id(url: str, tag: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT workflow_id FROM durable.workflows WHERE inputs LIKE %s",
            [f'%{tag}"%'],
        ).fetchone()
    assert row is not None
    return str(row[0])
