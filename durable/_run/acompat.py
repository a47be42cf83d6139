"""The calls that differ between durable's async sources and their generated sync twins
(tools/async_to_sync.py) by a name alone.

A hand-written async module calls the `_async` names (or `AsyncEvent`); its generated sync
twin calls the names without the suffix, which do the same on the caller's thread. Keep
each pair's meaning the same: the generator maps names, it does not check behaviour.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from durable._run.context import workflow_run

if TYPE_CHECKING:
    from durable._core import Run

__all__ = ["workflow_run"]  # the sync twin of workflow_run_async, where sources find it

P = ParamSpec("P")
R = TypeVar("R")

AsyncEvent = asyncio.Event
Event = threading.Event
# What waits for a run started in the background: a future of the event loop (a task, or a
# thread's future wrapped for the loop), or a thread's future.
AsyncFuture = asyncio.Future
Future = concurrent.futures.Future
# What a task ends with when its event loop cancels it: the same class on both sides, so
# that what a run's end means (_host_async.outcome_of) is the same on both.
CancelledError = asyncio.CancelledError

# A callable's type: `AsyncCall[[int], str]` returns an awaitable of str, `Call[[int], str]`
# a str.
AsyncCall = Callable[P, Awaitable[R]]
Call = Callable[P, R]


async def to_thread_async(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Blocking work off the event loop, on a thread of asyncio's default executor."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def to_thread(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """The sync side is already on a thread of its own: the call, here."""
    return fn(*args, **kwargs)


async def sleep_async(seconds: float) -> None:
    """Wait without blocking the event loop."""
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    """Wait on this thread."""
    time.sleep(seconds)


def called_async(what: str) -> str:
    """How messages name the call `what` ("durable.recv()") on the async side: its awaited
    twin ("durable.recv_async()")."""
    return what.replace("()", "_async()")


def called(what: str) -> str:
    """How messages name the call `what` on the sync side: as it is."""
    return what


def monotonic() -> float:
    """The same clock on both sides, for deadlines."""
    return time.monotonic()


def waitable_async(future: concurrent.futures.Future[R]) -> asyncio.Future[R]:
    """A thread's future, awaitable on the running event loop."""
    return asyncio.wrap_future(future)


def waitable(future: concurrent.futures.Future[R]) -> concurrent.futures.Future[R]:
    """The sync side waits on a thread's future as it is."""
    return future


async def wait_async(future: asyncio.Future[object], timeout: float | None) -> bool:
    """Whether `future` ended within `timeout` seconds (None: no limit), without raising
    what it raised."""
    done, _ = await asyncio.wait([future], timeout=timeout)
    return bool(done)


def wait(future: concurrent.futures.Future[object], timeout: float | None) -> bool:
    """wait_async, blocking this thread."""
    done, _ = concurrent.futures.wait([future], timeout=timeout)
    return bool(done)


def workflow_run_async(what: str) -> Run:
    """The run of the calling async workflow for the awaited twin of `what` (named as the
    sync call, "durable.sleep()"), or the error naming the call to make instead: what an
    async source calls where its generated sync twin calls `workflow_run(what)`."""
    return workflow_run(what.replace("()", "_async()"), is_async=True)
