"""The state of one workflow run, and when it must stop or prove its claim.

`Settings` is what every run of an engine shares (everything injected: the core reads no
environment and owns no clock); `Run` is one executing run; `Journal` assigns call
positions and finds the record to replay at each. The stopping rules live next to that
state because they read nothing else: a run stops at its next new call when it was
cancelled or passed its deadline, when an operator paused it, or when its worker is
stopping (`check_interrupt`),
renews its claim before running code when its lease may have lapsed (`reclaim`, then
`proven`), keeps sending a write an outage cut off only while its lease may still hold
(`lease_may_hold`), and treats a fenced write that touched no row as lost ownership
(`_fenced`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from durable._base import labels
from durable._base.models import Ledger, StepRecord
from durable._core.faults import AppFault
from durable._core.ops import Execute, Outcome, StepScope
from durable.errors import (
    BranchOrderError,
    NondeterminismError,
    StaleOwnerError,
    WorkflowHandedOver,
    WorkflowInterrupted,
    WorkflowPaused,
)
from durable.serialization import Serializer, dumps_checked, keep_checked, return_type

if TYPE_CHECKING:
    from durable._base.clock import Clock


class JournalRows(Mapping[int, StepRecord]):
    """A journal as loaded: its rows (load_journals' columns, as tuples), each made a
    StepRecord only when a call reaches its position. A recovery loads thousands of
    journals at once; what their runs never reach is never built, and what they reach is
    built on the run's own thread. (A record's stored value is decoded later still, when
    the call replays it.)"""

    __slots__ = ("_rows",)

    def __init__(self, rows: dict[int, Sequence[Any]]) -> None:
        self._rows: dict[int, Sequence[Any] | StepRecord] = dict(rows)

    def __getitem__(self, seq: int) -> StepRecord:
        found = self._rows[seq]
        if isinstance(found, StepRecord):
            return found
        record = self._rows[seq] = StepRecord.from_journal_row(found)
        return record

    def get(self, seq: int, default: Any = None) -> Any:  # (Mapping.get, without a raise)
        found = self._rows.get(seq)
        if found is None:
            return default
        if isinstance(found, StepRecord):
            return found
        record = self._rows[seq] = StepRecord.from_journal_row(found)
        return record

    def __contains__(self, seq: object) -> bool:  # (Mapping's builds the record)
        return seq in self._rows

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


@dataclass
class Journal:
    """The recorded steps of one workflow run and the position of the next call."""

    workflow_id: str
    records: Mapping[int, StepRecord] = field(default_factory=dict)
    next_seq: int = 0
    # The first call that did not match the journal (or broke a branch's order): from then
    # on no new call is made, in any branch of the run, only replays. A sibling branch whose
    # positions shifted would otherwise make its journaled call again, for real, at a later
    # position (a card charged twice, a child started twice) before the run ends ERROR.
    diverged: NondeterminismError | None = None

    @classmethod
    def from_records(cls, workflow_id: str, records: Iterable[StepRecord]) -> Journal:
        return cls(workflow_id, {r.step_seq: r for r in records})

    @classmethod
    def from_rows(cls, workflow_id: str, rows: dict[int, Sequence[Any]]) -> Journal:
        """A journal from load_journals' rows (tuples) by position, built as reached."""
        return cls(workflow_id, JournalRows(rows) if rows else {})

    @property
    def is_fresh(self) -> bool:
        """True when nothing is recorded, so no call can replay (no lookups needed)."""
        return not self.records

    def replaying_at(self, seq: int) -> bool:
        """Whether position `seq` lies within what the journal recorded (at it or before a
        later record): a call there replays history, it does not make it."""
        return bool(self.records) and seq <= max(self.records)

    def next_call(self, step_name: str) -> tuple[int, StepRecord | None]:
        """Assign the next position; return the record to replay there, if any."""
        seq = self.next_seq
        self.next_seq += 1
        record = self.records.get(seq) if self.records else None
        if record is None:
            if self.diverged is not None:  # (refuse_if_diverged, inline: every new call)
                raise self.diverged
            return seq, None
        if record.step_name != step_name:
            fix = ""
            if record.step_name.startswith(labels.PATCH_PREFIX):
                patch_id = record.step_name[len(labels.PATCH_PREFIX) :]
                fix = (
                    f"This run took patch {patch_id!r} here, on code that has "
                    f"durable.patched({patch_id!r}); this code calls neither that nor "
                    f"durable.deprecate_patch({patch_id!r}) at this point. Either this "
                    "worker runs code older than the run's (a deploy in progress: stop the "
                    "old workers before new code takes patches, or give the new code a "
                    "version= of its own so old workers leave its runs alone), or the patch "
                    f"call was removed too early: keep durable.deprecate_patch({patch_id!r}) "
                    "here until no run that took the patch is left"
                )
            raise self.diverge(
                NondeterminismError(self.workflow_id, seq, record.step_name, step_name, fix)
            )
        return seq, record

    def diverge(self, error: NondeterminismError) -> NondeterminismError:
        """Note the run's first divergence (see `diverged`); returns `error` to raise."""
        if self.diverged is None:
            self.diverged = error
        return error

    def refuse_if_diverged(self) -> None:
        """Before a new call (one beyond the journal): none is made once the run diverged."""
        if self.diverged is not None:
            raise self.diverged

    def replay_next(self, step_name: str) -> StepRecord | None:
        """The record at the next position, taken as next_call takes it, when there is one;
        None, and the position left untaken, when there is none (the call is new)."""
        if self.next_seq in self.records:
            return self.next_call(step_name)[1]
        return None

    def next_call_of(self, step_names: Sequence[str]) -> tuple[int, StepRecord | None]:
        """next_call for a call journaled under one of `step_names`: a wait whose name
        records which of its conditions won (another name there is reported as the first)."""
        found = self.records.get(self.next_seq)
        if found is not None and found.step_name in step_names:
            return self.next_call(found.step_name)
        return self.next_call(step_names[0])


def _never_crash(name: str) -> None:
    return None


def _no_request(workflow_id: str, epoch: int) -> str | None:
    return None


def _staying() -> bool:
    return False


def _not_paused(workflow_id: str, epoch: int) -> bool:
    return False


def _no_fault(exc: BaseException) -> AppFault | None:
    return None


def _no_compensation(effect_name: str) -> Callable[..., Any] | None:
    return None


@dataclass(frozen=True)
class Compensation:
    """The undo of one applied effect: the undo action and the effect's arguments, and
    where the effect is recorded in the ledger (the workflow whose row it is, and the
    position), on which the undo is claimed before it runs (None: not claimed)."""

    undo: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    applied_in: str | None = None
    step_seq: int | None = None


@dataclass(frozen=True)
class Settings:
    """What every run of one engine shares. Everything here is injected, so the core reads
    no environment, owns no clock and knows no database driver.

    clock: where time is read (a durable.Clock).
    app_separate: the application database is not the system database, so a transaction
        step's record goes to the app database first (and is adopted from there).
    compensation_of: the undo registered for an effect name, if any.
    crash_point: called at the worst moments of a run; crash tests arm it to SIGKILL.
    cancel_request: the reason this executor was asked to stop a run (a workflow at an
        epoch: a request for an earlier run of a resumed workflow is not this run's).
    pause_request: whether an operator asked to pause a run (a workflow at an epoch, as
        cancel_request): it is then given back PAUSED at its next new call.
    handing_over: whether the runs' worker is stopping: each run then hands its workflow
        over at its next new call (see check_interrupt), so that no step it finished runs
        again on the worker that takes the workflow.
    classify_app_error: how the driver sees an application-database error: an AppFault
        (lost connection, refused fence, conflict to retry, write refused as read-only,
        unique violation with its constraint), or None.
    stream_channel: the NOTIFY channel that wakes stream readers.
    work_channel: the NOTIFY channel that wakes workers (a message a workflow sent).
    executor_id: the executor running the runs (an attribute of their spans).
    lease_seconds: how long a claim holds without renewal (see reclaim).
    observe_step: told of each attempt of a journaled call whose code ran (its scope and
        Outcome): the worker's metrics (durable/_host/metrics.py). None: nothing is measured.
    observe_finish: told of each outcome a run wrote (the workflow's name and status):
        the worker's metrics. None: nothing is counted.
    callback_secret: the key a callback URL's token is derived with (DURABLE_CALLBACK_SECRET;
        see callbacks.py). None: durable.callback_url() refuses to mint one.
    callback_base_url: where callback URLs point when the call names no base_url
        (DURABLE_CALLBACK_BASE_URL).
    """

    serializer: Serializer
    max_payload_bytes: int
    clock: Clock
    app_separate: bool = False
    compensation_of: Callable[[str], Callable[..., Any] | None] = _no_compensation
    crash_point: Callable[[str], None] = _never_crash
    cancel_request: Callable[[str, int], str | None] = _no_request
    pause_request: Callable[[str, int], bool] = _not_paused
    handing_over: Callable[[], bool] = _staying
    classify_app_error: Callable[[BaseException], AppFault | None] = _no_fault
    stream_channel: str = "durable_streams"
    work_channel: str = "durable_work"
    executor_id: str = ""
    lease_seconds: float = 30.0
    observe_step: Callable[[StepScope | None, Outcome], None] | None = None
    observe_finish: Callable[[str, str], None] | None = None
    callback_secret: bytes | None = None
    callback_base_url: str | None = None


@dataclass
class Run:
    """The state of one executing workflow run. `conn` and `host` belong to the driver."""

    settings: Settings
    workflow_id: str
    name: str
    epoch: int
    journal: Journal
    mode: str = "sync"
    conn: Any = None
    host: Any = None
    # (The sync driver's) where a connection checked out after an outage closed the run's
    # own is kept until the run ends.
    checkouts: Any = None
    # True only for the run that created the workflow: nothing can have been written for
    # it before, so lookups of half-finished work (an app-side transaction record, an
    # effect's intent) are skipped. A claimed run, even with an empty journal, looks.
    first_run: bool = False
    # An async def workflow, run by the async driver on an event loop; `branches` is the
    # driver's record of the tasks making durable calls for it.
    is_async: bool = False
    branches: Any = None
    # Set once a branch of this run parked the workflow (Park): the run is over, and a
    # branch that reaches user code after it stops instead (its record would be refused).
    parked: bool = False
    # Exit mode: step records not yet written.
    pending: list[dict[str, Any]] = field(default_factory=list)
    # Undo actions of applied effects, in the order they were registered (a saga). Rebuilt
    # deterministically on replay, because replayed effects register them again.
    compensations: list[Compensation] = field(default_factory=list)
    approvals_asked: dict[str, int] = field(default_factory=dict)
    # Per stream key: the offset of the next value, and the keys closed (rebuilt by replay).
    stream_offsets: dict[str, int] = field(default_factory=dict)
    closed_streams: set[str] = field(default_factory=set)
    # Per patch id: what durable.patched() answered first in this run (rebuilt by replay).
    patches: dict[str, bool] = field(default_factory=dict)
    # The workflow that started this one (None for a top-level workflow): its finish wakes
    # that parent if it is suspended waiting for it (durable.start_child's result()).
    parent_id: str | None = None
    # Which life of its id the workflow is (workflows.incarnation, '' for a journal of
    # version 1): read once, by the first send that derives a message id. None: not read.
    incarnation: str | None = None
    # Whether this run moved the messages sent to its id before the workflow existed
    # (send(before_start=True)) to its own, which it does before its first look for one.
    early_adopted: bool = False
    # When the workflow times out (from its first start), and why it was asked to stop if
    # it was when claimed. `stopping` is set while compensations of a cancel run, so that
    # they are not interrupted in turn.
    deadline: dt.datetime | None = None
    cancel_reason: str | None = None
    stopping: bool = False
    # The budget this run draws from (its root's id), the run's copy of that ledger, and
    # the steps of this run executing now (their charges and reservations count against
    # the cap before they are recorded; parallel async steps are several).
    budget_id: str | None = None
    ledger: Ledger | None = None
    inflight: list[StepScope] = field(default_factory=list)
    # Held while a charge is checked and added (steps charge from worker threads at once),
    # and while a step's record reads what it charged and the run's copy of its ledger is
    # changed (see _core.budget): the driver's lock; none for a single-threaded run.
    deciding: AbstractContextManager[Any] = field(default_factory=nullcontext)
    # The working state (durable.state) and the conversation turns, as of this point of
    # the run: rebuilt by replay, since every update is a journaled call.
    state: str | None = None
    turns: list[Any] = field(default_factory=list)
    # When this run's claim was last proven (see reclaim): the count of doubts on this
    # process's claims then (Outage.doubts), and the time (time.monotonic()).
    doubts_seen: int = 0
    proven_at: float = 0.0
    # The trace the workflow belongs to (stored when it was created), and whether this run
    # has a recording span (then each step attempt gets one too).
    trace_context: str | None = None
    traced: bool = False
    # The stored text of the run's output, once the commit that ended it SUCCESS is done:
    # the handle of the process that started it decodes this instead of reading it back.
    output: str | None = None

    def dumps(self, value: Any, what: str) -> str:
        s = self.settings
        return dumps_checked(s.serializer, value, what, s.max_payload_bytes)

    def loads(self, text: str | None) -> Any:
        return None if text is None else self.settings.serializer.loads(text)

    def keep(self, value: Any, what: str, fn: Callable[..., Any]) -> tuple[str, Any]:
        """Serialize what `fn` returned, and the value a replay will see (handed out now
        too, so a first run and a replay never differ). Raises before anything is written
        if it cannot be stored, or would not read back the same."""
        s = self.settings
        return keep_checked(s.serializer, value, what, s.max_payload_bytes, return_type(fn))


TIMEOUT_REASON = "timeout"


def stop_reason(run: Run) -> str | None:
    """Why this run must stop at its next new call (a cancel or the timeout), or None."""
    if run.stopping:
        return None
    reason = run.settings.cancel_request(run.workflow_id, run.epoch) or run.cancel_reason
    if reason is not None:
        return reason
    if run.deadline is not None and run.settings.clock.now() >= run.deadline:
        return TIMEOUT_REASON
    return None


def check_branch_order(run: Run, previous: int | None, seq: int) -> None:
    """A branch of an async run (a task other than the workflow body's) takes position
    `seq` after its own position `previous`: BranchOrderError unless they are adjacent.

    Tasks start in the order they were created, and a replayed call returns without
    waiting, so on a replay a branch takes all its journaled positions one after the other
    before a sibling runs. Its positions replay only if it took them that way on the first
    run: a sibling's call between two of its calls means the order came from timing, and a
    replay would hand those positions to other calls. Refused on the first run, before
    the call runs, rather than found on a replay as a mismatch that blames a code change."""
    if previous is not None and seq != previous + 1:
        raise run.journal.diverge(BranchOrderError(run.workflow_id, seq, previous))


def check_interrupt(run: Run) -> None:
    """Stop here if the workflow was cancelled or is past its timeout, give it back PAUSED
    if an operator paused it, or hand it over if its worker is stopping.

    Called before every new (unjournaled) step or wait, so cancellation is seen at the next
    boundary; replayed calls never stop, so a resumed run reaches the same point first. The
    cancel request is one lookup (the engine polls for requests); the timeout a clock read.

    A stopping worker's runs end here too (WorkflowHandedOver): the call before this one
    is recorded and the next has not begun, so the worker that takes the workflow over
    replays everything this run did and runs nothing of it again. Releasing a run while
    a step is under way instead lets that step finish its side effect after another worker
    has started it again. A cancel asked of the run is acted on first (it ends the
    workflow here rather than on the next worker); compensations under way (`stopping`)
    are not cut short.

    A pause is a hand-over that no worker takes until an operator unpauses the workflow
    (WorkflowPaused): the same boundary, so the same rule holds. The step before has its
    record, the next has not begun, and the run that goes on after the unpause replays the
    one and runs the other once. A cancel goes first; a pause does not stop an undo.
    """
    reason = stop_reason(run)
    if reason is not None:
        raise WorkflowInterrupted(run.workflow_id, reason, reason == TIMEOUT_REASON)
    if not run.stopping and run.settings.pause_request(run.workflow_id, run.epoch):
        raise WorkflowPaused(run.workflow_id)
    if not run.stopping and run.settings.handing_over():
        raise WorkflowHandedOver(run.workflow_id)


@dataclass(slots=True)
class ClaimCheck(Execute):
    """The statement that proves a run's claim (see reclaim), and what the proof records
    once the driver has run it (see proven): the doubts counted and the time it was asked."""

    doubts: int = 0
    at: float = 0.0


def reclaim(run: Run, doubts: int, renewed_at: float, now: float) -> ClaimCheck | None:
    """The statement that proves a run still holds its workflow before its code runs, when
    its lease may have lapsed since the claim was last proven; None otherwise (the cost in
    the common case is two comparisons).

    A lease lapses when nobody renews it: while the database is down, or while the
    heartbeat is starved or late. A run that waited meanwhile (queued behind busy
    threads, or blocked on a connection) may have lost its workflow to another worker,
    which may even have finished it. Its fenced writes would be refused, but only after
    its next step's code had run again, in the world; and an effect's call could overlap
    the new owner's. So it renews its lease by its epoch first: no row means it is no
    longer the owner.

    doubts: how many outages ended and heartbeat gaps of half a lease were seen in this
    process (Outage.doubts); renewed_at: when the heartbeat last renewed every held lease;
    now: time.monotonic(). The driver runs the statement and hands its row to `proven`."""
    fresh = max(run.proven_at, renewed_at)
    if doubts == run.doubts_seen and now - fresh < run.settings.lease_seconds / 2:
        return None
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "lease_seconds": run.settings.lease_seconds,
    }
    return ClaimCheck("renew_claim", params, "one", doubts=doubts, at=now)


def proven(run: Run, check: ClaimCheck, row: Any) -> None:
    """The answer to `reclaim`'s statement: no row, the run no longer holds its workflow
    (StaleOwnerError); else its claim is proven as of the check."""
    if row is None:
        raise StaleOwnerError(run.workflow_id, run.epoch)
    run.doubts_seen, run.proven_at = check.doubts, check.at


def lease_may_hold(run: Run, now: float, renewed_at: float) -> bool:
    """Whether this run's lease may still hold at `now` (time.monotonic()), as far as this
    process can tell: less than a lease has passed since it was last renewed, by the
    heartbeat (`renewed_at`, Outage.renewed_at) or by the run proving its claim
    (`proven_at`). Both are taken before their statement was sent, so the lease held at
    least that long; a renewal whose answer was lost may have made it longer, never
    shorter. Past that, another worker may have claimed the workflow."""
    return now - max(run.proven_at, renewed_at) < run.settings.lease_seconds


def _fenced(count: int, run: Run) -> None:
    if count == 0:
        raise StaleOwnerError(run.workflow_id, run.epoch)
