"""Queues: workflows that wait for a slot, with limits that hold across every worker.

`durable.Queue("emails", concurrency=10, worker_concurrency=2, rate_limit=(100, 60))`
declares a queue in code; every worker that imports it dequeues from it. An entry is a
workflows row in status ENQUEUED. A worker dequeues in one transaction: it takes the
queue's advisory lock (`pg_try_advisory_xact_lock`; a worker that does not get it skips
the queue this round instead of waiting), then one statement counts what the limits still
allow and takes that many entries with FOR UPDATE SKIP LOCKED, starting them owned by
itself. The lock is what makes the counts true: two workers cannot both see one free slot.

A dequeued entry keeps its queue name until it finishes, so it holds its slot while it
runs, sleeps or is recovered after a crash. The rate limit counts dequeues within the
period, finished or not.

Partitions cap one user's or tenant's share of a queue:
`durable.Queue("agents", concurrency=10, partition_concurrency=2)` and
`queue.enqueue(run_agent, prompt, partition_key="user-1")`. An entry with a partition key
starts only while fewer than `partition_concurrency` entries of its partition hold a slot,
and the queue's own limits still hold over all partitions. The same dequeue, under the same
lock, counts the slots of every partition, and passes over the entries of a full partition
rather than waiting behind them: one busy user does not hold back the others. An entry
without a key is in no partition (only the queue's limits apply to it). A partition key
on a queue without a partition limit is refused (ConfigurationError) rather than ignored:
it would cap nothing.

A partition's rate is limited too: `durable.Queue("emails", partition_rate_limit=(5, 60))`
starts at most 5 entries of one partition key in any 60 seconds, across all workers,
beside (or without) `partition_concurrency` and the queue-wide `rate_limit`. It counts the
dequeues of the key's entries within the period, as `rate_limit` counts the queue's, in the
same statement under the same lock, so no two workers both see the key's last start free.
An entry of a key over its rate is passed over like one of a full partition, and the
entries of other keys still start; an entry without a key is in no partition, so only the
queue's own limits (`concurrency`, `rate_limit`) slow it. A recovery after a crash is no
new start: only a dequeue counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable._base import labels
from durable._base.names import check_name
from durable._base.registry import Registry, default_registry
from durable._run.context import current_engine
from durable._run.start_options import check_delay, check_priority, queue_enqueue_method
from durable.errors import ConfigurationError, NoEngineError

if TYPE_CHECKING:
    from durable._base.registry import WorkflowDef
    from durable._run.handles import WorkflowHandle


def _positive(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigurationError(f"{name}={value!r}: give a whole number of at least 1, or None")


def _rate(name: str, value: object, example: str, meaning: str) -> None:
    """A rate limit is None or (count, period_seconds): a whole count of at least 1 and a
    positive period."""
    if value is None:
        return
    ok = (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], int)
        and not isinstance(value[0], bool)
        and value[0] >= 1
        and isinstance(value[1], int | float)
        and not isinstance(value[1], bool)
        and value[1] > 0
        and value[1] != float("inf")
    )
    if not ok:
        raise ConfigurationError(
            f"{name}={value!r}: give (count, period_seconds), e.g. ({example}) for at most "
            f"{meaning}"
        )


@dataclass(frozen=True, eq=False)
class Queue:
    """A named queue of workflows, declared once at import time (like a workflow).

    concurrency: most entries dequeued and unfinished at once, across all workers.
    worker_concurrency: most entries one worker process runs at once.
    partition_concurrency: most entries of one partition (the `partition_key=` given at
        enqueue: a user, a tenant) dequeued and unfinished at once, across all workers;
        None (the default): the queue has no partitions.
    rate_limit: (count, period_seconds): most dequeues in any period.
    partition_rate_limit: (count, period_seconds): most dequeues of one partition's
        entries in any period, across all workers; None (the default): no such limit.
    priority: order by the priority given at enqueue (lower first), then age.
    """

    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate_limit: tuple[int, float] | None = None
    priority: bool = False
    registry: Registry | None = None
    partition_concurrency: int | None = None
    partition_rate_limit: tuple[int, float] | None = None

    def __post_init__(self) -> None:
        check_name("Queue name", self.name)
        _positive("concurrency", self.concurrency)
        _positive("worker_concurrency", self.worker_concurrency)
        _positive("partition_concurrency", self.partition_concurrency)
        _rate("rate_limit", self.rate_limit, "100, 60", "100 starts a minute")
        _rate("partition_rate_limit", self.partition_rate_limit, "5, 60", "5 a minute per key")
        (self.registry if self.registry is not None else default_registry).add_queue(self)

    @queue_enqueue_method
    def enqueue(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> WorkflowHandle:
        """Queue `fn(*args, **kwargs)` on the current engine (`with engine:`); its options,
        keyword-only: `workflow_id=`, `dedup_key=`, `priority=`, `delay=` and
        `partition_key=` (see Client.enqueue)."""
        engine = current_engine.get()
        if engine is None:
            raise NoEngineError()
        handle: WorkflowHandle = engine.enqueue(self, fn, *args, **kwargs)
        return handle

    def check_options(
        self,
        dedup_key: str | None,
        priority: int | None,
        partition_key: str | None,
        delay: float | None = None,
    ) -> None:
        """An enqueue's `dedup_key=`, `priority=`, `partition_key=` and `delay=`, checked
        against this queue: a priority or a partition key is refused on a queue declared
        without what it needs, where it would do nothing."""
        check_delay(delay)
        check_name("dedup_key", dedup_key, optional=True)
        if priority is not None:
            if not self.priority:
                raise ConfigurationError(
                    f"priority={priority!r} given, but queue {self.name!r} orders by age: "
                    f"declare it with durable.Queue({self.name!r}, priority=True)"
                )
            check_priority(priority)
        check_name("partition_key", partition_key, optional=True)
        if partition_key is not None and not self.partitioned:
            raise ConfigurationError(
                f"partition_key={partition_key!r} given, but queue {self.name!r} has no "
                "partition limit, so the key would cap nothing: declare it with "
                f"durable.Queue({self.name!r}, partition_concurrency=N) or "
                "partition_rate_limit=(N, seconds)"
            )

    @property
    def partitioned(self) -> bool:
        """Whether the queue limits each partition (its entries take a partition key)."""
        return self.partition_concurrency is not None or self.partition_rate_limit is not None

    def dequeue_params(
        self,
        *,
        schema: str,
        owner: str,
        lease_seconds: float,
        defs: list[WorkflowDef],
        limit: int,
        only: list[str] | None = None,
    ) -> dict[str, Any]:
        """The parameters of one dequeue of this queue by executor `owner`, which can run
        the workflows `defs`."""
        count, period = self.rate_limit if self.rate_limit is not None else (None, 0.0)
        key_count, key_period = (
            self.partition_rate_limit if self.partition_rate_limit is not None else (None, 0.0)
        )
        return {
            "queue_name": self.name,
            "lock_key": f"{schema}.queue:{self.name}",
            "limit": limit,
            "concurrency": self.concurrency,
            "worker_concurrency": self.worker_concurrency,
            "partition_concurrency": self.partition_concurrency,
            "partition_rate_count": key_count,
            "partition_rate_period": float(key_period),
            "rate_count": count,
            "rate_period": float(period),
            "by_priority": self.priority,
            "owner": owner,
            "lease_seconds": lease_seconds,
            "names": [d.name for d in defs],
            "versions": [d.version or "" for d in defs],
            "journal_version": labels.JOURNAL_VERSION,
            "workflow_ids": only,
        }
