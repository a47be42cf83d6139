"""Debouncing: a burst of starts of one workflow under one key becomes one run, with the
last inputs, once the key has been quiet for a period.

A debounced start is a delayed queue entry (a workflows row, ENQUEUED, `available_at` in
the future). The key is held in the queue's dedup table (`queue_dedup`, under the name
`_labels.debounce_key`), pointing at the key's current entry. Debouncing again takes
that row first (`take_dedup`: its row lock orders every debounce of one key, in any
process), then, in ONE statement, replaces the entry's inputs and pushes its start back,
but only while it is still ENQUEUED. A worker dequeues under FOR UPDATE SKIP LOCKED and
re-reads the row it locks, so the two never both win: either the update lands first (the
entry starts later, with the new inputs) or the dequeue does (the update matches nothing,
and this debounce makes the key's next entry). So each quiet period gives one run, and a
run gets the inputs of the last debounce that reached it.

`max_wait` bounds how long a stream of debounces can postpone a run: an entry never starts
later than `max_wait` seconds after its first debounce (its row's `created_at`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from durable._base import labels
from durable._base.names import check_name
from durable._base.registry import Registry, default_registry
from durable._client.queues import Queue
from durable._client.starts import Recorder
from durable._run.decorators import workflow_call
from durable._run.methods import reference
from durable.errors import ConfigurationError, DuplicateNameError

if TYPE_CHECKING:
    from durable._io.systemdb import Tx


P = ParamSpec("P")
R = TypeVar("R")

# The queue debounced entries wait on when no queue is given: registered in a registry
# only once a Debouncer is made there, so that engines without one poll no extra queue.
DEFAULT_QUEUE = "durable.debounce"

# The longest period or max_wait accepted (100 years): beyond it a timestamp overflows.
_MAX_SECONDS = 100 * 365.25 * 86400


def _default_queue(registry: Registry) -> Queue:
    """The registry's internal debounce queue, registered by the first Debouncer."""
    existing = registry.get_queue(DEFAULT_QUEUE)
    if isinstance(existing, Queue):
        return existing
    try:
        return Queue(DEFAULT_QUEUE, registry=registry)
    except DuplicateNameError:  # another thread registered it meanwhile
        queue = registry.get_queue(DEFAULT_QUEUE)
        assert isinstance(queue, Queue)
        return queue


def _seconds(name: str, value: object, *, optional: bool = False) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not 0 < value <= _MAX_SECONDS
    ):
        raise ConfigurationError(
            f"{name}={value!r}: give a number of seconds above 0 (at most {_MAX_SECONDS:.0f})"
            + (", or None" if optional else "")
        )
    return float(value)


class DebounceSpec(Generic[P, R]):
    """Starts `workflow` once per quiet period of a key, with the last inputs given.

    `debouncer.debounce(key, *args, **kwargs)` records a start of the workflow that waits
    `period` seconds; debouncing the same key again before it started replaces its inputs
    and pushes its start back to `period` seconds from now, so a burst of calls runs once,
    with the last call's arguments, after the key has been quiet for `period`. Once the run
    started, the next debounce of the key waits for a run of its own. `max_wait` (seconds,
    default None: no bound) caps how long a stream of calls can postpone a run, counted from
    the first debounce of the period. This holds across processes: the key is taken under a
    row lock in the database. The entry waits on `queue` (default: an internal queue
    "durable.debounce"), so any worker that imports the debouncer's module runs it, within
    that queue's limits.

    What a durable.Debouncer is (see its docstring in _client/debounce_async.py): its debounce()
    and debounce_async() are in _client/debounce.py and _client/debounce_async.py.
    """

    def __init__(
        self,
        workflow: Callable[P, R],
        *,
        period: float,
        max_wait: float | None = None,
        queue: Queue | None = None,
        registry: Registry | None = None,
    ) -> None:
        # A method's object (or class) is the first argument of each stored call.
        self.defn, self._receiver = workflow_call(workflow, ())
        self.period = _seconds("period", period)
        self.max_wait = None if max_wait is None else _seconds("max_wait", max_wait, optional=True)
        if queue is not None and not isinstance(queue, Queue):
            raise ConfigurationError(f"queue={queue!r}: give a durable.Queue, or None")
        reg = registry if registry is not None else default_registry
        self.queue = queue if queue is not None else _default_queue(reg)

    def __repr__(self) -> str:
        return (
            f"Debouncer({self.defn.name!r}, period={self.period}, max_wait={self.max_wait}, "
            f"queue={self.queue.name!r})"
        )

    def _dedup_key(self, key: str) -> str:
        """Where the key is held in the queue's dedup table: per workflow, and per
        instance for a method workflow, so debouncers of two workflows (or of one method
        on two instances) never share a key."""
        ref = reference(self.defn, self._receiver)
        target = self.defn.name
        if ref is not None:
            target += "@" + ref["class"] + ("/" + ref["instance"] if "instance" in ref else "")
        return labels.debounce_key(target, key)


def record(
    client: Recorder,
    debouncer: DebounceSpec[Any, Any],
    key: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    """Debounce one start (see Debouncer), in one transaction; the id of the entry that
    will run it."""
    if not isinstance(debouncer, DebounceSpec):
        raise ConfigurationError(f"debouncer={debouncer!r}: give a durable.Debouncer")
    check_name("key", key)
    defn = debouncer.defn
    inputs = client.inputs.encode(defn, (*debouncer._receiver, *args), kwargs)
    new_id = str(uuid.uuid4())
    params = client.inputs.row(defn, new_id, inputs, None, client.default_durability)
    period = debouncer.period
    max_wait = debouncer.max_wait
    first_delay = period if max_wait is None else min(period, max_wait)
    params.update(
        queue_name=debouncer.queue.name,
        priority=0,
        dedup_key=None,
        delay_seconds=first_delay,
        partition_key=None,  # a debounced run counts against its queue's limits only
    )
    held = {
        "queue_name": debouncer.queue.name,
        "dedup_key": debouncer._dedup_key(key),
        "workflow_id": new_id,
    }
    push = {
        "inputs": inputs,
        "serializer": client.inputs.serializer_name,  # of these inputs, whoever wrote the last
        "name": defn.name,
        "period": period,
        "max_wait": debouncer.max_wait,
    }

    def attempt(tx: Tx) -> str:  # run again from the start after a conflict
        taken = tx.fetch_one("take_dedup", held)
        assert taken is not None
        holder = str(taken["workflow_id"])
        if holder != new_id:
            if tx.fetch_one("push_debounced", {**push, "workflow_id": holder}) is not None:
                return holder  # not started yet: it runs later, with these inputs
            tx.execute("pass_dedup", held)  # it started (or ended): this is the next one
        tx.fetch_one("enqueue_workflow", params)
        return new_id

    workflow_id = client.db.atomically(attempt, "debounce")
    client.notify_work(workflow_id)
    return workflow_id
