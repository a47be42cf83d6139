"""Which shards of `workflows` a claim round reads next, on a Citus cluster.

A claim over the whole distributed table reads every shard: its cost grows with the shard
count, and every worker process reads (and races for) the same rows. Instead each round
reads a few shard groups, one statement each (runnable_on_shard, enqueued_on_shard: see
migration 0040), and the next round the next few, around the ring of shards. Each
process starts at a random place on the ring, so that processes read different shards at
a time and seldom race for the same rows; every shard is read by every process in turn,
so no work is left behind. The ring (a workflow id that lives in each shard, and the node
group that holds it) is read from Citus's metadata, again every `REFRESH` seconds, so
that a shard moved or split is followed.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from durable._io.hung import HungNodes
from durable._io.runio_base import node_down
from durable.errors import DatabaseUnavailableError

Row = dict[str, Any]


class _Clock(Protocol):
    def now(self) -> dt.datetime: ...


class SystemDB(Protocol):
    """What the rounds need of the system database (durable._io.systemdb.SystemDB)."""

    shards: ShardRing
    hung: HungNodes

    @property
    def fake_clock(self) -> _Clock | None: ...

    def nodes_hung(self) -> bool: ...

    def fetch_all(self, name: str, params: dict[str, Any]) -> list[Row]: ...

    def execute(self, name: str, params: dict[str, Any]) -> int: ...


# Shard groups one round reads at most (fewer when the first ones fill it): an idle
# worker's poll costs this many single-shard reads, whatever the shard count.
PER_ROUND = 4
REFRESH = 60.0  # seconds between reads of the shard map


class ShardRing:
    """The shard groups of `workflows` in hash order, and where this process is on them."""

    def __init__(self, load: Callable[[], Sequence[dict[str, Any]]]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._keys: list[tuple[str, int]] = []  # (a workflow id of the shard, its node group)
        # Where each kind of round is on the ring (claims, each queue's dequeues): one
        # cursor each, so that no kind keeps to some shards and leaves the others.
        self._at: dict[str, int] = {}
        self._loaded = -REFRESH

    def take(self, kind: str, n: int = PER_ROUND, skip: Sequence[int] = ()) -> Iterator[str]:
        """The keys of the next shard groups for a round of `kind`, `n` at most (each
        once at most), but for those held by the node groups in `skip` (a node found
        hanging: their work waits). The ring moves on by each key taken, so the shards a
        round did not need are the next round's."""
        now = time.monotonic()
        if now - self._loaded >= REFRESH:
            rows = self._load()
            with self._lock:
                self._keys = [(str(r["shard_key"]), int(r["groupid"])) for r in rows]
                self._loaded = now
        keys = self._keys
        for _ in range(min(n, len(keys))):
            with self._lock:
                at = self._at.setdefault(kind, random.randrange(len(keys)))
                key, group = keys[at % len(keys)]
                self._at[kind] = at + 1
            if group not in skip:
                yield key


def on_shards(db: SystemDB, name: str, params: dict[str, Any], limit: int) -> Iterator[list[Row]]:
    """`name` (runnable_on_shard, enqueued_on_shard) on the next shards of the ring, one
    statement each, each routed to the node that holds its shard: what each found, until
    the caller has enough (it stops iterating). A shard whose node is down, or hangs, is
    passed over: its work waits for it, the rest goes on."""
    skip = list(db.hung.groups) if db.nodes_hung() else []
    kind = f"{name}:{params.get('queue_name')}:{params.get('names')}"
    for key in db.shards.take(kind, skip=skip):
        # The time a read on a worker node goes by: the fake clock's, or None (the node's).
        at_time = None if db.fake_clock is None else db.fake_clock.now()
        try:
            yield db.fetch_all(
                name, {**params, "shard_key": key, "at_time": at_time, "limit": limit}
            )
        except DatabaseUnavailableError as exc:
            if not (node_down(exc) or getattr(exc, "node_hung", False)):
                raise


def claim_on_shards(db: SystemDB, params: dict[str, Any]) -> list[Row]:
    """claim_batch_cas, one shard at a time: each shard's sleepers that are due are woken
    and its runnable workflows read (one statement, on the shard's node), then claimed by
    their ids (compare-and-set, routed to that shard), until `limit` are claimed or a
    round's shards are read."""
    limit = int(params["limit"])
    rows: list[Row] = []
    for found in on_shards(db, "runnable_on_shard", params, limit):
        due = [r["workflow_id"] for r in found if r["due"]]
        if due:
            db.execute("wake_due", {"workflow_ids": due})
        if found:
            ids = [r["workflow_id"] for r in found]
            more = {**params, "workflow_ids": ids, "limit": limit - len(rows)}
            rows += db.fetch_all("claim_batch_cas", more)
        if len(rows) >= limit:
            break
    return rows


def enqueued_on_shards(db: SystemDB, params: dict[str, Any]) -> list[str]:
    """The ids of a queue's ready entries in the next shards of the ring, up to `limit`."""
    limit = int(params["limit"])
    ids: list[str] = []
    for found in on_shards(db, "enqueued_on_shard", params, limit):
        ids += [r["workflow_id"] for r in found]
        if len(ids) >= limit:
            break
    return ids
