"""@workflow, @step and @transaction: validate at decoration time, register, wrap.

Decorators do no I/O. They check the function and the options at once (so a typo fails at
import, not an hour into a run), register a definition, and return a wrapper that asks the
executor what to do when it is called.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Never,
    ParamSpec,
    Protocol,
    TypeVar,
    cast,
    overload,
)

from durable._base.models import Budget, RetryPolicy, StepKind
from durable._base.names import check_name
from durable._base.registry import (
    Durability,
    EffectOptions,
    Registry,
    StepDef,
    WorkflowDef,
    default_registry,
)
from durable._run import dbos_names as dbos
from durable._run import driver as _driver
from durable._run import driver_async as _driver_async
from durable._run.methods import bound_entries, unwrap
from durable._run.start_options import MAX_SECONDS, WithOptions, check_parameters
from durable.errors import ConfigurationError, DefinitionError

if TYPE_CHECKING:
    from sqlalchemy import Connection

P = ParamSpec("P")
R = TypeVar("R")

_WORKFLOW_ATTR = "__durable_workflow__"
_STEP_ATTR = "__durable_step__"
_DURABILITY = ("sync", "async", "exit")
_ISOLATION = ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")


def default_name(fn: Callable[..., Any]) -> str:
    """`module.qualname`, with the module named as an import would name it.

    A function in a script run as `python app.py` lives in `__main__`; a worker started
    with `durable worker --app app` imports the same file as `app`. Both must store and
    look up the same name, or the script's workflows could never be recovered."""
    return f"{_module_name(fn.__module__)}.{fn.__qualname__}"


def _module_name(module: str) -> str:
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        # `python -m package.app`: the spec knows the import name.
        return str(spec.name).removesuffix(".__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return module  # an interactive session: nothing else to go by
    file = Path(path).resolve()
    # The import name relative to the closest sys.path entry that contains the file.
    for entry in sorted(
        (Path(p or os.getcwd()).resolve() for p in sys.path), key=lambda e: -len(e.parts)
    ):
        try:
            relative = file.relative_to(entry)
        except ValueError:
            continue
        parts = list(relative.with_suffix("").parts)
        if parts and all(part.isidentifier() for part in parts):
            return ".".join(parts)
    return file.stem


def _check_function(fn: object, decorator: str) -> Callable[..., Any]:
    if not callable(fn):
        raise DefinitionError(
            f"@{decorator} must decorate a function, got {type(fn).__qualname__}: "
            f"write @durable.{decorator}() above a def"
        )
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise DefinitionError(
            f"@{decorator} on generator function {getattr(fn, '__qualname__', fn)!r}: a "
            "generator's output cannot be journaled; return a list instead (an async def "
            "function is fine)"
        )
    if hasattr(fn, _WORKFLOW_ATTR) or hasattr(fn, _STEP_ATTR):
        raise DefinitionError(
            f"{getattr(fn, '__qualname__', fn)!r} is already decorated by durable: "
            "use one of @workflow, @step or @transaction per function"
        )
    return fn


def _wrap(
    func: Callable[..., Any],
    sync_entry: Callable[[Any, Any, Any], Any],
    async_entry: Callable[[Any, Any, Any], Any],
    defn: Any,
    attr: str,
) -> Callable[..., Any]:
    """The decorated function: an `async def` for an async function (so frameworks that
    look for coroutine functions still see one), a plain def otherwise."""
    if isinstance(defn, StepDef) and defn.receiver is not None and defn.kind is not StepKind.STEP:
        # (A plain step's arguments, `self` among them, are only passed on to it.)
        sync_entry, async_entry = bound_entries(sync_entry, async_entry)
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await async_entry(defn, args, kwargs)

        wrapper: Callable[..., Any] = async_wrapper
    else:

        @functools.wraps(func)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            return sync_entry(defn, args, kwargs)

        wrapper = sync_wrapper
    setattr(wrapper, attr, defn)
    return wrapper


# The largest value of a PostgreSQL integer column (workflows.max_recovery_attempts).
_MAX_INTEGER = 2**31 - 1


def _timeout(timeout: float | dt.timedelta | None, what: str) -> float | None:
    """At most MAX_SECONDS (100 years): an attempt's deadline is waited on by a thread
    (which refuses an infinite or vast wait) and the sweep adds the heartbeat_timeout to a
    database timestamp (out of range past it)."""
    seconds = timeout.total_seconds() if isinstance(timeout, dt.timedelta) else timeout
    if seconds is not None and (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not 0 < seconds <= MAX_SECONDS
    ):
        raise DefinitionError(
            f"{what}={timeout!r}: give a positive number of seconds (at most 100 years) or "
            "a datetime.timedelta"
        )
    return None if seconds is None else float(seconds)


def _check_name(name: str | None) -> None:
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise DefinitionError(f"name={name!r}: a name must be a non-empty string")
    check_name("name", name, optional=True)


def _retry_policy(
    retries: int,
    initial_delay: float,
    backoff: float,
    max_delay: float,
    jitter: float,
    retry_on: tuple[type[BaseException], ...] | type[BaseException],
) -> RetryPolicy:
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise DefinitionError(f"retries={retries!r}: use a whole number >= 0")
    for label, value in (
        ("initial_delay", initial_delay),
        ("max_delay", max_delay),
    ):
        if not isinstance(value, int | float) or value < 0:
            raise DefinitionError(f"{label}={value!r}: use a number of seconds >= 0")
    if not isinstance(backoff, int | float) or backoff < 1:
        raise DefinitionError(f"backoff={backoff!r}: use a multiplier >= 1")
    if not isinstance(jitter, int | float) or not 0 <= jitter <= 1:
        raise DefinitionError(f"jitter={jitter!r}: use a fraction between 0 and 1")
    types = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise DefinitionError(f"retry_on={retry_on!r}: give exception classes")
    return RetryPolicy(
        retries=retries,
        initial_delay=float(initial_delay),
        backoff=float(backoff),
        max_delay=float(max_delay),
        jitter=float(jitter),
        retry_on=types,
    )


# -- @workflow --------------------------------------------------------------------------------


@overload
def workflow(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def workflow(
    *,
    name: str | None = None,
    version: str | None = None,
    durability: Durability | None = None,
    timeout: float | dt.timedelta | None = None,
    budget: Budget | None = None,
    max_recovery_attempts: int | None = None,
    registry: Registry | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def workflow(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    version: str | None = None,
    durability: Durability | None = None,
    timeout: float | dt.timedelta | None = None,
    budget: Budget | None = None,
    max_recovery_attempts: int | None = None,
    registry: Registry | None = None,
    **dbos_names: Any,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a function a durable workflow: its inputs, steps and outcome are journaled.

    Call it inside `with engine:` (it runs durably in the caller's thread) or start it with
    `engine.start(fn, ...)`. `name` defaults to `module.qualname`; it is what the journal
    stores, so renaming a function without `name=` strands its running workflows.
    `timeout` (seconds or a timedelta) counts from the first start, across crashes and
    waits; past it the workflow is cancelled at its next step or wait (WorkflowTimeoutError).
    `budget` (a durable.Budget) is the ledger the workflow and its children draw from.
    `max_recovery_attempts`: how many crashes of its worker it survives (recoveries of an
    expired lease) before it is left as MAX_RECOVERY_ATTEMPTS_EXCEEDED for an operator
    (`durable workflows resume`); it wins over the Engine's `max_recovery_attempts` and is
    stored with each run when it starts, so any worker that recovers the run honours it.
    """
    if dbos_names:
        dbos.refuse("@durable.workflow", dbos.WORKFLOW, dbos_names)
    _check_name(name)
    if max_recovery_attempts is not None and (
        not isinstance(max_recovery_attempts, int)
        or isinstance(max_recovery_attempts, bool)
        or not 1 <= max_recovery_attempts <= _MAX_INTEGER
    ):
        raise DefinitionError(
            f"max_recovery_attempts={max_recovery_attempts!r}: give a whole number from 1 to "
            f"{_MAX_INTEGER} (the crashes of its worker a workflow survives), or None for the "
            "Engine's"
        )
    if budget is not None and not isinstance(budget, Budget):
        raise DefinitionError(
            f"budget={budget!r}: give durable.Budget(dollars=..., tokens=..., steps=...)"
        )
    timeout_seconds = _timeout(timeout, "timeout")
    if version is not None and (not isinstance(version, str) or not version):
        raise DefinitionError(f"version={version!r}: a version must be a non-empty string")
    if durability is not None and durability not in _DURABILITY:
        raise DefinitionError(f"durability={durability!r}: use one of {', '.join(_DURABILITY)}")
    reg = registry if registry is not None else default_registry

    def decorate(f: Callable[P, R]) -> Callable[P, R]:
        unwrapped, rewrap, receiver = unwrap(f)
        func = _check_function(unwrapped, "workflow")
        check_parameters(func, name or default_name(func))
        defn = WorkflowDef(
            name=name or default_name(func),
            fn=func,
            version=version,
            durability=durability,
            timeout=timeout_seconds,
            budget=budget,
            max_recovery_attempts=max_recovery_attempts,
            receiver=receiver,
        )
        reg.add_workflow(defn)
        return rewrap(
            _wrap(func, _driver.call_workflow, _driver_async.call_workflow, defn, _WORKFLOW_ATTR)
        )

    return decorate(fn) if fn is not None else decorate


def workflow_def(fn: object) -> WorkflowDef:
    """The definition behind a decorated workflow function."""
    if isinstance(fn, WithOptions):  # the options would be dropped here: refuse them
        raise ConfigurationError(
            f"{fn!r}: the options of durable.with_options are taken by a start (engine.start, "
            "start_async, submit, an enqueue, durable.start_child); give the workflow "
            "itself here"
        )
    defn = getattr(fn, _WORKFLOW_ATTR, None)
    if not isinstance(defn, WorkflowDef):
        raise DefinitionError(
            f"{getattr(fn, '__qualname__', fn)!r} is not a workflow: decorate it with "
            "@durable.workflow()"
        )
    return defn


def workflow_call(fn: object, args: Sequence[Any]) -> tuple[WorkflowDef, Sequence[Any]]:
    """The definition behind `fn` and the arguments of its stored call: a bound method
    (`engine.start(obj.method, ...)`) passes its object, or class, first."""
    defn = workflow_def(fn)
    if inspect.ismethod(fn):
        return defn, (fn.__self__, *args)
    return defn, args


# -- @step ------------------------------------------------------------------------------------


@overload
def step(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def step(
    *,
    name: str | None = None,
    retries: int = 0,
    initial_delay: float = 0.1,
    backoff: float = 2.0,
    max_delay: float = 30.0,
    jitter: float = 0.1,
    retry_on: tuple[type[BaseException], ...] | type[BaseException] = Exception,
    timeout: float | dt.timedelta | None = None,
    heartbeat_timeout: float | dt.timedelta | None = None,
    registry: Registry | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def step(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    retries: int = 0,
    initial_delay: float = 0.1,
    backoff: float = 2.0,
    max_delay: float = 30.0,
    jitter: float = 0.1,
    retry_on: tuple[type[BaseException], ...] | type[BaseException] = Exception,
    timeout: float | dt.timedelta | None = None,
    heartbeat_timeout: float | dt.timedelta | None = None,
    registry: Registry | None = None,
    **dbos_names: Any,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a function a journaled step: inside a workflow its output is recorded once and
    replayed on resume. Outside a workflow it is an ordinary call.

    Steps run at least once: a crash after the step's work but before its record commits
    re-runs it on resume, so a step that changes the outside world should be idempotent
    (or an effect).

    An `async def` step is awaited by an async workflow. `timeout`: an attempt running
    longer is cancelled (async def) or given up (def: it runs in a worker thread, left to
    finish; its result is never recorded) and fails with StepTimeoutError, retried under
    the retry policy like any failed attempt. `heartbeat_timeout`: an attempt that goes
    that long without durable.heartbeat() is given up the same way (HeartbeatTimeoutError),
    in this process or, if the process is frozen or cut off, by another worker, which
    claims the workflow and runs the step again; durable.last_heartbeat() gives the next
    attempt the details of the last heartbeat.
    """
    if dbos_names:
        dbos.refuse("@durable.step", dbos.STEP, dbos_names)
    _check_name(name)
    policy = _retry_policy(retries, initial_delay, backoff, max_delay, jitter, retry_on)
    seconds = _timeout(timeout, "timeout")
    beat_seconds = _timeout(heartbeat_timeout, "heartbeat_timeout")
    reg = registry if registry is not None else default_registry

    def decorate(f: Callable[P, R]) -> Callable[P, R]:
        unwrapped, rewrap, receiver = unwrap(f)
        func = _check_function(unwrapped, "step")
        defn = StepDef(
            name=name or default_name(func),
            fn=func,
            retry=policy,
            timeout=seconds,
            heartbeat_timeout=beat_seconds,
            receiver=receiver,
        )
        reg.add_step(defn)
        return rewrap(_wrap(func, _driver.call_step, _driver_async.call_step, defn, _STEP_ATTR))

    return decorate(fn) if fn is not None else decorate


# -- @tool ------------------------------------------------------------------------------------


def tool(
    *,
    name: str | None = None,
    retries: int = 0,
    initial_delay: float = 0.1,
    retry_on: tuple[type[BaseException], ...] | type[BaseException] = Exception,
    timeout: float | dt.timedelta | None = None,
    registry: Registry | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a function an agent's tool: a step that also records its name, arguments,
    latency and cost (what it `durable.charge()`d) with its result, in one write.

    On replay the agent gets the frozen result, so a resumed agent sees exactly what it saw
    before the crash. `engine.client.tool_calls(workflow_id)` lists the calls. A tool that changes
    the outside world should be an @durable.effect instead (called from the tool, or on
    its own).
    """
    _check_name(name)
    policy = _retry_policy(retries, initial_delay, 2.0, 30.0, 0.1, retry_on)
    seconds = _timeout(timeout, "timeout")
    reg = registry if registry is not None else default_registry

    def decorate(f: Callable[P, R]) -> Callable[P, R]:
        unwrapped, rewrap, receiver = unwrap(f)
        func = _check_function(unwrapped, "tool")
        defn = StepDef(
            name=name or default_name(func),
            fn=func,
            kind=StepKind.TOOL,
            retry=policy,
            timeout=seconds,
            receiver=receiver,
        )
        reg.add_step(defn)
        return rewrap(_wrap(func, _driver.call_step, _driver_async.call_step, defn, _STEP_ATTR))

    return decorate


# -- @transaction -----------------------------------------------------------------------------

S = TypeVar("S")


class TransactionDecorator(Protocol):
    """What @transaction(...) returns, as a type checker sees it: the connection leaves
    the signature, after `self` (or `cls`) for a method."""

    @overload
    def __call__(self, fn: Callable[Concatenate[Connection, P], R], /) -> Callable[P, R]: ...
    @overload
    def __call__(
        self, fn: Callable[Concatenate[S, Connection, P], R], /
    ) -> Callable[Concatenate[S, P], R]: ...


def transaction(
    *,
    name: str | None = None,
    isolation_level: str | None = None,
    registry: Registry | None = None,
    **dbos_names: Never,
) -> TransactionDecorator:
    """Make a function a transactional step: it receives a SQLAlchemy Connection as its
    first argument, and its writes commit in the same transaction as its journal row.

    So the application's write happens exactly once: a crash before the commit leaves
    neither the write nor the record (the step runs again); after it, both (it replays).
    """
    if dbos_names:
        dbos.refuse("@durable.transaction", dbos.TRANSACTION, dbos_names)
    _check_name(name)
    if isolation_level is not None and isolation_level.upper() not in _ISOLATION:
        raise DefinitionError(
            f"isolation_level={isolation_level!r}: use one of {', '.join(_ISOLATION)}"
        )
    reg = registry if registry is not None else default_registry

    def decorate(f: Callable[Concatenate[Connection, P], R]) -> Callable[P, R]:
        unwrapped, rewrap, receiver = unwrap(f)
        func = _check_function(unwrapped, "transaction")
        # A method's (or classmethod's) connection follows its receiver.
        params = list(inspect.signature(func).parameters.values())
        params = params[1:] if receiver and len(params) > 1 else params
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise DefinitionError(
                f"@transaction function {func.__qualname__!r} must take the SQLAlchemy "
                "connection as its first positional parameter: def f(conn, ...)"
            )
        defn = StepDef(
            name=name or default_name(func),
            fn=func,
            kind=StepKind.TRANSACTION,
            isolation_level=isolation_level.upper() if isolation_level else None,
            receiver=receiver,
        )
        reg.add_step(defn)
        return rewrap(
            _wrap(func, _driver.call_transaction, _driver_async.call_transaction, defn, _STEP_ATTR)
        )

    return cast(TransactionDecorator, decorate)


# -- @effect ----------------------------------------------------------------------------------


def effect(
    *,
    reconcile: Callable[..., Any] | None = None,
    idempotent: bool = False,
    key: Callable[..., str] | None = None,
    requires_approval: bool = False,
    name: str | None = None,
    retries: int = 0,
    initial_delay: float = 0.1,
    backoff: float = 2.0,
    max_delay: float = 30.0,
    jitter: float = 0.1,
    retry_on: tuple[type[BaseException], ...] | type[BaseException] = Exception,
    registry: Registry | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a function an effect: a step that changes the outside world, run exactly once.

    The engine commits an intent row before the call, marks it pending right before the
    call and applied with the result in the step's journal transaction. The function gets
    `idempotency_key=<workflow_id>:<position>` (derived from the work, stable across
    replays) and must pass it to the vendor. After a crash between the call and its record,
    `reconcile(idempotency_key, *args, **kwargs)` asks the vendor what happened; without a
    reconcile function the effect must be `idempotent=True` (the vendor deduplicates keys).
    With `requires_approval=True` each call first waits at an approval gate named
    `<effect name>#<n>` (the n-th call in the workflow); a denial raises ApprovalDeniedError.
    """
    _check_name(name)
    if reconcile is None and not idempotent:
        raise DefinitionError(
            "an effect needs reconcile=<function> (to ask the outside world what happened to "
            "a key after a crash) or idempotent=True (the outside world deduplicates keys); "
            "without either a resumed run could not tell whether the call already happened"
        )
    if reconcile is not None and not callable(reconcile):
        raise DefinitionError(f"reconcile={reconcile!r}: give a function (key, *args) -> result")
    if key is not None and not callable(key):
        raise DefinitionError(f"key={key!r}: give a function of the call's arguments")
    policy = _retry_policy(retries, initial_delay, backoff, max_delay, jitter, retry_on)
    reg = registry if registry is not None else default_registry

    def decorate(f: Callable[P, R]) -> Callable[P, R]:
        unwrapped, rewrap, receiver = unwrap(f)
        func = _check_function(unwrapped, "effect")
        params = inspect.signature(func).parameters
        if "idempotency_key" not in params and not any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        ):
            raise DefinitionError(
                f"effect {func.__qualname__!r} must accept an `idempotency_key` keyword "
                "argument and pass it to the outside world: def f(..., *, idempotency_key)"
            )
        defn = StepDef(
            name=name or default_name(func),
            fn=func,
            kind=StepKind.EFFECT,
            retry=policy,
            receiver=receiver,
            effect=EffectOptions(
                reconcile=reconcile,
                idempotent=idempotent,
                key=key,
                requires_approval=requires_approval,
            ),
        )
        reg.add_step(defn)
        wrapper = _wrap(func, _driver.call_effect, _driver_async.call_effect, defn, _STEP_ATTR)

        def compensation(undo: Callable[..., Any]) -> Callable[..., Any]:
            """Register `undo` (itself an @effect) to run with this effect's arguments if the
            workflow fails after this effect was applied."""
            if not isinstance(getattr(undo, _STEP_ATTR, None), StepDef) or (
                getattr(undo, _STEP_ATTR).kind is not StepKind.EFFECT
            ):
                raise DefinitionError(
                    "a compensation must itself be an @durable.effect (it changes the outside "
                    "world, so it needs its own idempotency key)"
                )
            reg.set_compensation(defn.name, undo)
            return undo

        setattr(wrapper, "compensation", compensation)  # noqa: B010
        return rewrap(wrapper)

    return decorate
