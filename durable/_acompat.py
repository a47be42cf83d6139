"""The calls that differ between durable's async sources and their generated sync twins
(tools/async_to_sync.py) by a name alone.

A hand-written async module calls the `_async` names (or `AsyncEvent`); its generated sync
twin calls the names without the suffix, which do the same on the caller's thread. Keep
each pair's meaning the same: the generator maps names, it does not check behaviour.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

AsyncEvent = asyncio.Event
Event = threading.Event

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
