"""The options of a start (`workflow_id=`, `timeout=`, `attributes=`, `conn=`, and for a
queue `dedup_key=`, `priority=`, `delay=`, `partition_key=`): typed, and never confused with
the workflow's own arguments.

Python's typing cannot put keyword parameters after `*args: P.args` (PEP 612), so a start
typed as `start(fn, *args, workflow_id=..., **kwargs)` cannot check both the options and
the arguments. The options therefore travel with the function: `engine.start(
durable.with_options(fn, workflow_id="a"), *args, **kwargs)`, where `with_options` returns
`fn`'s own type, so the start's first overloads check the arguments against `fn` and type
the handle's result() by what `fn` returns. The keyword form (`engine.start(fn, *args,
workflow_id="a")`) still works, through overloads that check each option and take the
arguments as given. It is deprecated in the types only (`@deprecated` on those overloads,
which mypy does not report for these calls); at run time it warns nobody, being the form
every existing program (and test) uses.

So that an option never swallows an argument of the same name, a workflow may not have a
parameter that can be passed by keyword under an option's name: `@workflow` refuses it.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar, cast

from durable._run.dbos_names import refuse_start_options
from durable._run.start_typing import (
    Enqueue,
    EnqueueAsync,
    QueueEnqueue,
    Seconds,
    Start,
    StartAsync,
)
from durable.errors import ConfigurationError, DefinitionError, InvalidWaitError

P = ParamSpec("P")
R = TypeVar("R")

#: The keywords a start (start, start_async, submit) takes for itself.
START_OPTIONS = ("workflow_id", "attributes", "conn")
#: The keywords an enqueue takes for itself.
ENQUEUE_OPTIONS = (
    "workflow_id",
    "dedup_key",
    "priority",
    "delay",
    "partition_key",
    "attributes",
    "conn",
)
#: Names a workflow's keyword-passable parameters may not have: the options above, and
#: those reserved for starts (a per-call `timeout`).
RESERVED = frozenset((*START_OPTIONS, *ENQUEUE_OPTIONS, "timeout"))


#: The longest duration an option takes (`timeout=`, `delay=`): 100 years, as for waits.
MAX_SECONDS = 100 * 365.25 * 86400
#: The range of `priority=`: the queue's `priority` column is a PostgreSQL integer.
PRIORITY_RANGE = (-(2**31), 2**31 - 1)


def _seconds(value: object) -> float:
    """A duration option's seconds: an int or a float (not a bool, not a string a float()
    would read), or a datetime.timedelta; NaN for anything else, which no range takes."""
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an int past a float's range
            return math.inf
    return math.nan


def check_timeout(value: object) -> float:
    """`timeout=` of a start (or durable.workflow_timeout): seconds, more than zero and at
    most MAX_SECONDS, as a number or a timedelta (InvalidWaitError)."""
    seconds = _seconds(value)
    if not 0 < seconds <= MAX_SECONDS:
        raise InvalidWaitError(
            f"timeout={value!r}: give a workflow timeout of more than zero seconds, at most "
            "100 years (a number or a datetime.timedelta)"
        )
    return seconds


def check_delay(value: object) -> None:
    """`delay=` of an enqueue: zero or more seconds, at most MAX_SECONDS, as a number
    (InvalidWaitError)."""
    if value is None:
        return
    if isinstance(value, dt.timedelta) or not 0 <= _seconds(value) <= MAX_SECONDS:
        raise InvalidWaitError(
            f"delay={value!r}: give zero or more seconds as a number (at most {MAX_SECONDS:.0f})"
        )


def check_priority(value: object) -> None:
    """`priority=` of an enqueue: an int the queue's column holds (ConfigurationError), not
    a value that PostgreSQL would refuse with `integer out of range` once sent."""
    if value is None:
        return
    low, high = PRIORITY_RANGE
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigurationError(
            f"priority={value!r}: give an integer from {low} to {high} (lower runs first)"
        )


def check_parameters(fn: Callable[..., Any], name: str) -> None:
    """Refuse a workflow whose parameter a start option would take: `engine.start(fn,
    workflow_id="a")` would start workflow "a" with the parameter missing."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: nothing to check
        return
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    for param in params:
        if param.kind in keyword and param.name in RESERVED:
            raise DefinitionError(
                f"workflow {name!r} has a parameter named {param.name!r}, which is also an "
                f"option of engine.start/submit/enqueue ({param.name}=...): a start would "
                f"take it as the option, not as this workflow's argument. Rename the "
                f"parameter, or make it positional-only (`def {fn.__name__}(..., "
                f"{param.name}, /, ...)`); inside the workflow, durable.workflow_id() "
                "gives the run's own id"
            )


# -- options on the function: durable.with_options ------------------------------------------

#: Every option with_options takes (a start refuses an enqueue's).
WITH_OPTIONS = frozenset((*START_OPTIONS, *ENQUEUE_OPTIONS, "timeout"))


class WithOptions:
    """A workflow and the options of its next start (what durable.with_options returns):
    each start, submit or enqueue takes it in place of the function."""

    __slots__ = ("fn", "options")
    fn: Callable[..., Any]
    options: dict[str, Any]

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        if isinstance(fn, WithOptions):  # with_options(with_options(fn, a=1), b=2)
            twice = sorted(set(fn.options) & set(options))
            if twice:
                raise ConfigurationError(
                    f"with_options: {', '.join(twice)} given twice: give each option once"
                )
            options = {**fn.options, **options}
            fn = fn.fn
        self.fn = fn
        self.options = options

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigurationError(
            "a workflow with options (durable.with_options) is started, not called: pass it "
            "to engine.start, engine.submit or an enqueue, as engine.start(with_options(fn, "
            "workflow_id=...), *args)"
        )

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"with_options({getattr(self.fn, '__qualname__', self.fn)}, {given})"


def with_options(
    fn: Callable[P, R],
    /,
    *,
    workflow_id: str | None = None,
    timeout: Seconds | None = None,
    attributes: Mapping[str, Any] | None = None,
    conn: Any = None,
    dedup_key: str | None = None,
    priority: int | None = None,
    delay: float | None = None,
    partition_key: str | None = None,
) -> Callable[P, R]:
    """`fn` with the options of a start, for `engine.start(with_options(fn,
    workflow_id="a"), *args, **kwargs)`: the type checker still checks the arguments
    against `fn`'s signature, and the handle's result() is typed by its return type (the
    options given as keywords of the start are checked one by one, the arguments not).

    The options are those of the start it goes to: `workflow_id=`, `timeout=`,
    `attributes=` and `conn=` for start, start_async and submit; an enqueue's take also
    `dedup_key=`, `priority=`, `delay=` and `partition_key=` (a start refuses them). An
    option given None is not given. The value is only passed to a start (calling it raises
    ConfigurationError); each start checks the options as it does its keywords."""
    given = {
        "workflow_id": workflow_id,
        "timeout": timeout,
        "attributes": attributes,
        "conn": conn,
        "dedup_key": dedup_key,
        "priority": priority,
        "delay": delay,
        "partition_key": partition_key,
    }
    options = {name: value for name, value in given.items() if value is not None}
    return cast("Callable[P, R]", WithOptions(fn, options))


def options_target(fn: object) -> object:
    """The workflow a `with_options(fn, ...)` carries (durable.start_child reads its
    definition before the start takes the options); anything else as it is."""
    return fn.fn if isinstance(fn, WithOptions) else fn


def take_options(
    where: str, fn: Callable[..., Any], kwargs: dict[str, Any], allowed: frozenset[str]
) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The function a start runs and its keywords, the options of a `with_options(fn,
    ...)` among them (ConfigurationError for one the start does not take or that is also
    given as a keyword); DBOSNameError for a keyword named like DBOS's start options."""
    if isinstance(fn, WithOptions):
        for name in fn.options:
            if name not in allowed:
                raise ConfigurationError(
                    f"{where}: {name}= is an option of an enqueue, not of a start: "
                    f"durable.Queue(...).enqueue(with_options(fn, {name}=...), ...)"
                )
            if name in kwargs:
                raise ConfigurationError(
                    f"{where}: {name}= given both in with_options and as a keyword: give it once"
                )
        kwargs = {**kwargs, **fn.options}
        fn = fn.fn
    refuse_start_options(where, fn, kwargs)
    return fn, kwargs


_START = frozenset((*START_OPTIONS, "timeout"))
_ENQUEUE = frozenset((*ENQUEUE_OPTIONS, "timeout"))


def _taking(method: Callable[..., Any], before: int, allowed: frozenset[str]) -> Any:
    """`method` taking a WithOptions as its workflow (after `before` other positional
    arguments), awaited if `method` is."""
    where = f"{method.__name__}()"

    def split(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if len(args) <= before + 1:  # (self, [queue,] fn): let the method say what is missing
            return args, kwargs
        fn, kwargs = take_options(where, args[before + 1], kwargs, allowed)
        return (*args[: before + 1], fn, *args[before + 2 :]), kwargs

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def awaited(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = split(args, kwargs)
            return await method(*args, **kwargs)

        return awaited

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = split(args, kwargs)
        return method(*args, **kwargs)

    return call


# The typed views of the methods that start: each decorates the method it types (which
# keeps its own runtime signature, keyword-only options included, and its docstring) and
# makes it take a `with_options(fn, ...)` in place of `fn`. The `_async` ones type an
# awaited method (the sync twins are generated from the async source: their names pair).


def start_method(fn: Callable[..., Any]) -> Start:
    return cast("Start", _taking(fn, 0, _START))


def start_method_async(fn: Callable[..., Any]) -> StartAsync:
    return cast("StartAsync", _taking(fn, 0, _START))


def enqueue_method(fn: Callable[..., Any]) -> Enqueue:
    return cast("Enqueue", _taking(fn, 1, _ENQUEUE))


def enqueue_method_async(fn: Callable[..., Any]) -> EnqueueAsync:
    return cast("EnqueueAsync", _taking(fn, 1, _ENQUEUE))


def queue_enqueue_method(fn: Callable[..., Any]) -> QueueEnqueue:
    return cast("QueueEnqueue", _taking(fn, 0, _ENQUEUE))
