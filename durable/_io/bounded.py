"""A bound on how long durable waits for the system database to answer: a hung server is
a dead one.

A server that is gone closes its connections, and the statements on them fail at once. A
server that hangs (a frozen host, a partition that drops packets, a Citus worker node
stopped in the middle of a statement the coordinator waits on) closes nothing: TCP holds
the connection open, the kernel acknowledges what is sent, and a statement on it waits
for ever. The claims, the heartbeat and each run's records would then wait with it, and a
heartbeat that waits renews nothing while its runs go on as if it had.

So each of durable's own statements waits `response_timeout` seconds at most for its
answer (default 5, `Engine(response_timeout=...)`, DURABLE_RESPONSE_TIMEOUT): past it the
connection is closed and the statement fails as an outage (OperationalError, no
SQLSTATE), which interrupts the run (not fails it) and is reported once by `Outage`. The
server's own `statement_timeout` cannot do this: a hung server, or a coordinator waiting on
a hung node, does not answer its own cancellation.

On a Citus schema a statement unanswered after half the bound starts a probe of the worker
nodes in the background (SystemDB.suspect, _io/hung.py) and waits on: a node that hangs is
marked by the time the statement is given up.

The bound is kept where a statement may take long by right: migrations, distributing the
schema, pruning and export/import run `unbounded()`. A step's @transaction runs on the
application's engine, not on these connections, and is never bounded here. New
connections are bounded by libpq's `connect_timeout` and TCP keepalives / user timeout
(unless the URL sets them).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
import time
from collections.abc import Iterator
from typing import Any, TypeVar

import psycopg
from psycopg.abc import PQGen

RV = TypeVar("RV")

DEFAULT_RESPONSE_TIMEOUT = 5.0

# Older psycopg (3.2) waits without a timeout: the bound then only covers new
# connections (connect_timeout, keepalives).
_CAN_BOUND = "timeout" in inspect.signature(psycopg.Connection.wait).parameters

# Set while a statement may rightly take long (see unbounded).
_UNBOUNDED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "durable_unbounded", default=False
)


@contextlib.contextmanager
def unbounded() -> Iterator[None]:
    """Durable's statements in this block (this thread or task) wait as long as they take:
    migrations, pruning, export and import."""
    token = _UNBOUNDED.set(True)
    try:
        yield
    finally:
        _UNBOUNDED.reset(token)


class NoAnswerError(psycopg.OperationalError):
    """The database did not answer a statement within the bound: an outage (no SQLSTATE).
    `sent_at`: when the wait began (time.monotonic())."""

    sent_at: float = 0.0


def _no_answer(seconds: float, sent_at: float) -> NoAnswerError:
    err = NoAnswerError(
        f"the database did not answer within {seconds:g} s (response_timeout): treated as "
        "unreachable; the connection is closed"
    )
    err.sent_at = sent_at
    return err


def _timed_out(exc: psycopg.OperationalError) -> bool:
    return type(exc).__name__ == "_WaitTimeout"


def _suspect_after(conn: Any, seconds: float) -> float | None:
    """On Citus, how long to wait before the worker nodes are probed (SystemDB.suspect)."""
    after: float | None = getattr(conn.source, "suspect_after", None)
    return after if after is not None and after < seconds else None


def _bound(conn: Any, timeout: float | None) -> float | None:
    if timeout is not None or not _CAN_BOUND or _UNBOUNDED.get():
        return None
    seconds: float | None = getattr(conn.source, "response_timeout", None)
    return seconds


class BoundedConnection(psycopg.Connection[Any]):
    """A connection of durable's pool: each wait for the server lasts `response_timeout`
    seconds at most, that of its `source` (its SystemDB, set by the pool's `configure`)."""

    source: Any = None
    # Set by the pool's `configure`: the statements prepared on it by durable's lean path
    # (see runio_base.LEAN), and its idle cursors (plain, dict rows), used again.
    prepared: set[bytes] | None = None
    cursors: list[psycopg.Cursor[Any]] | None = None
    dict_cursors: list[psycopg.Cursor[Any]] | None = None

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        seconds = _bound(self, timeout)
        if seconds is None:
            return super().wait(gen, interval, timeout)
        sent_at = time.monotonic()
        after = _suspect_after(self, seconds) if getattr(self.source, "distributed", True) else None
        if after is not None:
            # On Citus: past `after`, the nodes are probed while the statement waits on
            # (a generator that timed out resumes where it was: psycopg's own Ctrl-C
            # handling relies on it).
            try:
                return super().wait(gen, interval, after)
            except psycopg.OperationalError as exc:
                if not _timed_out(exc):
                    raise
            self.source.suspect()
        try:
            return super().wait(gen, interval, sent_at + seconds - time.monotonic())
        except psycopg.OperationalError as exc:
            if not _timed_out(exc):
                raise
            # Its protocol state is unknown (a statement half sent or half read).
            self.pgconn.finish()
            raise _no_answer(seconds, sent_at) from None


class AsyncBoundedConnection(psycopg.AsyncConnection[Any]):
    """BoundedConnection's twin, for the event loops' pools."""

    source: Any = None
    prepared: set[bytes] | None = None
    cursors: list[psycopg.AsyncCursor[Any]] | None = None
    dict_cursors: list[psycopg.AsyncCursor[Any]] | None = None

    async def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        seconds = _bound(self, timeout)
        if seconds is None:
            return await super().wait(gen, interval, timeout)
        sent_at = time.monotonic()
        after = _suspect_after(self, seconds)
        if after is not None:
            try:
                return await super().wait(gen, interval, after)
            except psycopg.OperationalError as exc:
                if not _timed_out(exc):
                    raise
            self.source.suspect()  # starts a thread: the loop does not wait for the probe
        try:
            return await super().wait(gen, interval, sent_at + seconds - time.monotonic())
        except psycopg.OperationalError as exc:
            if not _timed_out(exc):
                raise
            self.pgconn.finish()
            raise _no_answer(seconds, sent_at) from None


def connect_kwargs(url: str, response_timeout: float | None) -> dict[str, Any]:
    """libpq settings that bound a new connection to a server that does not answer
    (connect_timeout) and notice a peer gone silent (TCP keepalives, tcp_user_timeout),
    each unless the URL sets it."""
    if not response_timeout:
        return {}
    try:
        given = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return {}
    seconds = max(2, math.ceil(response_timeout))  # libpq's smallest connect_timeout
    wanted: dict[str, Any] = {
        "connect_timeout": seconds,
        "keepalives": 1,
        "keepalives_idle": seconds,
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": int(response_timeout * 1000),
    }
    return {k: v for k, v in wanted.items() if k not in given}
