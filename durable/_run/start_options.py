# mypy: disable-error-code="overload-cannot-match"
# (mypy takes `*args: P.args, **kwargs: P.kwargs` as broader than any keyword option;
# it is not: the first overload fails for a function without that parameter.)
"""The options of a start (`workflow_id=`, `timeout=`, `attributes=`, `conn=`, and for a
queue `dedup_key=`, `priority=`, `delay=`, `partition_key=`): keyword-only, typed, and never
confused with the workflow's own arguments.

A start takes the workflow's arguments and its own options in one call, as
`engine.start(fn, *args, workflow_id="a", **kwargs)`. Python's typing cannot put keyword
parameters after `*args: P.args` (PEP 612), so each start is typed by a Protocol with
overloads: the first checks the workflow's arguments against `fn` when no option is given;
the others, chosen when one is, check each option's type and take the arguments as given.
So that an option never swallows an argument of the same name, a workflow may not have a
parameter that can be passed by keyword under an option's name: `@workflow` refuses it.
"""

from __future__ import annotations

import datetime as dt
import inspect
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast, overload

from durable.errors import ConfigurationError, DefinitionError, InvalidWaitError

if TYPE_CHECKING:
    from durable._run.handles import WorkflowHandle

P = ParamSpec("P")

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


H = TypeVar("H", covariant=True)

#: A per-call timeout (`timeout=`, popped by each start from its keyword arguments and
#: checked there): seconds or a timedelta.
Seconds = float | dt.timedelta


class QueueLike(Protocol):
    """What an enqueue's typing asks of its queue (a durable.Queue; checked when called)."""

    @property
    def name(self) -> str: ...


class Start(Protocol[H]):
    """`start(fn, *args, workflow_id=None, **kwargs)`: Engine.start and Client.submit
    (`Start[WorkflowHandle]`), Engine.start_async (`Start[Awaitable[AsyncWorkflowHandle]]`)."""

    @overload
    def __call__(self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> H: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> H: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        timeout: Seconds | None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> H: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any],
        conn: Any = None,
        **kwargs: Any,
    ) -> H: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any,
        **kwargs: Any,
    ) -> H: ...


class Enqueue(Protocol[H]):
    """`enqueue(queue, fn, *args, workflow_id=, dedup_key=, priority=, delay=,
    partition_key=, **kwargs)`: Engine.enqueue and Client.enqueue (`Enqueue[WorkflowHandle]`),
    and their `_async` twins (`Enqueue[Awaitable[AsyncWorkflowHandle]]`)."""

    @overload
    def __call__(
        self, queue: QueueLike, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> H: ...
    @overload
    def __call__(
        self,
        queue: QueueLike,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> H: ...
    @overload
    def __call__(
        self,
        queue: QueueLike,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> H: ...
    @overload
    def __call__(
        self,
        queue: QueueLike,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> H: ...
    @overload
    def __call__(
        self,
        queue: QueueLike,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> H: ...
    @overload
    def __call__(
        self,
        queue: QueueLike,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> H: ...
    @overload
    def __call__(
        self,
        queue: QueueLike,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> H: ...
    @overload
    def __call__(
        self,
        queue: QueueLike,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any],
        conn: Any = None,
        **kwargs: Any,
    ) -> H: ...
    @overload
    def __call__(
        self,
        queue: QueueLike,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any,
        **kwargs: Any,
    ) -> H: ...


class QueueEnqueue(Protocol):
    """`queue.enqueue(fn, *args, workflow_id=, dedup_key=, priority=, delay=, partition_key=,
    **kwargs)`."""

    @overload
    def __call__(
        self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowHandle: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any],
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle: ...
    @overload
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Any,
        **kwargs: Any,
    ) -> WorkflowHandle: ...


# The typed views of the methods that start: each decorates the method it types, which
# keeps its own (runtime) signature, keyword-only options included, and its docstring. The
# handle a view returns is the method's: `Start[WorkflowHandle]` for a plain one,
# `Start[Awaitable[AsyncWorkflowHandle]]` for an awaited one (so one view serves both).

T = TypeVar("T")


def start_method(fn: Callable[..., T]) -> Start[T]:
    return cast("Start[T]", fn)


def enqueue_method(fn: Callable[..., T]) -> Enqueue[T]:
    return cast("Enqueue[T]", fn)


def queue_enqueue_method(fn: Callable[..., WorkflowHandle]) -> QueueEnqueue:
    return cast("QueueEnqueue", fn)
