"""Durable streams: ordered values a workflow writes under a key, for readers that follow
them live (a model's tokens, an agent's progress) across crashes of the writer.

A write is a journaled call of the workflow: the value, its offset (0, 1, 2, ... per key)
and the journal row are one fenced statement, and a replay writes nothing again, so a
reader sees each value once. `close_stream(key)` ends the stream. Readers
(`client.read_stream` / `read_stream_async`) read from an offset on, in order, and wait
for more with LISTEN (the write's statement sends the NOTIFY), polling as a fallback;
they stop at the close, or when the workflow has finished and nothing more is there.
The decision is in `_core.write_stream`; these are the public functions.

This module is the source of the awaited forms, for async workflows; `_run/streams.py`, the
plain ones, is generated from it by tools/async_to_sync.py.
"""

from __future__ import annotations

from typing import Any

from durable import _core as protocol
from durable._base.names import check_name
from durable._run.acompat import workflow_run_async
from durable._run.driver_async import drive_async


async def write_stream_async(key: str, value: Any) -> int:
    """Append `value` to the workflow's stream `key`; returns its offset. Call it from the
    workflow function (a step returns what to write); `await` it as write_stream_async in
    an async workflow. StreamClosedError after the close."""
    check_name("key", key)
    run = workflow_run_async("durable.write_stream()")
    offset = await drive_async(run, protocol.write_stream(run, key, value))
    assert offset is not None
    return offset


async def close_stream_async(key: str) -> None:
    """End stream `key`: readers stop after its last value (close_stream_async, awaited,
    in an async workflow)."""
    check_name("key", key)
    run = workflow_run_async("durable.close_stream()")
    await drive_async(run, protocol.write_stream(run, key, None, closing=True))
