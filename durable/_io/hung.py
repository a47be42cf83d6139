"""Citus worker nodes that hang: found within `response_timeout` of the first statement
they leave unanswered, and left aside while they hang.

A node that hangs (a frozen host) closes nothing, so the coordinator waits on it for ever,
and so would durable's statements over every shard (claims, the heartbeat). The rule:

- a statement of durable's that has no answer after half its bound (`response_timeout` /
  2) starts one probe, in the background, while the statement waits on;
- the probe asks every worker node at once, through the coordinator, on a connection of
  its own (`citus_probe_nodes`: new connections to the nodes, each given 40% of
  `response_timeout` to connect and answer, the probe as a whole the other half of the
  bound);
- a node that gives no answer is marked as hanging, by the time the statement that
  started the probe is given up: at most `response_timeout` after it was sent. That
  statement then counts as the node's, not as an outage;
- while a node is marked, the statements that would wait for it are not sent (see
  SystemDB.claim_batch, on_held); it is asked again every `RECHECK` seconds, in the
  background, and unmarked once it answers.

If the coordinator itself does not answer the probe, nothing is marked: it is an outage.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

logger = logging.getLogger("durable.systemdb")

# How long a node found hanging is left alone before it is asked again.
RECHECK = 5.0

# The share of response_timeout a statement waits before the probe starts (the probe
# has the rest), and the share each node has to answer the coordinator in the probe.
SUSPECT_AFTER = 0.5
NODE_ANSWER = 0.4


class Prober(Protocol):
    """What HungNodes asks its SystemDB for."""

    response_timeout: float | None

    def probe_nodes(self, bound: float, node_answer: float) -> dict[int, tuple[str, bool]]: ...


class HungNodes:
    """The Citus worker nodes found hanging, for one SystemDB."""

    def __init__(self, db: Prober) -> None:
        self._db = db
        # Group id -> when to ask again.
        self.groups: dict[int, float] = {}
        # Workflows whose claim got no answer while a node hangs (see claim_batch).
        self.stuck: set[str] = set()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        # When the last probe ended (monotonic).
        self.probed_at = 0.0

    def suspect(self) -> None:
        """Start a probe in the background, unless one runs already."""
        with self._lock:
            if not self._idle.is_set():
                return
            self._idle.clear()
        try:
            threading.Thread(target=self._probe, name="durable-probe", daemon=True).start()
        except RuntimeError:  # interpreter shutting down
            self._idle.set()

    def find(self, since: float | None = None) -> bool:
        """Whether a node hangs, for a statement given up: the probe it started (or one
        started now) is waited for. `since`: a probe that ended after it is enough."""
        if since is None or self.probed_at < since:
            self.suspect()
        self._idle.wait((self._db.response_timeout or 10.0) + 1.0)
        return bool(self.groups)

    def any(self) -> bool:
        """Whether a node is marked; once its time is up it is asked again in the
        background (it stays marked meanwhile: nothing waits for the answer)."""
        if not self.groups:
            return False
        if time.monotonic() >= min(self.groups.values()):
            self.suspect()
        return bool(self.groups)

    def _probe(self) -> None:
        bound = self._db.response_timeout or 10.0
        began = time.monotonic()
        try:
            nodes = self._db.probe_nodes(bound * (1 - SUSPECT_AFTER), bound * NODE_ANSWER)
        except Exception:
            logger.debug("the probe of the Citus worker nodes got no answer", exc_info=True)
            nodes = None  # the coordinator: an outage, not a node
        try:
            if nodes is None:
                return
            now = time.monotonic()
            found = {group: now + RECHECK for group, (_, answers) in nodes.items() if not answers}
            if found.keys() != self.groups.keys():
                silent = [name for group, (name, _) in nodes.items() if group in found]
                logger.warning(
                    "Citus worker nodes that do not answer (probed in %.2f s): %s",
                    now - began,
                    ", ".join(silent) or "none (all answer again)",
                )
            self.groups = found
            if not found:
                self.stuck.clear()
        finally:
            self.probed_at = time.monotonic()
            self._idle.set()
