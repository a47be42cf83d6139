"""A workflow's life around its run, decided once: create or attach, run, wait while it is
suspended, claim it again, read how it ended.

`_core` decides what happens inside a run; this module decides what happens around
one: starting a workflow here (`start`), running one to its end in the caller (`run_here`,
for a workflow called as a function or a child run inline) and waiting for its result
(`result`, for the handles). Each is a generator of the operations below, performed by
one host for every caller (`_host_async.AsyncLifeHost`, awaited, and `_host_sync.LifeHost`
generated from it, each with its `drive`). Before, each of these was written twice, once
per caller, and the copies drifted.

Nothing here touches a connection, a thread or an event loop; tests/unit drives the
generators with plain functions.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from durable.errors import ResultTimeoutError, WorkflowPaused, WorkflowSuspended

if TYPE_CHECKING:
    from durable._base.registry import WorkflowDef

T = TypeVar("T")

# How often a caller waiting on a workflow looks at it: from POLL_MIN, doubling to POLL_MAX
# (a workflow that wakes is resumed by whoever claims it first; the waiting caller is one of
# them, so a long wait costs few statements).
POLL_MIN = 0.005
POLL_MAX = 0.25


@dataclass(frozen=True)
class Create:
    """Create the workflow, claimed by this executor, ready to run. Answer: the claim,
    with its arguments as a replay will decode them, or None if the id exists."""

    defn: WorkflowDef
    workflow_id: str
    inputs: str
    parent: tuple[str, int] | None
    # start_or_send: send_message's parameters of a message delivered in the creation's
    # transaction (to the workflow that has the id, if it exists).
    message: dict[str, Any] | None = None


@dataclass(frozen=True)
class Attach:
    """The id exists: check that it is this workflow (WorkflowConflictError if another
    function, or the same method on another instance, holds it). Answer: its WorkflowInfo.
    `inputs`: the call's stored inputs (they name a method's instance)."""

    defn: WorkflowDef
    workflow_id: str
    inputs: str | None = None


@dataclass(frozen=True)
class RunClaimed:
    """Run a claimed workflow in the caller until it ends (its value) or suspends
    (WorkflowSuspended is thrown back). `created`: it was created by the Create just
    answered (the sync host runs it on the connection that created it)."""

    claimed: Any  # _runner.Claimed
    created: bool = False


@dataclass(frozen=True)
class Reclaim:
    """Claim the workflow if it is runnable and nobody holds it. Answer: the claim, or
    None."""

    workflow_id: str


@dataclass(frozen=True)
class Finished:
    """One look at the workflow. Answer: (True, its value) if it has ended (what it ended
    with is raised instead, if it failed or was cancelled), else (False, None)."""

    workflow_id: str


@dataclass(frozen=True)
class Sleep:
    """Wait `seconds` without holding anything."""

    seconds: float


@dataclass(frozen=True)
class Remember:
    """This process started the workflow (or attached to it) and waits for it: resume it
    here when it wakes, even where no worker runs (see _recovery.keep)."""

    defn: WorkflowDef
    workflow_id: str


@dataclass(frozen=True)
class Forget:
    """The workflow needs nothing more from this process (it had already ended)."""

    workflow_id: str


@dataclass(frozen=True)
class Launch:
    """Run a claimed workflow in the background (a thread of the engine, or a task of the
    caller's event loop). Answer: what the handle waits on (a future, or None)."""

    claimed: Any  # _runner.Claimed


@dataclass(frozen=True)
class LaunchClaim:
    """Claim the existing workflow and run it in the background if it is runnable and
    nobody holds it. Answer: what the handle waits on, or None."""

    workflow_id: str


@dataclass(frozen=True)
class WaitLocal:
    """Wait for the run this process started, up to `timeout` seconds (None: no limit;
    then the host may run it on the waiting thread if no thread of its own has begun it,
    which saves two hand-offs between threads), without raising what it raised. Answer:
    None if it is still running; (True, its value) if it ended SUCCESS here, the value
    decoded from the stored output its run committed (as a read would find it, so the
    database need not be asked); (False, None) if it ended otherwise (the database says
    how)."""

    workflow_id: str
    timeout: float | None


@dataclass(frozen=True)
class Now:
    """The host's monotonic clock, in seconds (the core owns no clock): for deadlines."""


@dataclass(frozen=True)
class ReadEvent:
    """One look at the latest value a workflow published under `key`. Answer: (True, the
    value) if there is one, else (False, None)."""

    workflow_id: str
    key: str


Op = (
    Create
    | Attach
    | RunClaimed
    | Reclaim
    | Finished
    | Sleep
    | Remember
    | Forget
    | Launch
    | LaunchClaim
    | WaitLocal
    | ReadEvent
    | Now
)
Life = Generator[Op, Any, T]


def run_here(
    defn: WorkflowDef, workflow_id: str, inputs: str, parent: tuple[str, int] | None
) -> Life[Any]:
    """Run (or resume, or wait for) a workflow in the caller and return its value.

    A new workflow runs at once; an existing one is attached to. While it is suspended
    (sleeping, waiting for a message or an approval) or paused by an operator, the caller
    holds nothing and looks again, backing off; once it is runnable the caller claims it
    and runs it on (unless a worker got there first, whose run it then waits for)."""
    created = yield Create(defn, workflow_id, inputs, parent)
    if created is not None:
        try:
            return (yield RunClaimed(created, created=True))
        except (WorkflowSuspended, WorkflowPaused):
            pass  # waits without holding anything; resumed below once runnable
    yield Attach(defn, workflow_id, inputs)
    delay = POLL_MIN
    while True:
        done, value = yield Finished(workflow_id)
        if done:
            return value
        again = yield Reclaim(workflow_id)
        if again is not None:
            try:
                return (yield RunClaimed(again))
            except (WorkflowSuspended, WorkflowPaused):
                delay = POLL_MIN
                continue
        yield Sleep(delay)
        delay = min(POLL_MAX, delay * 2)


def start(
    defn: WorkflowDef,
    workflow_id: str,
    inputs: str,
    parent: tuple[str, int] | None,
    message: dict[str, Any] | None = None,
) -> Life[Any]:
    """Start a workflow in the background and return what its handle waits on: the run
    of a new workflow; for an existing one, a run of it if it can be claimed here (it was
    interrupted and nobody holds it), else nothing (the handle reads the database).
    `message` (start_or_send): delivered in the creation's transaction, to the new
    workflow or the existing one."""
    yield Remember(defn, workflow_id)
    try:
        created = yield Create(defn, workflow_id, inputs, parent, message)
    except BaseException:
        yield Forget(workflow_id)
        raise
    if created is not None:
        return (yield Launch(created))
    info = yield Attach(defn, workflow_id, inputs)
    if info.status.is_terminal:
        yield Forget(workflow_id)
        return None
    return (yield LaunchClaim(workflow_id))


def result(workflow_id: str, timeout: float | None, local: bool) -> Life[Any]:
    """Wait for a workflow to end and return its value (raising what it ended with), or
    ResultTimeoutError after `timeout` seconds (it keeps running). `local`: this process
    runs it, so its run is waited for first, and a run that ended SUCCESS here hands over
    the output it stored (the stored text decoded, so the value is the same in every
    process); any other end is read from the database."""
    deadline = None if timeout is None else (yield Now()) + timeout
    if local:
        ended = yield WaitLocal(workflow_id, timeout)
        if ended is None:
            raise ResultTimeoutError(workflow_id, timeout or 0.0)
        if ended[0]:
            return ended[1]
    delay = POLL_MIN
    while True:
        done, value = yield Finished(workflow_id)
        if done:
            return value
        wait = delay
        if deadline is not None:
            left = deadline - (yield Now())
            if left <= 0:
                raise ResultTimeoutError(workflow_id, timeout or 0.0)
            wait = min(delay, left)
        yield Sleep(wait)
        delay = min(POLL_MAX, delay * 2)


def event(workflow_id: str, key: str, timeout: float) -> Life[Any]:
    """The latest value a workflow published under `key`, looking again (backing off)
    for up to `timeout` seconds until there is one; None if there is none by then."""
    deadline = (yield Now()) + timeout
    delay = POLL_MIN
    while True:
        found, value = yield ReadEvent(workflow_id, key)
        now = yield Now()
        if found or now >= deadline:
            return value
        yield Sleep(min(delay, max(0.0, deadline - now)))
        delay = min(POLL_MAX, delay * 2)
