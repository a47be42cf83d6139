"""One LISTEN connection per client, shared by everything in it that waits to be woken.

Stream readers, watchers and the worker loop wait for notifications (a stream value was
written; there is work, a decision, a message). A connection each would make 120 readers
in one process hold 120 connections, and past the server's limit fail with `too many
clients`. A Listener holds one connection, LISTENing on the client's channels, read by one
thread ("durable-listen"), and hands each notification to the subscriptions it concerns (a
stream reader hears only of its own workflow): sync waiters through a threading.Event,
async ones through their event loop, so an async reader holds no thread while it waits.

One per client (a Client or an Engine, i.e. per SystemDB), not one per database URL for
the whole process: the connection belongs with the pool it sits beside. It has the same URL
and credentials, the same `listen` setting, the same outage tracker, and the same lifetime:
closing the client closes it, and no process-wide state outlives a client or ties separate
clients together (tests and multi-tenant apps open and close them by the dozen, with other
roles and settings). A process normally has one engine; a second client to the same
database costs one more connection, not one per reader.

A notification only shortens a wait: every subscriber looks again at its own interval
anyway. So when no connection can be had (the server's connection limit, an outage,
DURABLE_LISTEN=0) the subscribers poll and lose nothing. The thread reconnects with
backoff, and each time it (re)connects it wakes every subscriber, since whatever was
written while it was down notified nobody here. Nobody subscribed, it holds no connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from durable._io.systemdb import is_outage

if TYPE_CHECKING:
    from durable._io.systemdb import SystemDB

logger = logging.getLogger("durable.listen")

# Seconds the thread blocks on the connection between looks at who is subscribed.
_SLICE = 0.2
_BACKOFF_MAX = 10.0
# How long a new subscriber waits for the first connection attempt (its connect_timeout is
# 10 s) before it goes on, polling.
_SETTLE_WAIT = 15.0


class Subscription:
    """One waiter's share of a Listener: woken by a notification on its channel (with its
    key as the payload, or any payload when key is None), by the listener (re)connecting,
    or by the listener closing. `close()` when done (read_stream does, in a finally)."""

    def __init__(
        self,
        listener: Listener,
        channel: str,
        key: str | None,
        wake: Callable[[], None] | None,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self.channel = channel
        self.key = key
        self._listener = listener
        self._wake = wake
        self._loop = loop
        self._event = threading.Event()
        self._async_event = asyncio.Event() if loop is not None else None
        self._payloads: collections.deque[str] = collections.deque(maxlen=1000)
        self._lock = threading.Lock()

    def notify(self, payload: str | None) -> None:
        """Wake the waiter (from the listener's thread); `payload` is kept for wait()."""
        if payload is not None:
            with self._lock:
                self._payloads.append(payload)
        self._event.set()
        if self._loop is not None and self._async_event is not None:
            try:
                self._loop.call_soon_threadsafe(self._async_event.set)
            except RuntimeError:
                pass  # its event loop is closed: nobody is waiting there any more
        if self._wake is not None:
            self._wake()

    def _take(self) -> list[str]:
        with self._lock:
            payloads = list(self._payloads)
            self._payloads.clear()
        return payloads

    def wait(self, timeout: float) -> list[str]:
        """Block until woken or `timeout` seconds passed; the payloads notified since the
        last wait ([] when none came). Cleared before returning, so a notification that
        lands during the caller's next look wakes its next wait at once."""
        self._event.wait(timeout)
        self._event.clear()
        return self._take()

    def woken(self, timeout: float) -> bool:
        """wait(), for a watcher that looks again whatever came: whether a notification
        came, with a payload or without (the listener wakes everyone with none after it
        reconnects, so that they look again at what was written meanwhile)."""
        woken = self._event.wait(timeout)
        self._event.clear()
        return bool(self._take()) or woken

    async def wait_async(self, timeout: float) -> list[str]:
        """wait(), awaited on the event loop the subscription was made on."""
        assert self._async_event is not None, "subscribe with subscribe_async()"
        try:
            await asyncio.wait_for(self._async_event.wait(), timeout)
        except TimeoutError:
            pass
        self._async_event.clear()
        return self._take()

    def close(self) -> None:
        self._listener.remove(self)


class Listener:
    """A client's one LISTEN connection and the thread that fans its notifications out
    (see the module docstring)."""

    def __init__(self, db: SystemDB, channels: Sequence[str]) -> None:
        self.db = db
        self._channels = tuple(channels)
        self._cond = threading.Condition()
        self._subs: dict[tuple[str, str | None], set[Subscription]] = {}
        self._count = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        # Whether the thread has tried to get a connection since subscribers came (a new
        # subscriber waits for that much, no more).
        self._settled = not db.listen

    @property
    def subscribers(self) -> int:
        return self._count

    def subscribe(
        self,
        channel: str,
        key: str | None = None,
        *,
        wake: Callable[[], None] | None = None,
        settle: bool = True,
    ) -> Subscription:
        """A subscription to `channel` (notifications whose payload is `key`, or all). With
        `settle`, returns once the listener has a connection or has failed to get one, so
        that a look made after this call misses no notification while it listens. `wake`
        is called (on the listener's thread) whenever the subscription is woken."""
        sub = Subscription(self, channel, key, wake, None)
        self._add(sub)
        if settle:
            with self._cond:
                self._cond.wait_for(lambda: self._settled or self._closed, _SETTLE_WAIT)
        return sub

    async def subscribe_async(self, channel: str, key: str | None = None) -> Subscription:
        """subscribe(), awaited: the subscription's waits are awaited on this event loop."""
        sub = Subscription(self, channel, key, None, asyncio.get_running_loop())
        self._add(sub)
        if not (self._settled or self._closed):
            await sub.wait_async(_SETTLE_WAIT)  # settling wakes every subscriber
        return sub

    def _add(self, sub: Subscription) -> None:
        with self._cond:
            self._subs.setdefault((sub.channel, sub.key), set()).add(sub)
            self._count += 1
            if self._closed:
                self._settled = True
                return
            if self.db.listen and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(
                    target=self._run, name="durable-listen", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def remove(self, sub: Subscription) -> None:
        with self._cond:
            subs = self._subs.get((sub.channel, sub.key))
            if subs is None or sub not in subs:
                return
            subs.discard(sub)
            if not subs:
                del self._subs[(sub.channel, sub.key)]
            self._count -= 1

    def close(self) -> None:
        """Stop the thread and drop the connection; whoever still waits is woken (its next
        look finds the client closed)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        self._wake_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)  # it sees `closed` within a slice, or once connect gives up

    # -- the thread ----------------------------------------------------------------------------

    def _everyone(self) -> list[Subscription]:
        with self._cond:
            return [sub for subs in self._subs.values() for sub in subs]

    def _wake_all(self) -> None:
        for sub in self._everyone():
            sub.notify(None)

    def _deliver(self, channel: str, payload: str) -> None:
        with self._cond:
            subs = [*self._subs.get((channel, payload), ()), *self._subs.get((channel, None), ())]
        for sub in subs:
            sub.notify(payload)

    def _settle(self, listening: bool) -> None:
        """The thread got a connection, or failed to. Either way those waiting to subscribe
        go on. On a connection every subscriber looks once more, since what was written
        before it notified nobody here; on a failure the others just go on polling."""
        with self._cond:
            waited = not self._settled
            self._settled = True
            self._cond.notify_all()
        if listening or waited:
            self._wake_all()

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        backoff = 0.0
        failing = False  # since the last good connection (reported once)
        try:
            while True:
                with self._cond:
                    if self._closed:
                        return
                    if not self._count:
                        # Nobody is waiting: hold no connection until somebody does.
                        if conn is not None:
                            _close(conn)
                            conn = None
                        self._settled = False
                        self._cond.wait()
                        continue
                try:
                    if conn is None:
                        conn = self.db.listen_connection(*self._channels)
                        if conn is None:  # notifications were turned off
                            self._settle(False)
                            return
                        if failing:
                            logger.info("LISTEN connection restored")
                        failing, backoff = False, 0.0
                        self._settle(True)
                    for notify in conn.notifies(timeout=_SLICE):
                        self._deliver(notify.channel, notify.payload)
                except (psycopg.Error, OSError) as exc:
                    if not failing:
                        self._report(exc, conn)
                    failing = True
                    if conn is not None:
                        _close(conn)
                        conn = None
                    self._settle(False)  # until it is back, whoever waits polls
                    backoff = min(_BACKOFF_MAX, max(0.2, backoff * 2))
                    with self._cond:
                        self._cond.wait_for(lambda: self._closed, backoff)
        except Exception:
            logger.exception("the LISTEN thread failed: waiting readers poll")
        finally:
            if conn is not None:
                _close(conn)
            with self._cond:
                self._settled = True
                self._cond.notify_all()
            self._wake_all()

    def _report(self, exc: BaseException, conn: psycopg.Connection[Any] | None) -> None:
        """Say once why there is no LISTEN connection. A connection lost may be an outage
        (said once, by the SystemDB's Outage). One refused is not one by itself: past the
        server's connection limit the pool's connections still work (and libpq gives no
        SQLSTATE to tell that apart), so it is said as what it costs: waits poll."""
        if conn is None:
            if self.db.outage.down_since is not None:
                logger.debug("no LISTEN connection during the outage: %s", exc)
                return
            logger.warning(
                "no LISTEN connection to the system database (%s): stream readers, "
                "watchers and the worker poll until one can be had",
                _reason(exc),
            )
        elif is_outage(exc):
            logger.debug("LISTEN connection lost, reconnecting: %s", exc)
            self.db.outage.lost(exc, "LISTEN", conn)
        else:
            logger.warning("LISTEN connection failed, reconnecting: %s", exc)


def _close(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.close()
    except (psycopg.Error, OSError):
        pass


def _reason(exc: BaseException) -> str:
    """The server's words (libpq puts them last, after where it connected)."""
    text = str(exc).strip()
    return text.splitlines()[-1].strip() if text else type(exc).__name__
