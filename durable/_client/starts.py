# Generated from durable/_client/starts_async.py by tools/async_to_sync.py: do not edit.
# Edit the source, then run `python tools/async_to_sync.py`
# (tests/unit/test_generated_sync.py fails while this file is out of date).
"""Where a new workflow is placed and recorded: the start of a workflow from a caller or
from workflow code, by an engine's start, a client's submit or enqueue, start_child.

durable.start_child is a start from workflow code too.

A start from outside workflow code is a workflow of its own (the id given, else a new
one). A start from workflow code (not a step) is a child at the next position of the
parent's journal (protocol.place_start: a deterministic id, the journaled one on a replay,
with nothing stored again), and how it ended is journaled there (protocol.record_start):
so a parent killed after the child's row is written, and recovered, adopts the same child.
Every start goes through start_placed (start_placed_async from an async workflow), and a
queue entry is recorded by enqueue here, whoever asks for it.

This module is the source of the awaited forms; `_client/starts.py`, the plain ones, is generated
from it by tools/async_to_sync.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from durable import _core as protocol
from durable._base.names import check_name
from durable._base.registry import WorkflowDef
from durable._client.in_txn import AppTransaction, new_outbox_id
from durable._client.queues import Queue
from durable._core import Run
from durable._run.acompat import Call, to_thread, workflow_run
from durable._run.attributes import call_attributes, pop_attributes
from durable._run.child_handle import ChildHandle
from durable._run.context import workflow_code_run
from durable._run.decorators import workflow_call, workflow_def
from durable._run.driver import drive
from durable._run.start_options import options_target
from durable._run.timeouts import call_timeout, pop_timeout
from durable.errors import (
    AsyncInSyncError,
    BlockingCallError,
    ConfigurationError,
    QueueDedupError,
)

if TYPE_CHECKING:
    from durable._base.models import WorkflowInfo
    from durable._client.inputs import Inputs
    from durable._io.config import Config
    from durable._io.systemdb import SystemDB, Tx

T = TypeVar("T")


class Recorder(Protocol):
    """What recording a workflow needs of the client that records it."""

    config: Config

    @property
    def db(self) -> SystemDB: ...

    @property
    def _notify_channel(self) -> str: ...

    inputs: Inputs

    @property
    def default_durability(self) -> str: ...

    def notify_work(self, payload: str = "") -> None: ...

    def existing(
        self, defn: WorkflowDef, workflow_id: str, inputs: str | None = None
    ) -> WorkflowInfo: ...


def start_placed(
    defn: WorkflowDef,
    workflow_id: str | None,
    create: Call[[str, tuple[str, int] | None], T],
) -> tuple[str, T | None]:
    """Store a workflow started or enqueued now, with `create(id, parent)`, and return its
    id and what `create` returned (None when nothing was stored). Outside workflow code it
    is a workflow of its own (`workflow_id`, else a new id). Inside a workflow (not a step)
    it is a child at the next position of the parent's journal, and how its start ended is
    journaled there. From an async workflow only the awaited starts journal, from a
    plain-def one only the plain ones."""
    run, placed, chosen = _place(defn, workflow_id, asynchronous=False)
    if run is None or placed is None:
        return chosen, create(chosen, None)
    if placed.journaled:
        return chosen, None
    try:
        made = create(chosen, (run.workflow_id, placed.seq))
    except Exception as exc:
        drive(run, protocol.record_start(run, placed, defn.name, exc))
        raise
    drive(run, protocol.record_start(run, placed, defn.name))
    return chosen, made


def _place(
    defn: WorkflowDef, workflow_id: str | None, *, asynchronous: bool
) -> tuple[Run | None, protocol.Placed | None, str]:
    """Where a start goes: (the parent's run, the position taken in its journal, the id),
    or no run and no position outside workflow code. From an async workflow only the
    awaited forms (start_async, enqueue_async) can journal it; from a plain-def one only
    the plain ones."""
    run = workflow_code_run()
    if run is None:
        return None, None, workflow_id or str(uuid.uuid4())
    if run.is_async != asynchronous:
        if run.is_async:
            raise BlockingCallError(
                f"starting {defn.name!r} from async workflow {run.name!r} would block its "
                "event loop: use `await engine.start_async(...)` / `enqueue_async(...)`"
            )
        raise AsyncInSyncError(
            f"start_async/enqueue_async of {defn.name!r} in plain-def workflow "
            f"{run.name!r}: use engine.start(...) / enqueue(...)"
        )
    placed = protocol.place_start(run, defn.name, workflow_id)
    return run, placed, placed.workflow_id


def enqueue(
    client: Recorder,
    queue: Queue,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    workflow_id: str | None,
    dedup_key: str | None,
    priority: int | None,
    delay: float | None,
    partition_key: str | None,
    conn: Any = None,
) -> str:
    """Put `fn(*args, **kwargs)` on `queue` (see Client.enqueue: `timeout=` is popped from
    kwargs); the entry's id. From workflow code it is a child, journaled where it is
    called. `conn=`: in the application's transaction (see _in_txn_async)."""
    check_enqueue(queue, workflow_id, dedup_key, priority, delay, partition_key)
    timeout = pop_timeout(kwargs)
    attributes = pop_attributes(kwargs)
    defn, call_args = workflow_call(fn, args)
    if conn is not None:
        if dedup_key is not None:
            raise ConfigurationError(
                "dedup_key= with conn=: a dedup key is taken in durable's own transaction; "
                "enqueue without conn=, or without dedup_key= (workflow_id= is an "
                "idempotency key too)"
            )
        app = AppTransaction.open(client, conn)

        def create_in(chosen: str, parent: tuple[str, int] | None) -> None:
            with call_timeout(timeout):
                inputs = client.inputs.encode(defn, call_args, kwargs)
                params = client.inputs.row(defn, chosen, inputs, parent, client.default_durability)
            params.update(_entry(queue, priority, None, delay, partition_key))
            _write(client, app, defn, "enqueue_workflow", params)

        chosen, _ = start_placed(defn, workflow_id, create_in)
        return chosen

    def create(chosen: str, parent: tuple[str, int] | None) -> None:
        # (to_thread carries the blocks into the thread)
        with call_timeout(timeout), call_attributes(attributes):
            to_thread(
                _enqueue,
                client,
                queue,
                defn,
                chosen,
                parent,
                call_args,
                kwargs,
                dedup_key,
                priority,
                delay,
                partition_key,
            )

    chosen, _ = start_placed(defn, workflow_id, create)
    return chosen


def _enqueue(
    client: Recorder,
    queue: Queue,
    defn: WorkflowDef,
    workflow_id: str,
    parent: tuple[str, int] | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    dedup_key: str | None,
    priority: int | None,
    delay: float | None,
    partition_key: str | None,
) -> None:
    inputs = client.inputs.encode(defn, args, kwargs)
    params = client.inputs.row(defn, workflow_id, inputs, parent, client.default_durability)
    params.update(_entry(queue, priority, dedup_key, delay, partition_key))
    if dedup_key is None:
        row = client.db.fetch_one("enqueue_workflow", params)
    else:
        row = client.db.atomically(lambda tx: _enqueue_deduplicated(tx, params), "enqueue")
    stored(client, defn, workflow_id, row, params["inputs"])


def _entry(
    queue: Queue,
    priority: int | None,
    dedup_key: str | None,
    delay: float | None,
    partition_key: str | None,
) -> dict[str, Any]:
    """enqueue_workflow's parameters besides the workflow's row."""
    return {
        "queue_name": queue.name,
        "priority": priority or 0,
        "dedup_key": dedup_key,
        "delay_seconds": float(delay or 0.0),
        "partition_key": partition_key,
    }


def start_in(
    client: Recorder,
    conn: Any,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    workflow_id: str | None,
    remember: Callable[[str], None] | None = None,
) -> str:
    """Record `fn(*args, **kwargs)` as runnable for any worker (Client.submit's row) in the
    application's transaction on `conn` (see _in_txn_async); its id. `remember`: told the
    id before the row is written (an engine's keeper claims it once it is committed)."""
    check_name("workflow_id", workflow_id, optional=True)
    timeout, attributes = pop_timeout(kwargs), pop_attributes(kwargs)
    defn, call_args = workflow_call(fn, args)
    app = AppTransaction.open(client, conn)

    def create(chosen: str, parent: tuple[str, int] | None) -> None:
        with call_timeout(timeout), call_attributes(attributes):
            inputs = client.inputs.encode(defn, call_args, kwargs)
            params = client.inputs.row(defn, chosen, inputs, parent, client.default_durability)
        if remember is not None:
            remember(chosen)
        _write(client, app, defn, "insert_workflow_pending", params)

    chosen, _ = start_placed(defn, workflow_id, create)
    return chosen


def _write(
    client: Recorder, app: AppTransaction, defn: WorkflowDef, statement: str, params: dict[str, Any]
) -> None:
    """A new workflow's row in the application's transaction; an id that exists is checked
    as any start checks it (WorkflowConflictError if another workflow holds it)."""
    chosen = params["workflow_id"]
    here, row = app.write(client, statement, params, new_outbox_id("workflow", chosen))
    if here and row is None:
        to_thread(client.existing, defn, chosen, params["inputs"])


def stored(client: Recorder, defn: WorkflowDef, workflow_id: str, row: Any, inputs: str) -> None:
    """After a new workflow's insert: wake a worker, or check the id's existing holder."""
    if row is None:
        client.existing(defn, workflow_id, inputs)
    else:
        client.notify_work(workflow_id)


def _enqueue_deduplicated(tx: Tx, params: dict[str, Any]) -> dict[str, Any] | None:
    """Enqueue holding a dedup key: take the key (or find its holder, locked), and refuse
    while the holder is queued or unfinished; a finished holder's key passes to this
    workflow. One transaction, run again from the start after a conflict."""
    key = {k: params[k] for k in ("queue_name", "dedup_key", "workflow_id")}
    taken = tx.fetch_one("take_dedup", key)
    assert taken is not None
    holder = str(taken["workflow_id"])
    if holder != params["workflow_id"]:
        active = tx.fetch_one("dedup_holder_active", {"holder": holder})
        if active is not None and active["active"]:
            raise QueueDedupError(params["queue_name"], str(params["dedup_key"]), holder)
        tx.execute("pass_dedup", key)
    return tx.fetch_one("enqueue_workflow", params)


def check_enqueue(
    queue: Queue,
    workflow_id: str | None,
    dedup_key: str | None,
    priority: int | None,
    delay: float | None,
    partition_key: str | None = None,
) -> None:
    """enqueue's own keyword arguments, checked."""
    if not isinstance(queue, Queue):
        raise ConfigurationError(f"queue={queue!r}: give a durable.Queue")
    check_name("workflow_id", workflow_id, optional=True)
    queue.check_options(dedup_key, priority, partition_key, delay)


def start_child(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> ChildHandle:
    """Start `fn(*args, **kwargs)` as a child of the calling workflow and return its
    handle without waiting. The start is journaled (the child's id is derived from this
    call's position unless `workflow_id=` is given), so a replay returns the same child.
    `timeout=` gives the child a timeout of its own (cut to what is left of the parent's).
    Only in workflow code (`await durable.start_child_async(...)` in an async one):
    elsewhere, start workflows with engine.start."""
    run = workflow_run("durable.start_child()")
    defn = workflow_def(options_target(fn))
    handle = run.host.active.start(fn, *args, **kwargs)
    return ChildHandle(handle.workflow_id, defn.name, defn.fn)
