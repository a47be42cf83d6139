"""The audit log: which operator cancelled, resumed, moved, forked, imported, decided,
paused, unpaused, raised a budget of, sent a message to, created, updated, paused,
deleted, triggered or backfilled a schedule, when, and from where.

Each action and its audit rows are written in one transaction, so an action without its
record cannot exist (and a refused or rolled-back one leaves none). An action that changed
nothing (a repeated decision, a resume of a workflow still going, a cancel of a finished
one) is not recorded. The table (migration 0028, `audit_log`) is keyed by the workflow the
action was on ('' for a schedule's), each row a uuid made here: no sequence. It is not one
of a workflow's tables: an export does not carry it and retention does not prune it, so
the record of who cancelled or deleted outlives what it names. On Citus it is sharded by
workflow id in its own group (`_citus.BY_OWN_KEY`): an action and its row commit in one
transaction, two-phase when they sit on two nodes, which operator actions (a few a day)
can afford; a reference table would copy an ever-growing log to every node.

Who acts (the actor) is given by the caller, never read from a request: `acting_as(...)`
for the calls made in its block (the console: "console <client address> ..."), else the
client's `actor` (the CLI's: "<user>@<host> via cli"), else "library <user>@<host>".
"""

from __future__ import annotations

import datetime as dt
import getpass
import socket
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

from durable import _core as protocol
from durable._base.names import check_text
from durable._client import transfer
from durable._io.systemdb import SystemDB, Tx


class ClientBase(Protocol):
    """What the audit needs of a Client: who it acts as, and its database."""

    actor: str | None

    @property
    def db(self) -> SystemDB: ...


# One action's row: the workflow it was on ('' for none), the action, what else it names
# (a gate, a schedule, a fork's id, a version), and its details (a reason, a comment).
Entry = tuple[str, str, str | None, str | None]

T = TypeVar("T")

_acting: ContextVar[str | None] = ContextVar("durable_actor", default=None)


def whoami() -> str:
    """`user@host` of this process (the OS user; "unknown" when it has none)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@contextmanager
def acting_as(actor: str) -> Iterator[None]:
    """The operator actions called in this block (this thread or task) are recorded as
    `actor`'s."""
    check_text("actor", actor)
    if not actor.strip():
        raise ValueError("actor: give who acts, e.g. 'ana@ops via cli'")
    token = _acting.set(actor)
    try:
        yield
    finally:
        _acting.reset(token)


def actor_of(client: ClientBase) -> str:
    """Who acts now: acting_as's actor, else the client's, else this process's user."""
    return _acting.get() or client.actor or f"library {whoami()}"


def record(tx: Tx, actor: str, entries: Sequence[Entry]) -> None:
    """Write the audit rows of an action, in its own transaction `tx`."""
    if not entries:
        return
    tx.execute(
        "insert_audit",
        {
            "actor": actor,
            "workflow_ids": [e[0] for e in entries],
            "audit_ids": [uuid.uuid4() for _ in entries],
            "actions": [e[1] for e in entries],
            "subjects": [e[2] for e in entries],
            "details": [e[3] for e in entries],
        },
    )


def run_ops(tx: Tx, gen: protocol.Gen[T]) -> T:
    """Run a protocol generator that asks only for statements (Execute) in `tx`."""
    answer: Any = None
    while True:
        try:
            op = gen.send(answer)
        except StopIteration as stop:
            result: T = stop.value
            return result
        if not isinstance(op, protocol.Execute):
            raise TypeError(f"{op!r} needs a run")
        if op.fetch == "count":
            answer = tx.execute(op.name, op.params)
        elif op.fetch == "one":
            answer = tx.fetch_one(op.name, op.params)
        else:
            answer = tx.fetch_all(op.name, op.params)


def cancel_tree(
    client: ClientBase, workflow_id: str, reason: str, error: str, terminate: bool = False
) -> list[Any]:
    """protocol.cancel_tree in one transaction with its audit rows (one per workflow whose
    row the cancel changed: the workflow, and its descendants as asked of it). `terminate`:
    terminate_workflows, audited as "terminate"."""
    actor = actor_of(client)
    action = "terminate" if terminate else "cancel"
    statement = f"{action}_workflows"

    def work(tx: Tx) -> list[Any]:
        rows = run_ops(tx, protocol.cancel_tree(workflow_id, reason, error, statement))
        record(
            tx,
            actor,
            [
                (
                    r["workflow_id"],
                    action,
                    None if r["workflow_id"] == workflow_id else f"with {workflow_id}",
                    reason,
                )
                for r in rows
            ],
        )
        return rows

    return client.db.atomically(work, "cancel_workflows")


def resume(client: ClientBase, params: dict[str, Any]) -> dict[str, Any] | None:
    """resume_workflow (else, given a version, move_workflow) with its audit row."""
    actor = actor_of(client)
    version = params["version"]
    shown = None if version is None else f"version {version!r}" if version else "no version"

    def work(tx: Tx) -> dict[str, Any] | None:
        action, row = "resume", tx.fetch_one("resume_workflow", params)
        if row is None and version is not None:
            action, row = "move", tx.fetch_one("move_workflow", params)
        if row is not None:
            record(tx, actor, [(params["workflow_id"], action, shown, None)])
        return row

    return client.db.atomically(work, "resume_workflow")


def pause(client: ClientBase, workflow_id: str, pause: bool) -> dict[str, Any] | None:
    """pause_workflow (or, `pause` false, unpause_workflow) with its audit row, when it
    changed the row; the row as it is after (its status, and a pause's epoch)."""
    actor = actor_of(client)
    params = {"workflow_id": workflow_id}

    def work(tx: Tx) -> dict[str, Any] | None:
        if pause:
            row = tx.fetch_one("pause_workflow", params)
        else:
            row = tx.fetch_one("unpause_workflow", params)
        if row is not None:
            action = "pause" if pause else "unpause"
            record(tx, actor, [(workflow_id, action, None, f"now {row['status']}")])
        return row

    return client.db.atomically(work, "pause_workflow" if pause else "unpause_workflow")


def fork(client: ClientBase, params: dict[str, Any]) -> bool:
    """SystemDB.fork with its audit rows: on the original, and on the fork."""
    actor = actor_of(client)
    original, new_id, step = params["workflow_id"], params["new_id"], params["before_seq"]
    entries: list[Entry] = [
        (original, "fork", new_id, f"from step {step}"),
        (new_id, "forked", original, f"from step {step}"),
    ]
    return client.db.fork(params, then=lambda tx: record(tx, actor, entries))


def decide(client: ClientBase, params: dict[str, Any]) -> Any:
    """decide_approval with its audit row (when this call made the decision)."""
    actor = actor_of(client)
    action = "approve" if params["status"] == "approved" else "deny"

    def work(tx: Tx) -> Any:
        row = tx.fetch_one("decide_approval", params)
        if row is not None and row["decided"]:
            entry = (params["workflow_id"], action, params["name"], params["comment"])
            record(tx, actor, [entry])
        return row

    return client.db.atomically(work, "decide_approval")


def raise_budget(client: ClientBase, workflow_id: str, params: dict[str, Any]) -> Any:
    """raise_budget with its audit row, on the workflow it was asked of."""
    actor = actor_of(client)
    raised = ", ".join(
        f"{k} +{params[k]}" for k in ("dollars", "tokens", "steps", "seconds") if params[k]
    )

    def work(tx: Tx) -> Any:
        row = tx.fetch_one("raise_budget", params)
        if row is not None:
            record(tx, actor, [(workflow_id, "raise budget", None, raised or None)])
        return row

    return client.db.atomically(work, "raise_budget")


def pause_schedule(client: ClientBase, name: str, paused: bool) -> Any:
    actor = actor_of(client)

    def work(tx: Tx) -> Any:
        row = tx.fetch_one("set_schedule_paused", {"schedule_name": name, "paused": paused})
        if row is not None:
            action = "pause schedule" if paused else "resume schedule"
            record(tx, actor, [("", action, name, None)])
        return row

    return client.db.atomically(work, "set_schedule_paused")


def delete_schedule(client: ClientBase, name: str) -> Any:
    actor = actor_of(client)

    def work(tx: Tx) -> Any:
        row = tx.fetch_one("delete_schedule", {"schedule_name": name})
        if row is not None:
            record(tx, actor, [("", "delete schedule", name, None)])
        return row

    return client.db.atomically(work, "delete_schedule")


def set_schedule(client: ClientBase, row: dict[str, Any]) -> None:
    """upsert_schedule with its audit row ("create schedule", "update schedule"); storing a
    schedule as it already is records nothing (an application storing its schedules at
    each start is not an operator's change)."""
    actor = actor_of(client)
    name = row["schedule_name"]

    def work(tx: Tx) -> None:
        old = next(
            (r for r in tx.fetch_all("list_schedules", {}) if r["schedule_name"] == name), None
        )
        tx.execute("upsert_schedule", row)
        if old is not None and all(old[k] == v for k, v in row.items()):
            return
        action = "create schedule" if old is None else "update schedule"
        detail = f"{row['workflow_name']} at {row['cron']!r} ({row['timezone']})"
        record(tx, actor, [("", action, name, detail)])

    client.db.atomically(work, "upsert_schedule")


def start_runs(client: ClientBase, rows: list[dict[str, Any]], action: str, name: str) -> int:
    """insert_workflow_pending of a schedule's runs started by hand (action: "trigger
    schedule", "backfill schedule"), with an audit row on each run started now; returns
    how many were (a backfilled tick that already ran starts nothing, records nothing)."""
    actor = actor_of(client)

    def work(tx: Tx) -> int:
        started = [str(r["workflow_id"]) for r in rows if tx.execute("insert_workflow_pending", r)]
        record(tx, actor, [(workflow_id, action, name, None) for workflow_id in started])
        return len(started)

    return client.db.atomically(work, "insert_workflow_pending")


def send(client: ClientBase, params: dict[str, Any]) -> None:
    """send_message; with its audit row when an operator named makes it (the CLI, the
    console, acting_as, a client given an actor). An application's own sends (a client
    with no actor: a webhook handler, a service) are its traffic, not operator actions:
    recording them would bury the few actions the log is for. Workflow code's sends
    (durable.send) are journaled as the sender's steps and never come here."""
    actor = _acting.get() or client.actor
    if actor is None:
        client.db.execute("send_message", params)
        return
    entry = (params["workflow_id"], "send", params["topic"] or None, params["message_id"])

    def work(tx: Tx) -> None:
        tx.execute("send_message", params)
        record(tx, actor, [entry])

    client.db.atomically(work, "send_message")


def keep_early(client: ClientBase, params: dict[str, Any]) -> dict[str, Any] | None:
    """keep_early_message (send(..., before_start=True)); with its audit row, as send's,
    when an operator makes it and the message was kept (a workflow found has it sent by
    send instead)."""
    actor = _acting.get() or client.actor
    if actor is None:
        return client.db.fetch_one("keep_early_message", params)
    entry = (params["workflow_id"], "send", params["topic"] or None, params["message_id"])

    def work(tx: Tx) -> dict[str, Any] | None:
        row = tx.fetch_one("keep_early_message", params)
        if row is not None and not row["found"]:
            record(tx, actor, [entry])
        return row

    return client.db.atomically(work, "keep_early_message")


def import_(client: ClientBase, checked: transfer.Checked) -> None:
    """transfer.import_ with an audit row per workflow imported."""
    actor = actor_of(client)
    entries: list[Entry] = [(i, "import", None, None) for i in checked.workflow_ids]
    transfer.import_(client.db, checked, then=lambda tx: record(tx, actor, entries))


def bulk(client: ClientBase, action: str, described: str, changed: int) -> None:
    """The row of a bulk action as a whole ('' as its workflow: it names a filter), after
    the rows of each run it changed: "bulk cancel", the filter, how many it changed."""
    actor = actor_of(client)
    entry = ("", f"bulk {action}", described, f"{changed} changed")
    client.db.atomically(lambda tx: record(tx, actor, [entry]), "insert_audit")


def read(
    client: ClientBase,
    workflow_id: str | None = None,
    *,
    action: str | None = None,
    before: tuple[dt.datetime, uuid.UUID | str] | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Audit rows, newest first: of one workflow ('' for the schedules'), or of all;
    `before` is the (at, audit_id) of the last row of the page before."""
    at, audit_id = before if before is not None else (None, None)
    params = {
        "workflow_id": workflow_id,
        "action": action,
        "before_at": at,
        "before_id": None if audit_id is None else uuid.UUID(str(audit_id)),
        "limit": limit,
    }
    if workflow_id is not None:
        return client.db.fetch_all("audit_of_workflow", params)
    return client.db.fetch_all("list_audit", params)
