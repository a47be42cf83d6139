# Generated from durable/_run/in_step_async.py by tools/async_to_sync.py: do not edit.
# Edit the source, then run `python tools/async_to_sync.py`
# (tests/unit/test_generated_sync.py fails while this file is out of date).
"""Statements a step's own code makes (a heartbeat's progress, a late charge, a send from
inside a step), driven on a connection of their own: the run's connection belongs to its
driver, which is in the middle of the step's call.

Written once, as async code; `_run/in_step.py` is generated from it by
`tools/async_to_sync.py`. The two sides differ only in whose pool lends the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from durable._core import Execute, Gen, Run

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")


def drive_in_step(run: Run, gen: Gen[T]) -> T:
    """Run a generator of statements (Execute only) that a step's code makes."""
    db = run.host.db
    checkout: Callable[[], AbstractContextManager[psycopg.Connection[Any]]]
    checkout = db.connection  # the engine's pool
    value: Any = None
    with checkout() as conn:
        while True:
            try:
                op = gen.send(value)
            except StopIteration as stop:
                result: T = stop.value
                return result
            if not isinstance(op, Execute):
                raise AssertionError(f"a step's code runs statements only, not {op!r}")
            value = db.run_on(conn, op.name, op.params, op.fetch)
