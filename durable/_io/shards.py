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

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

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
