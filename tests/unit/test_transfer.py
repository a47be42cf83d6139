"""An export carries every table that holds a workflow's rows: a new per-workflow table
(placed in durable/_io/citus.py, as the schema test demands) fails here until the export
reads it and the import writes it."""

from __future__ import annotations

from durable._client import transfer as _transfer
from durable._io import citus as _citus
from durable._io.systemdb import load_queries


def test_every_per_workflow_table_is_exported_and_imported() -> None:
    assert set(_transfer.TABLES) | _transfer.NOT_CARRIED == set(_citus.BY_WORKFLOW)
    assert not set(_transfer.TABLES) & _transfer.NOT_CARRIED
    queries = load_queries()
    for table in _transfer.TABLES:
        assert f"export_{table}" in queries, table
        assert f"import_{table}" in queries, table
        # Each statement finds the rows by the column the table is sharded by.
        column = _transfer.owner_column(table)
        assert column == _citus.BY_WORKFLOW[table], table
        assert f"{column} = ANY(%(workflow_ids)s::text[])" in queries[f"export_{table}"]


def test_a_running_workflow_is_imported_runnable_by_anyone() -> None:
    row = {
        "workflow_id": "w",
        "status": "RUNNING",
        "owner": "worker-1",
        "lease_expires_at": "2026-01-01T00:00:00+00:00",
    }
    data = {
        "durable_export": 1,
        "labels_version": 1,
        "workflow_ids": ["w"],
        "tables": {"workflows": [row]},
    }
    checked = _transfer.check(data)
    (imported,) = checked.tables["workflows"]
    assert (imported["status"], imported["owner"], imported["lease_expires_at"]) == (
        "PENDING",
        None,
        None,
    )
    assert checked.runnable == ["w"]
    assert row["status"] == "RUNNING"  # the caller's data is not changed
    for status in ("SUSPENDED", "SUCCESS", "ERROR", "ENQUEUED"):
        kept = _transfer.check({**data, "tables": {"workflows": [{**row, "status": status}]}})
        assert kept.tables["workflows"][0]["status"] == status
        assert kept.runnable == []
