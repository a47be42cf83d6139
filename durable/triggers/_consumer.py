"""The consumer a worker runs: every registered trigger's source, read on one thread.

For each message, in this order and no other:

1. decode it and derive its key (a message that cannot be decoded, or has no key, is
   rejected: dead-lettered or dropped by its source, and logged);
2. commit the workflow's row, PENDING for any worker, under `trigger:<name>:<key>`
   (`submit`: an existing id is found, not recorded again);
3. acknowledge the message.

A crash before 2 leaves the message unacknowledged: the broker delivers it again and 2
records it then. A crash between 2 and 3 does the same, and 2 finds the row the first
delivery committed: no run is lost, none is recorded twice. The crash points
`trigger_before_commit` and `trigger_before_ack` (DURABLE_CRASH_POINTS) stop a process
exactly there for the crash tests. A start that fails for now (the database is away) is
handed back to the broker after a pause; one that can never succeed (its id is another
workflow's, its argument cannot be stored) is rejected like an undecodable message.

Sources are asyncio clients (aio-pika, nats-py): they run on an event loop of their own,
on the `durable-triggers` thread, and a start is a plain call on the engine's pool, made in
a worker thread of that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from durable._base.names import check_name
from durable.errors import MissingExtraError, StateError, UsageError
from durable.triggers._source import Delivery
from durable.triggers._trigger import Trigger

logger = logging.getLogger("durable.triggers")

Submit = Callable[[Trigger, Any, str], None]
"""Commit the row of `trigger`'s workflow called with the value, under the id (a Client's
submit: idempotent by id)."""


class Consumers:
    """The triggers of a registry, consumed until `stop` (or `close`)."""

    def __init__(
        self,
        triggers: list[Trigger],
        submit: Submit,
        *,
        crash_point: Callable[[str], None] = lambda _name: None,
        retry_delay: float = 1.0,
        max_backoff: float = 30.0,
    ) -> None:
        self.triggers = triggers
        self._submit = submit
        self._crash_point = crash_point
        self._retry_delay = retry_delay
        self._max_backoff = max_backoff
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()

    # -- life ---------------------------------------------------------------------------------

    def start(self, stop: threading.Event | None = None) -> None:
        """Consume on the `durable-triggers` thread until `stop` is set or `close()`."""
        self._thread = threading.Thread(
            target=asyncio.run, args=(self.run(stop),), name="durable-triggers", daemon=True
        )
        self._thread.start()
        self._started.wait(timeout=5)

    def close(self, timeout: float = 10.0) -> None:
        """Stop consuming: unsettled messages go back to their brokers."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just ended
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    async def run(self, stop: threading.Event | None = None) -> None:
        """Consume every trigger on this event loop until `stop` is set or `close()`."""
        self._loop = asyncio.get_running_loop()
        self._stopping = stopping = asyncio.Event()
        self._started.set()
        tasks = [asyncio.create_task(self._consume(t, stopping)) for t in self.triggers]
        try:
            while not stopping.is_set() and not (stop is not None and stop.is_set()):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), 0.1)
        finally:
            stopping.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _consume(self, trigger: Trigger, stopping: asyncio.Event) -> None:
        """One trigger's source, opened again after each loss (backing off)."""
        backoff = 0.5
        source = trigger.source
        while not stopping.is_set():
            try:
                await source.open()
                logger.info("trigger %s: consuming %s", trigger.name, source.describe)
                backoff = 0.5
                deliveries = source.deliveries()
                try:
                    async for delivery in deliveries:
                        await self.settle(trigger, delivery)
                finally:
                    # Closed here, before the source: not later by the loop's finalizer,
                    # on a connection already gone.
                    aclose = getattr(deliveries, "aclose", None)
                    if aclose is not None:
                        with contextlib.suppress(Exception):
                            await aclose()
            except MissingExtraError as exc:
                logger.error("trigger %s cannot consume: %s", trigger.name, exc)
                return
            except Exception as exc:
                logger.warning(
                    "trigger %s: %s failed (%s); connecting again in %.1fs",
                    trigger.name,
                    source.describe,
                    exc,
                    backoff,
                )
            finally:
                with contextlib.suppress(Exception):
                    await source.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), backoff)
            backoff = min(backoff * 2, self._max_backoff)

    # -- one message ----------------------------------------------------------------------------

    async def settle(self, trigger: Trigger, delivery: Delivery) -> None:
        """Record the message's workflow, then acknowledge it (see the module's docstring)."""
        message = delivery.message
        try:
            value = trigger.decode(message)
            key = trigger.key(message)
            if key is None:
                raise ValueError(f"it has no key (the trigger's key found none in {message.id!r})")
            check_name("message key", key)
        except Exception as exc:
            await self._reject(trigger, delivery, f"cannot be decoded: {exc}")
            return
        workflow_id = trigger.workflow_id(key)
        self._crash_point("trigger_before_commit")
        try:
            await asyncio.to_thread(self._submit, trigger, value, workflow_id)
        except (UsageError, StateError) as exc:
            # Retrying fails the same way: the id is another workflow's, the argument
            # cannot be stored, ...
            await self._reject(trigger, delivery, f"cannot start {workflow_id}: {exc}")
            return
        except Exception as exc:
            logger.warning(
                "trigger %s: could not record %s (%s); the message goes back to %s",
                trigger.name,
                workflow_id,
                exc,
                trigger.source.describe,
            )
            await asyncio.sleep(self._retry_delay)
            await delivery.retry(self._retry_delay)
            return
        self._crash_point("trigger_before_ack")
        await delivery.ack()

    async def _reject(self, trigger: Trigger, delivery: Delivery, reason: str) -> None:
        logger.error(
            "trigger %s: message %r from %s rejected: %s",
            trigger.name,
            delivery.message.id,
            trigger.source.describe,
            reason,
        )
        await delivery.reject(reason)
