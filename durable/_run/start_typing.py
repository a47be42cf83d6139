# mypy: disable-error-code="overload-cannot-match, overload-overlap"
# (mypy takes `*args: P.args, **kwargs: P.kwargs` as broader than any keyword option;
# it is not: the first overload fails for a function without that parameter. And it takes
# the overload of an `async def` workflow, whose handle gives what the coroutine returns,
# as overlapping the one of a plain def: it comes first, so it is the one that matches.)
"""The types of the calls that start a workflow (see start_options): one Protocol per
call, whose first overloads check the workflow's arguments against its signature and type
the handle by its return type; the others, the deprecated keyword form of the options,
check each option and take the arguments as given."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from durable._run.handles import AsyncWorkflowHandle, WorkflowHandle
else:

    def deprecated(message: str) -> Any:
        """typing_extensions.deprecated for type checkers only: the keyword form of the
        options warns nobody at run time (it is the form existing programs use)."""
        return lambda fn: fn


P = ParamSpec("P")

#: A per-call timeout (`timeout=`, popped by each start from its keyword arguments and
#: checked there): seconds or a timedelta.
Seconds = float | dt.timedelta


class QueueLike(Protocol):
    """What an enqueue's typing asks of its queue (a durable.Queue; checked when called)."""

    @property
    def name(self) -> str: ...


#: What a type checker says of the keyword form of a start's options.
KEYWORD_FORM = (
    "a start's options given as keywords turn off the check of the workflow's arguments: "
    "pass them with durable.with_options(fn, workflow_id=...) instead"
)

#: The result type of a workflow, as its handle gives it.
R = TypeVar("R")


class Start(Protocol):
    """`start(fn, *args, **kwargs)` (its options by durable.with_options): Engine.start,
    Engine.submit and Client.submit. The handle's result() is typed by `fn`'s return type."""

    @overload
    def __call__(
        self,
        fn: Callable[P, Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> WorkflowHandle[R]: ...
    @overload
    def __call__(
        self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowHandle[R]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...


class StartAsync(Protocol):
    """`await start_async(fn, *args, **kwargs)`: Engine.start_async (an
    AsyncWorkflowHandle typed by `fn`'s return type)."""

    @overload
    def __call__(
        self,
        fn: Callable[P, Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Awaitable[AsyncWorkflowHandle[R]]: ...
    @overload
    def __call__(
        self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[AsyncWorkflowHandle[R]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        timeout: Seconds | None = None,
        attributes: Mapping[str, Any] | None,
        conn: Any = None,
        **kwargs: Any,
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...


class Enqueue(Protocol):
    """`enqueue(queue, fn, *args, **kwargs)` (its options by durable.with_options):
    Engine.enqueue and Client.enqueue."""

    @overload
    def __call__(
        self,
        queue: QueueLike,
        fn: Callable[P, Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> WorkflowHandle[R]: ...
    @overload
    def __call__(
        self, queue: QueueLike, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowHandle[R]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
        attributes: Mapping[str, Any] | None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...


class EnqueueAsync(Protocol):
    """`await enqueue_async(queue, fn, *args, **kwargs)`: Engine.enqueue_async and
    Client.enqueue_async."""

    @overload
    def __call__(
        self,
        queue: QueueLike,
        fn: Callable[P, Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Awaitable[AsyncWorkflowHandle[R]]: ...
    @overload
    def __call__(
        self, queue: QueueLike, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[AsyncWorkflowHandle[R]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
        attributes: Mapping[str, Any] | None,
        conn: Any = None,
        **kwargs: Any,
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> Awaitable[AsyncWorkflowHandle[Any]]: ...


class QueueEnqueue(Protocol):
    """`queue.enqueue(fn, *args, **kwargs)` (its options by durable.with_options)."""

    @overload
    def __call__(
        self,
        fn: Callable[P, Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> WorkflowHandle[R]: ...
    @overload
    def __call__(
        self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowHandle[R]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
        attributes: Mapping[str, Any] | None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle[Any]: ...
    @overload
    @deprecated(KEYWORD_FORM)
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
    ) -> WorkflowHandle[Any]: ...
