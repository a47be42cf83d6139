"""The pure core: every replay-or-execute decision of a workflow run, and nothing else.

A run walks its journal in call order: the n-th journaled call gets position n. If the
journal has a record at n, the call replays it (after checking the name, so changed code
cannot read another step's output); if not, it executes. Around that sit the rest of the
decisions: durability barriers, retries with backoff, the effect state machine (intent ->
pending -> applied, reconciliation, refused key reuse), the one gate that approvals and
the budget share, waits that suspend, compensations, and the finish.

Each operation is a generator, in the style of psycopg's `generators.py`: it yields
operations (`Execute` a named statement, `Call` user code, `Pause`, `RunChild`, app
transaction steps, ...) and receives their results; it never touches a connection, a
thread or a clock of its own. A driver performs the operations: `_run/driver.py` for
ordinary functions; `_run/driver_async.py` runs the same generators with `await`. So each
decision exists once, and the unit tests drive these generators with no database at all
(`tests/unit/`).

The package is split by concept, one module per kind of decision:

- `ops`: the operations a generator yields to its driver, and `Outcome`.
- `run`: `Settings`, `Run` and `Journal`; when a run must stop or prove its claim.
- `journal`: replay, errors as stored, journal writes (and outlasting an outage that
  cuts one off) and durability barriers.
- `steps`: @step, @durable.tool and @transaction.
- `heartbeats`: long steps: an attempt's deadlines, heartbeats, the fence on a given-up
  attempt.
- `faults`: what an application-database error means to a transaction step.
- `effects`: @effect's write-ahead state machine.
- `children`: child workflows.
- `workflow`: a run's body and outcome: finish, cancel, compensations.
- `gates`: the gate approvals and the budget share.
- `budget`: the budget gate, the hard cap, what is left.
- `transitions`: the status machines of effects and workflows, as tables.
- `waits`: durable sleep and receiving messages.
- `first`: waiting for the first of several things (durable.wait_first, a child's result).
- `streams`: events, streams, working state and conversation turns.
- `callbacks`: a wait's single-use callback URL, minted once and journaled.

Callers import from the package (`from durable import _core as protocol`); the names
below are its surface.
"""

from __future__ import annotations

from durable._core.budget import (
    LateCharge,
    adopt_ledger,
    budget_gate,
    budget_left,
    call_limit,
    charge,
    open_ledger,
    over_cap,
    refresh_ledger,
    release,
    reserve,
    reserve_call,
    settle,
    with_running_steps,
    write_late_charge,
)
from durable._core.callbacks import callback_url, token_hash
from durable._core.children import (
    Placed,
    child,
    place_start,
    record_start,
)
from durable._core.effects import (
    effect,
)
from durable._core.faults import TRANSACTION_OUTPUTS_TAKEN, AppFault, Fault
from durable._core.first import (
    OnApproval,
    OnChild,
    OnMessage,
    OnTimer,
    child_result,
    wait_first,
)
from durable._core.gates import (
    approval,
    gate,
)
from durable._core.heartbeats import (
    SWEEP_SLACK,
    attempt_deadline,
    beat,
    give_up,
    read_last,
    write_beat,
)
from durable._core.journal import (
    barrier,
    decode_error,
    encode_error,
    outlast,
    rebuild_error,
    record,
    replay,
    restore,
    sent,
)
from durable._core.messages import get_event, send
from durable._core.ops import (
    ABORTED,
    CONFLICT_ATTEMPTS,
    AppBegin,
    AppCall,
    AppEnd,
    AppExecute,
    AwaitWriter,
    Call,
    Enqueue,
    Execute,
    Fetch,
    Finish,
    Gen,
    Join,
    LeaseClock,
    Op,
    Outcome,
    Park,
    Pause,
    RecordStep,
    RunChild,
    StepScope,
    WriteSteps,
    conflict_backoff,
    outage_backoff,
)
from durable._core.patches import deprecate_patch, patched
from durable._core.run import (
    TIMEOUT_REASON,
    ClaimCheck,
    Compensation,
    Journal,
    Run,
    Settings,
    check_branch_order,
    check_interrupt,
    lease_may_hold,
    proven,
    reclaim,
    stop_reason,
)
from durable._core.steps import (
    NOT_JOURNALED,
    replayed_step,
    step,
    transaction,
)
from durable._core.streams import (
    append_turn,
    set_attributes,
    set_event,
    set_event_in_step,
    set_state,
    write_stream,
)
from durable._core.transitions import (
    EFFECT_EVENTS,
    EFFECT_NEVER_WRITTEN,
    EFFECT_TRANSITIONS,
    FINISHED_BY_A_RUN,
    WORKFLOW_EVENTS,
    WORKFLOW_NEVER_WRITTEN,
    WORKFLOW_TRANSITIONS,
    TransitionError,
    allowed,
    assert_transition,
    is_settled,
)
from durable._core.waits import (
    SLEEP_IN_PLACE,
    recv,
    sleep,
)
from durable._core.workflow import (
    CANCEL_ROUNDS,
    cancel_tree,
    compensate,
    finish,
    register_compensation,
    workflow,
)

__all__ = [
    "ABORTED",
    "CANCEL_ROUNDS",
    "CONFLICT_ATTEMPTS",
    "EFFECT_EVENTS",
    "EFFECT_NEVER_WRITTEN",
    "EFFECT_TRANSITIONS",
    "FINISHED_BY_A_RUN",
    "NOT_JOURNALED",
    "SLEEP_IN_PLACE",
    "SWEEP_SLACK",
    "TIMEOUT_REASON",
    "TRANSACTION_OUTPUTS_TAKEN",
    "WORKFLOW_EVENTS",
    "WORKFLOW_NEVER_WRITTEN",
    "WORKFLOW_TRANSITIONS",
    "AppBegin",
    "AppCall",
    "AppEnd",
    "AppExecute",
    "AppFault",
    "AwaitWriter",
    "Call",
    "ClaimCheck",
    "Compensation",
    "Enqueue",
    "Execute",
    "Fault",
    "Fetch",
    "Finish",
    "Gen",
    "Join",
    "Journal",
    "LateCharge",
    "LeaseClock",
    "OnApproval",
    "OnChild",
    "OnMessage",
    "OnTimer",
    "Op",
    "Outcome",
    "Park",
    "Pause",
    "Placed",
    "RecordStep",
    "Run",
    "RunChild",
    "Settings",
    "StepScope",
    "TransitionError",
    "WriteSteps",
    "adopt_ledger",
    "allowed",
    "append_turn",
    "approval",
    "assert_transition",
    "attempt_deadline",
    "barrier",
    "beat",
    "budget_gate",
    "budget_left",
    "call_limit",
    "callback_url",
    "cancel_tree",
    "charge",
    "check_branch_order",
    "check_interrupt",
    "child",
    "child_result",
    "compensate",
    "conflict_backoff",
    "decode_error",
    "deprecate_patch",
    "effect",
    "encode_error",
    "finish",
    "gate",
    "get_event",
    "give_up",
    "is_settled",
    "lease_may_hold",
    "open_ledger",
    "outage_backoff",
    "outlast",
    "over_cap",
    "patched",
    "place_start",
    "proven",
    "read_last",
    "rebuild_error",
    "reclaim",
    "record",
    "record_start",
    "recv",
    "refresh_ledger",
    "register_compensation",
    "release",
    "replay",
    "replayed_step",
    "reserve",
    "reserve_call",
    "restore",
    "send",
    "sent",
    "set_attributes",
    "set_event",
    "set_event_in_step",
    "set_state",
    "settle",
    "sleep",
    "step",
    "stop_reason",
    "token_hash",
    "transaction",
    "wait_first",
    "with_running_steps",
    "workflow",
    "write_beat",
    "write_late_charge",
    "write_stream",
]
