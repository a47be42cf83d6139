"""Runs this process holds: a claim it may execute (`Claimed`), and a run it started, as
its handle sees it (`LocalRun`), run by whoever gets to it first.

`engine.start(wf).result()` used to cost two hand-offs between threads on top of the
workflow's two commits: the caller queued the run for a thread of the engine and slept,
and that thread woke the caller when the run ended; then `result()` read the outcome back
from the database. A `LocalRun` is the run's future and its body at once. A thread of the
engine runs it when it gets to it; a caller that waits for it with no time limit before
then runs it itself, on its own thread (no hand-off, no wake-up), and whoever ran it leaves
the stored text of a SUCCESS output on it, which the handle decodes instead of reading it.

The stored outcome stays the truth for every other process, and for this one when the run
ended any other way (a failure, a cancel, a lost claim): then the handle reads it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from durable._base.registry import WorkflowDef
    from durable._core import Journal


class Claimed(NamedTuple):
    """A run this executor may execute."""

    defn: WorkflowDef
    workflow_id: str
    epoch: int
    args: list[Any]
    kwargs: dict[str, Any]
    journal: Journal
    deadline: dt.datetime | None
    cancel_reason: str | None
    budget_id: str | None = None
    first_run: bool = False
    trace_context: str | None = None
    # The doubts on this process's claims (Outage.doubts) and the time (monotonic) just
    # before the claim was made: its run proves the claim again before its code runs when
    # its lease may have lapsed since (see _core.reclaim). -1 and 0: now.
    doubts: int = -1
    claimed_at: float = 0.0
    parent_id: str | None = None
    # An operator asked to pause the workflow while a run whose lease then lapsed held it:
    # this run stops at its first new step boundary (see Ownership.ask_pause).
    pause_requested: bool = False


def inline(created: Claimed | None) -> Claimed | None:
    """A workflow created to run inline (a direct call, a child called as a function):
    its caller waits for it RUNNING, so its finish has no parked parent to wake (it saves
    that statement; a later run of it, claimed after a suspension, still sends it)."""
    return None if created is None else created._replace(parent_id=None)


class LocalRun(concurrent.futures.Future[Any]):
    """The future of a run this process started; its result is the stored text of the
    run's output if it ended SUCCESS here, else None (see lifecycle.WaitLocal)."""

    def __init__(self, body: Callable[[], str | None], room: Callable[[], bool]) -> None:
        super().__init__()
        self._body: Callable[[], str | None] | None = body
        self._room = room
        self._taken = threading.Lock()  # held for good by whoever runs the body

    def run(self) -> None:
        """Run the body unless someone already did (or is): a thread of the engine's pool.
        What the body raises is kept on the future, never raised out of the pool."""
        self._run(on_caller=False)

    def run_on_caller(self) -> None:
        """The waiting caller runs the body itself if no thread has begun it and `room()`
        says the engine's runs would not then exceed its threads (a caller runs it instead
        of a thread, never beside all of them: many callers waiting at once must not hold
        more connections than the engine's workers would). A Ctrl-C in the workflow's code
        (KeyboardInterrupt) is the caller's: it is raised on."""
        if self._room():
            self._run(on_caller=True)

    def _run(self, on_caller: bool) -> None:
        if not self._taken.acquire(blocking=False):
            return
        try:
            body, self._body = self._body, None
            if body is None or not self.set_running_or_notify_cancel():
                return  # cancelled before it began (the engine shut down first)
            output = body()
        except BaseException as exc:
            if not self.done():  # (a Ctrl-C before the body began still ends the future)
                self.set_exception(exc)
            if on_caller and isinstance(exc, KeyboardInterrupt):
                raise
        else:
            self.set_result(output)


def ended(future: concurrent.futures.Future[Any] | asyncio.Future[Any]) -> str | None:
    """The stored output text a finished local run left (a LocalRun, or the task or
    wrapped future of an async start), or None: it ended otherwise, or was cancelled
    before it began."""
    if future.cancelled() or future.exception() is not None:
        return None
    output = future.result()
    return output if isinstance(output, str) else None
