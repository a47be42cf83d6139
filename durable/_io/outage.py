"""Outage bookkeeping: what this process knows of its system database's availability.

An outage reaches every part of a worker at once; `Outage` says it in one log line when
the database is lost and in one when it is back, counts the runs it interrupted, tells a
failover, and counts the moments at which this process's leases may have lapsed
(`Outage.doubts`: a run claimed before the latest one proves its claim again before its
code runs). While an outage is under way, psycopg_pool's warning per failed reconnect
attempt is dropped.

It holds no connection and runs no statement: the SystemDB (and the LISTEN connection)
tell it of each new connection and each lost one, the heartbeat of each renewal.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

import psycopg

from durable._base.urls import redact

# The SystemDB's logger: the outage lines are its, under the name operators filter on.
logger = logging.getLogger("durable.systemdb")


class Outage:
    """Says in one log line that the system database was lost, and in one that it is back.

    An outage reaches every part of a worker at once (each running workflow, the claim
    loop, the LISTEN connection, the async writer, the pool's reconnect attempts); a line
    from each would bury what happened. The first lost connection reports the outage and
    where the server was; the first good checkout afterwards reports how long it took, how
    many runs it interrupted and whether another server answered (a failover).

    A failover is rarely one clean cut: under pg_auto_failover, for one, the promoted
    server's postmaster goes down once more moments after it first accepts writes,
    closing the connections made in between.
    Connections lost within `SETTLE_SECONDS` of the database coming back are that same
    event: said at INFO, not as a new outage.
    """

    SETTLE_SECONDS = 10.0

    def __init__(self, url: str) -> None:
        self._lock = threading.Lock()
        self._url = url
        self.down_since: float | None = None
        self.server: str | None = None  # host:port of the last server that answered
        self.interrupted = 0
        # Outages survived so far, and for each live connection how many there had been
        # when it was made: one made before the last outage ended and failing only now
        # (an idle run's connection to the old primary) is that outage, not a new one.
        self.generation = 0
        self._born: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
        self.ended_at: float | None = None  # when the last outage ended (monotonic)
        # Leases: when the heartbeat last renewed every held one (monotonic, taken before
        # the renewal was sent), and how many gaps of half a lease it left between two
        # renewals (see doubts).
        self.renewed_at = 0.0
        self.gaps = 0
        # How many times this process's leases may have lapsed: outages that ended, and
        # gaps in the heartbeat's renewals (generation + gaps, kept as one number since
        # every call of a run's code reads it). A run claimed before the latest one
        # proves its claim again before its code runs (_core.reclaim).
        self.doubts = 0
        self._aftershock = False  # the outage under way began just after one ended

    def lost(self, exc: BaseException, during: str = "", conn: object = None) -> bool:
        """Report an outage; True if this is its first report."""
        with self._lock:
            if self.down_since is not None:
                return False
            if conn is not None and self._born.get(conn, self.generation) < self.generation:
                return False  # a connection from before the last outage (see __init__)
            self.down_since = now = time.monotonic()
            ended = self.ended_at
            self._aftershock = ended is not None and now - ended < self.SETTLE_SECONDS
            self.interrupted = 0
            _QUIET_POOLS.add(id(self))
        reason = _first_line(exc)
        if self._aftershock and ended is not None:
            logger.info(
                "the system database at %s closed connections again %.1f s after it came "
                "back (%s%s); reconnecting",
                self.server or redact(self._url),
                now - ended,
                reason,
                f", in {during}" if during else "",
            )
            return True
        logger.warning(
            "lost the system database at %s (%s%s): runs in flight are interrupted, not "
            "failed, and resume when it is back; reconnecting to %s",
            self.server or redact(self._url),
            reason,
            f", in {during}" if during else "",
            _hosts(self._url),
        )
        return True

    def renewed(self, sent: float, lease_seconds: float) -> None:
        """The heartbeat renewed every held lease, sending the renewal at `sent`."""
        with self._lock:
            if self.renewed_at and sent - self.renewed_at >= lease_seconds / 2:
                self.gaps += 1  # a lease may have run out, untaken or taken, meanwhile
                self.doubts += 1
            self.renewed_at = sent

    def note_interrupted(self) -> None:
        with self._lock:
            self.interrupted += 1

    def seen(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
        """A new connection works: remember its server; end an outage if there was one."""
        server = f"{conn.info.host}:{conn.info.port}"
        with self._lock:
            since, before = self.down_since, self.server
            if since is not None:
                self.generation += 1
                self.doubts += 1
            self._born[conn] = self.generation
            self.down_since, self.server = None, server
            interrupted = self.interrupted
            aftershock, self._aftershock = self._aftershock, False
            if since is not None:
                self.ended_at = time.monotonic()
            _QUIET_POOLS.discard(id(self))
        if since is None:
            return
        if aftershock:
            logger.info(
                "the system database is back again after %.1f s at %s",
                time.monotonic() - since,
                server,
            )
            return
        moved = f" (was {before}: a failover)" if before and before != server else ""
        logger.warning(
            "the system database is back after %.1f s at %s%s; %d interrupted runs resume",
            time.monotonic() - since,
            server,
            moved,
            interrupted,
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _hosts(url: str) -> str:
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable url>"
    hosts = str(info.get("host") or "localhost").split(",")
    ports = str(info.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return ", ".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=False))


# Outages under way in this process (ids of Outage objects). While one is, psycopg_pool's
# warning per failed reconnect attempt and per discarded connection says nothing the
# outage line did not: they are dropped (at DEBUG they still show).
_QUIET_POOLS: set[int] = set()
_POOL_NOISE = ("error connecting in %r: %s", "discarding closed connection: %s")


def _quiet_pool(record: logging.LogRecord) -> bool:
    return not (_QUIET_POOLS and record.levelno < logging.ERROR and record.msg in _POOL_NOISE)


logging.getLogger("psycopg.pool").addFilter(_quiet_pool)
