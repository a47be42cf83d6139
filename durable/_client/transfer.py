"""Export and import of workflows: every stored row of a workflow (and, if asked, of its
descendants) as JSON, carried from one system database to another.

A run that went wrong in production is best looked at where the code can be stepped
through: exported there, imported into a database of one's own, then resumed, forked or
replayed against the same code (DBOS's export/import). So an export holds the rows as they
are stored, nothing decoded: the journal's outputs stay the serialized text a replay
reads, and an import writes them back unchanged.

An export is a dict that `json.dumps` writes as it is:

    {"durable_export": 1,           the format of this dict (EXPORT_FORMAT)
     "labels_version": 1,           the journal labels it was written with (_base/labels.py)
     "journal_version": 1,          the journal format its code writes (each workflows row
                                    says its own: journal_version)
     "schema_version": 20,          the last migration of the release that wrote it
     "exported_at": "...",          when (ISO 8601)
     "root": "<id>",                the workflow asked for
     "workflow_ids": ["<id>", ...], it and the descendants exported with it
     "tables": {"workflows": [{column: value, ...}, ...], "steps": [...], ...}}

Each row is its columns as PostgreSQL writes them in JSON (timestamps in ISO 8601), with
amounts of money and time (`numeric` columns) as text, which JSON's floating point would
round. An import refuses, in one transaction that then leaves nothing behind, an export of
a newer format, journal or schema (`schema_version` above this release's last migration),
rows that name a workflow the export does not list, a column a table here lacks (it would
be dropped), rows PostgreSQL refuses (two with the same key, a value of the wrong type), a
journal row no run writes (a kind that is not a StepKind, a negative position),
and ids this database already has. A run's attributes (durable.set_attributes) are a
column of its workflows row and go with it. A run that was unfinished is imported
runnable by no one in particular: its claim (owner, lease) belonged to an executor of the
other database, so a RUNNING workflow is imported PENDING, for a worker or
`client.resume(id)` to take up.

Not carried: an `@transaction` step's record in a separate application database (its
`transaction_outputs` row; in the system database it is an ordinary journal row), a
queue's dedup key (`queue_dedup`, keyed by queue rather than by workflow), and a child's
budget ledger when the child is exported without its root (the ledger is the root's).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from durable._base import labels
from durable._base.models import StepKind, WorkflowStatus
from durable._base.names import check_name
from durable._io import migrate as _migrate
from durable._io.bounded import unbounded
from durable._io.systemdb import SystemDB, Tx, is_unique_violation, refused_data
from durable.errors import (
    ExportFormatError,
    ImportConflictError,
    JournalVersionError,
    WorkflowNotFoundError,
)

EXPORT_FORMAT = 1
"""The version of the export's layout. An import reads this version and older ones."""

# Every per-workflow table (those _citus.BY_WORKFLOW shards by workflow), in the order an
# import inserts them: a row after the rows it references (a budget after its root's
# workflow, a charge or a tool call after its journal row).
TABLES: tuple[str, ...] = (
    "workflows",
    "budgets",
    "steps",
    "charges",
    "tool_calls",
    "effects",
    "approvals",
    "messages",
    "events",
    "streams",
    "step_attempts",
    "late_charges",
)
# Sharded by workflow id but not carried: the messages kept for an id no workflow has yet
# (send(before_start=True)) belong to no workflow an export could name.
NOT_CARRIED: frozenset[str] = frozenset({"early_messages"})

# The value of a NOT NULL column for rows exported before the column existed (an import
# reads every older export of its format): a migration that adds such a column to a
# per-workflow table adds its value here. jsonb_populate_recordset would make it NULL.
_DEFAULTS: dict[str, dict[str, Any]] = {
    # 0020: journals before it were version 1; 0033: runs before it had no attributes.
    "workflows": {"journal_version": 1, "attributes": {}},
}

# The column naming the workflow a row belongs to (a budget is its root workflow's).
_OWNER = {"budgets": "budget_id"}


def owner_column(table: str) -> str:
    return _OWNER.get(table, "workflow_id")


@unbounded()  # long by right: see _io/bounded.py
def export(db: SystemDB, workflow_id: str, *, children: bool, now: dt.datetime) -> dict[str, Any]:
    """The export of one workflow (and its descendants with `children`), read in one
    snapshot; WorkflowNotFoundError if there is no such workflow."""
    check_name("workflow_id", workflow_id)

    def work(tx: Tx) -> tuple[list[str], dict[str, list[dict[str, Any]]]]:
        tx.execute("export_snapshot", {})
        if not tx.fetch_all("export_workflows", {"workflow_ids": [workflow_id]}):
            raise WorkflowNotFoundError(workflow_id)
        ids = [workflow_id]
        level = [workflow_id]
        while children and level:
            # A level of the tree per statement (as a cancel walks it): a recursive query
            # over parent_id cannot run on a schema sharded by workflow id.
            found = tx.fetch_all("children_of", {"workflow_ids": level})
            level = sorted({str(r["workflow_id"]) for r in found} - set(ids))
            ids += level
        return ids, _read(tx, ids)

    ids, tables = db.atomically(work, "export_workflow")
    return {
        "durable_export": EXPORT_FORMAT,
        "labels_version": labels.LABELS_VERSION,
        "journal_version": labels.JOURNAL_VERSION,
        "schema_version": _migrate.latest_version(),
        "exported_at": now.isoformat(),
        "root": workflow_id,
        "workflow_ids": ids,
        "tables": tables,
    }


def _read(tx: Tx, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every row of these workflows, by table (each statement filters by their ids)."""
    p = {"workflow_ids": ids}
    tables = {
        "workflows": tx.fetch_all("export_workflows", p),
        "budgets": tx.fetch_all("export_budgets", p),
        "steps": tx.fetch_all("export_steps", p),
        "charges": tx.fetch_all("export_charges", p),
        "tool_calls": tx.fetch_all("export_tool_calls", p),
        "effects": tx.fetch_all("export_effects", p),
        "approvals": tx.fetch_all("export_approvals", p),
        "messages": tx.fetch_all("export_messages", p),
        "events": tx.fetch_all("export_events", p),
        "streams": tx.fetch_all("export_streams", p),
        "step_attempts": tx.fetch_all("export_step_attempts", p),
        "late_charges": tx.fetch_all("export_late_charges", p),
    }
    return {name: [json.loads(r["data"]) for r in rows] for name, rows in tables.items()}


@dataclass(frozen=True)
class Checked:
    """An export that passed every check, its rows ready to insert."""

    workflow_ids: list[str]
    tables: dict[str, list[dict[str, Any]]]

    @property
    def runnable(self) -> list[str]:
        """The imported workflows a worker may claim at once."""
        return [
            str(w["workflow_id"])
            for w in self.tables["workflows"]
            if w.get("status") == WorkflowStatus.PENDING
        ]


def check(data: object) -> Checked:
    """Refuse what an import cannot take (ExportFormatError, JournalVersionError), and
    release the claims of unfinished runs: see the module's docstring."""
    if not isinstance(data, Mapping) or "durable_export" not in data:
        raise ExportFormatError("it is not a durable export (it has no 'durable_export' key)")
    version = data["durable_export"]
    if not _is_int(version) or version < 1:
        raise ExportFormatError(f"its 'durable_export' is {version!r}, not a format number")
    if version > EXPORT_FORMAT:
        raise ExportFormatError(
            f"it is in export format {version}, newer than this release reads "
            f"({EXPORT_FORMAT}): import it with the release that wrote it or a newer one"
        )
    written = data.get("labels_version", 1)
    if not _is_int(written):
        raise ExportFormatError(f"its 'labels_version' is {written!r}, not a number")
    if written > labels.LABELS_VERSION:
        raise JournalVersionError(
            "the export's journal labels", written, labels.LABELS_VERSION, data.get("root")
        )
    schema = data.get("schema_version", _migrate.latest_version())
    if not _is_int(schema):
        raise ExportFormatError(f"its 'schema_version' is {schema!r}, not a migration number")
    if schema > _migrate.latest_version():
        raise ExportFormatError(
            f"it was written by a release whose schema is at migration {schema}, newer than "
            f"this release's ({_migrate.latest_version()}), so its rows may hold what this "
            "release would drop or misread: import it with that release or a newer one"
        )
    ids = data.get("workflow_ids")
    if not isinstance(ids, list) or not ids or len(set(ids)) != len(ids):
        raise ExportFormatError("its 'workflow_ids' is not a list of distinct workflow ids")
    for workflow_id in ids:
        check_name("workflow_id", workflow_id)
    given = data.get("tables")
    if not isinstance(given, Mapping):
        raise ExportFormatError("it has no 'tables' object")
    unknown = sorted(set(given) - set(TABLES))
    if unknown:
        raise ExportFormatError(f"it has tables this release does not know: {unknown}")
    tables: dict[str, list[dict[str, Any]]] = {}
    known = set(ids)
    for table in TABLES:
        rows = given.get(table, [])
        if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
            raise ExportFormatError(f"its table {table!r} is not a list of rows")
        column = owner_column(table)
        strays = {r.get(column) for r in rows} - known
        if strays:
            raise ExportFormatError(
                f"rows of {table!r} belong to {sorted(map(str, strays))}, which are not "
                "among its workflow_ids"
            )
        tables[table] = [{**_DEFAULTS.get(table, {}), **r} for r in rows]
    found = [w["workflow_id"] for w in tables["workflows"]]
    if sorted(found) != sorted(ids):
        raise ExportFormatError("its workflows rows are not exactly its workflow_ids")
    for row in tables["workflows"]:
        version = row["journal_version"]
        if not _is_int(version):
            raise ExportFormatError(f"its journal_version is {version!r}, not a number")
        if version > labels.JOURNAL_VERSION:
            raise JournalVersionError(
                f"the journal of workflow {row['workflow_id']!r}",
                version,
                labels.JOURNAL_VERSION,
                str(row["workflow_id"]),
            )
        _release(row)
    for row in tables["steps"]:
        _check_journal_row(row)
    return Checked(list(ids), tables)


_KINDS = frozenset(k.value for k in StepKind)


def _check_journal_row(row: Mapping[str, Any]) -> None:
    """ExportFormatError for a journal row no run of durable writes. The table has no CHECK
    for these (0041: durable's own statements cannot get them wrong, and a CHECK cost every
    record), so an import, whose rows come from a file, is where they are refused."""
    where = f"its journal row {row.get('workflow_id')!r} #{row.get('step_seq')!r}"
    kind = row.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise ExportFormatError(f"{where} has kind {kind!r}, not one of {sorted(_KINDS)}")
    seq: Any = row.get("step_seq")
    if not _is_int(seq) or seq < 0:
        raise ExportFormatError(f"{where} has a position that is not a number from 0")
    attempts: Any = row.get("attempts", 1)
    if not _is_int(attempts) or attempts < 1:
        raise ExportFormatError(f"{where} has attempts {attempts!r}, not a number from 1")
    if row.get("output") is not None and row.get("error") is not None:
        raise ExportFormatError(f"{where} has both an output and an error")


def _release(row: dict[str, Any]) -> None:
    """An unfinished run's claim belonged to an executor of the exporting database: here
    nobody holds it, and a worker (or `client.resume`) takes it up. Every other status is
    kept: a suspended workflow still waits for its message, decision or wake-up time."""
    if row.get("status") == WorkflowStatus.RUNNING:
        row.update(status=WorkflowStatus.PENDING.value, owner=None, lease_expires_at=None)


@unbounded()  # long by right: see _io/bounded.py
def import_(db: SystemDB, checked: Checked, then: Callable[[Tx], None] | None = None) -> None:
    """Insert a checked export's rows in one transaction (with what `then(tx)` writes: the
    audit rows); nothing is written when any is refused. ImportConflictError if this
    database already has one of its ids; ExportFormatError for a row with a column this
    database's table lacks (it would be dropped), a row PostgreSQL refuses (a value of the
    wrong type, a missing one, a broken reference) and two rows with the same key (a
    journal row twice, say)."""
    ids = checked.workflow_ids

    def work(tx: Tx) -> None:
        taken = tx.fetch_all("import_taken", {"workflow_ids": ids})
        if taken:
            raise ImportConflictError(sorted(str(r["workflow_id"]) for r in taken))
        _refuse_unknown_columns(checked.tables, tx.fetch_one("import_columns", {}))
        t = {name: {"rows": json.dumps(rows)} for name, rows in checked.tables.items()}
        with _refused("workflows"):
            tx.execute("import_workflows", t["workflows"])
        with _refused("budgets"):
            tx.execute("import_budgets", t["budgets"])
        with _refused("steps"):
            tx.execute("import_steps", t["steps"])
        with _refused("charges"):
            tx.execute("import_charges", t["charges"])
        with _refused("tool_calls"):
            tx.execute("import_tool_calls", t["tool_calls"])
        with _refused("effects"):
            tx.execute("import_effects", t["effects"])
        with _refused("approvals"):
            tx.execute("import_approvals", t["approvals"])
        with _refused("messages"):
            tx.execute("import_messages", t["messages"])
        with _refused("events"):
            tx.execute("import_events", t["events"])
        with _refused("streams"):
            tx.execute("import_streams", t["streams"])
        with _refused("step_attempts"):
            tx.execute("import_step_attempts", t["step_attempts"])
        with _refused("late_charges"):
            tx.execute("import_late_charges", t["late_charges"])
        if then is not None:
            then(tx)

    try:
        db.atomically(work, "import_workflow")
    except Exception as exc:
        if not is_unique_violation(exc, None):
            raise
        # Another import (or a start) of one of these ids committed after the check, or
        # the export holds two rows with the same key: the ids, read again, tell which.
        taken = db.fetch_all("import_taken", {"workflow_ids": ids})
        if taken:
            raise ImportConflictError(sorted(str(r["workflow_id"]) for r in taken)) from None
        raise ExportFormatError(
            f"it holds two rows with the same key: {refused_data(exc)}; keep each row once"
        ) from None


@contextmanager
def _refused(table: str) -> Iterator[None]:
    """A table's rows that PostgreSQL refuses (a value of the wrong type, a missing one, a
    broken reference) as ExportFormatError; a duplicate key is told apart from a conflict
    with this database's rows after the transaction (import_), so it passes through."""
    try:
        yield
    except Exception as exc:
        why = refused_data(exc)
        if why is None or is_unique_violation(exc, None):
            raise
        raise ExportFormatError(f"its {table!r} rows were refused: {why}") from None


def _refuse_unknown_columns(
    tables: Mapping[str, list[dict[str, Any]]], columns: Mapping[str, Any] | None
) -> None:
    """ExportFormatError for a row with a column this database's table lacks: the insert
    would drop it without a word (a newer release's column, or an edited export)."""
    assert columns is not None  # import_columns returns one row
    for table in TABLES:
        known = set(columns[table])
        extra = sorted({key for row in tables[table] for key in row} - known)
        if extra:
            raise ExportFormatError(
                f"its {table!r} rows have column(s) {extra} that this database's {table} "
                "table lacks (an export of a newer release, or an edited one): importing "
                "it would drop them"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
