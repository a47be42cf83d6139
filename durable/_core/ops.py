"""The operations a protocol generator asks of its driver, and what it gets back.

This is the whole interface between the pure core and the I/O: a generator yields one of
these dataclasses (`Execute` a named statement, `Call` user code, `Pause`, `RunChild`,
the `App*` steps of an application transaction, `Park`, `Join`, ...) and is sent the
result. Keeping them in one place, with no decision in them, lets the sync and the async
driver perform the same list, and lets the unit tests script every answer. The few
decisions here are about how an operation is performed: how often a transaction step
retries a conflict, and how long it waits between tries.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from durable._base.registry import WorkflowDef

T = TypeVar("T")


Fetch = Literal["count", "one", "all"]


@dataclass(slots=True)
class Execute:
    """Run a named statement on the run's system-database connection (autocommit: one
    statement, one commit). Sends back the row count, the first row or all rows.

    `serial`: a statement that reads or writes the run's budget ledger. Parallel branches
    of an async run use connections of their own, so their answers could arrive in any
    order; the driver sends a run's serial statements one at a time, so each answer is
    applied to the run's copy of the ledger in the order the database committed them (a
    charge is never counted by neither copy nor by both)."""

    name: str
    params: dict[str, Any]
    fetch: Fetch = "count"
    serial: bool = False


class RecordStep(Execute):
    """Execute record_step: journal one step's record (sync mode). A driver may commit it
    together with the records of other runs written at the same moment (the sync driver's
    group commit), and answers once this one is committed: its row count."""

    __slots__ = ()

    def __init__(self, params: dict[str, Any]) -> None:
        Execute.__init__(self, "record_step", params)


class Finish(Execute):
    """Execute finish_workflow: write the run's outcome, fenced by its epoch. Like
    RecordStep, a driver may commit it with the outcomes of other runs ending at once."""

    __slots__ = ()

    def __init__(self, params: dict[str, Any]) -> None:
        Execute.__init__(self, "finish_workflow", params)


@dataclass(slots=True)
class WriteSteps:
    """Journal many step records in one statement; sends back the workflow id of each row
    written (a fence refuses rows of runs that lost ownership). With `finish` (the
    finish_workflow parameters of the rows' one run), the run's outcome is written in the
    same statement: all of it or, if the run lost ownership, none."""

    rows: list[dict[str, Any]]
    finish: dict[str, Any] | None = None


@dataclass(slots=True)
class Enqueue:
    """Hand a step record to the background writer (async durability)."""

    row: dict[str, Any]


@dataclass(slots=True)
class AwaitWriter:
    """Wait until the background writer has written every record this run queued; the
    driver raises StaleOwnerError if the database refused them."""


@dataclass(slots=True)
class StepScope:
    """A step whose user code is running: the driver makes it the current step (a context
    variable) for the call, so decorated calls inside it are plain calls, and what the
    code charges is counted for this step alone (parallel steps of one run charge apart).
    `charging`: durable.charge() is allowed (steps and tools)."""

    name: str
    charging: bool = False
    dollars: Decimal = Decimal(0)
    tokens: int = 0
    # What durable.reserve() set aside (counted until the step records, or the
    # reservation's block ends), and why a charge or reservation was refused by the cap.
    reserved_dollars: Decimal = Decimal(0)
    reserved_tokens: int = 0
    refused: str | None = None
    # Where the step is in the journal, what it is and which attempt runs (for its span);
    # seq -1: code that is no journaled position of its own.
    seq: int = -1
    kind: str = "step"
    attempt: int = 1
    # Long steps (see heartbeats): the attempt whose code may heartbeat now (None between
    # attempts, and once one was given up), its heartbeat_timeout, when it last heartbeat
    # (the driver's monotonic clock), the details of the last heartbeat before it began
    # (once read), what the driver does on a heartbeat (move its deadline), and a refusal
    # of a heartbeat written in the background, raised at the next one.
    live: int | None = None
    heartbeat_timeout: float | None = None
    beat_at: float = 0.0
    last_details: str | None = None
    details_read: bool = False
    on_beat: Callable[[], None] | None = None
    beat_error: BaseException | None = None
    # How many charges of attempts that no longer counted were written apart (their keys).
    late_charges: int = 0


@dataclass(slots=True)
class Call:
    """Call user code; sends back an Outcome (the driver catches Exception, and throws
    anything else, such as a suspension or a KeyboardInterrupt, into the generator).
    `scope`: the step the code runs as (None: the workflow's own body, a compensation or
    a reconcile function). `timeout`: an attempt running longer is given up and fails
    with StepTimeoutError (async code is cancelled; a def step's thread is left to
    finish). `body`: the workflow function itself, whose task waits on its branches
    rather than running a durable call of its own (see Park).
    """

    fn: Callable[..., Any]
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    scope: StepScope | None = None
    timeout: float | None = None
    body: bool = False


# How many times a transaction step runs when the database reports a serialization
# failure or a deadlock (SQLSTATE 40001, 40P01) before the error is the step's outcome.
CONFLICT_ATTEMPTS = 10


def conflict_backoff(attempt: int) -> float:
    """Seconds to wait before attempt `attempt + 1` after a conflict: 2 ms doubling to
    0.2 s, with jitter so that two transactions that collided do not collide again."""
    return min(0.2, 0.002 * 2.0 ** (attempt - 1)) * (0.5 + random.random())


def outage_backoff(attempt: int) -> float:
    """Seconds to wait before sending a write again after an outage cut off attempt
    `attempt`: 50 ms doubling to 1 s, with jitter so that the runs an outage interrupted
    together do not all come back at the same instant."""
    return min(1.0, 0.05 * 2.0 ** (attempt - 1)) * (0.5 + random.random())


@dataclass(slots=True)
class Pause:
    """Wait in place (a retry's backoff, a sleep too short to suspend for)."""

    seconds: float


@dataclass(slots=True)
class LeaseClock:
    """Ask how old this process's knowledge of its leases is: sends back a pair
    (now, renewed_at), the driver's monotonic clock and when the heartbeat last renewed
    every lease this process holds (Outage.renewed_at, 0.0 if never). With the run's own
    `proven_at`, it tells the core whether a run's lease may still hold (see
    run.lease_may_hold) without the core owning a clock."""


@dataclass(slots=True)
class RunChild:
    """Run (or resume, or wait for) a child workflow to its end; sends back an Outcome."""

    defn: WorkflowDef
    workflow_id: str
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    parent: tuple[str, int]


@dataclass(slots=True)
class AppBegin:
    """Open a transaction on the application database (for a @transaction step)."""

    isolation_level: str | None


@dataclass(slots=True)
class AppExecute:
    """Run a named statement inside the open application transaction."""

    name: str
    params: dict[str, Any]
    fetch: Fetch = "count"


@dataclass(slots=True)
class AppCall:
    """Call the user's transaction function with the open connection first; sends back an
    Outcome."""

    fn: Callable[..., Any]
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    scope: StepScope | None = None


ABORTED = "aborted"  # AppEnd's answer for a transaction found in error


@dataclass(slots=True)
class AppEnd:
    """Commit (or roll back) the open application transaction. A rollback with nothing
    open does nothing.

    `last`: a statement sent in one pipeline with the COMMIT (one round trip for both);
    if it fails, nothing commits and its error is raised. Sends back its row count; None
    when no transaction was open any more (the step's code ended it, through SQLAlchemy
    or with a COMMIT or ROLLBACK of its own); ABORTED, rolled back and nothing sent, when
    the transaction was in error (the step's code caught a database error and went on)."""

    commit: bool
    last: AppExecute | None = None


@dataclass(slots=True)
class Park:
    """Before a branch parks the workflow (a gate, a sleep or a wait for a message that
    suspends): wait until no other branch of the run is inside a durable call and no
    other branch is parking. A suspension ends the run: a sibling still running a step
    would have its record refused and its code run again on resume (a model call paid
    twice). Sends back True when a sibling parked the run meanwhile: this branch's wait
    then joins that suspension instead of writing one. A sync run has one branch: the
    driver sends back False at once."""


@dataclass(slots=True)
class Join:
    """Wait until every other branch of this run has ended: the tasks an async workflow
    started (asyncio.gather) that are still making durable calls after its body returned.
    A sync run has none."""


Op = (
    Execute
    | WriteSteps
    | Enqueue
    | AwaitWriter
    | Call
    | Pause
    | LeaseClock
    | RunChild
    | AppBegin
    | AppExecute
    | AppCall
    | AppEnd
    | Park
    | Join
)
Gen = Generator[Op, Any, T]


@dataclass(slots=True)
class Outcome:
    """What user code did: returned `value`, or raised `error`, in `seconds`."""

    value: Any = None
    error: Exception | None = None
    seconds: float = 0.0
