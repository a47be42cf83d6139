"""OpenTelemetry spans: one per workflow run, one per step attempt that really executes.

Tracing is on when `opentelemetry-api` is importable (the `durable[otel]` extra) and the
application has configured a tracer provider; otherwise every function here is a no-op that
costs a branch. Nothing is configured here: exporters, samplers and resources are the
application's (or `opentelemetry-instrument`'s) business.

Why the trace context is stored with the workflow: a workflow outlives the process that
started it. When it is created (start, submit, enqueue, a child, a fork, a schedule's tick)
a short `durable.start` span is emitted under whatever span is current, and its W3C context
is written to the workflow's row. Every run of the workflow - the first, one resumed after a
wait, one recovered by another worker after a crash - is a child of that span, so all of
them land in one trace, and a child workflow's runs nest under the parent run that started
it. A replayed step runs no code and emits no span: the journal, not the trace, is the
record of what happened before.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from durable._base.extras import extra
from durable.errors import WorkflowInterrupted, WorkflowSuspended

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - the otel extra is not installed
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from durable._core import Run, StepScope

__all__ = ["instrument_psycopg"]

_SCOPE = "durable"


@functools.cache
def _tracer() -> Any:
    """durable's tracer (a proxy: spans go to whatever provider the app sets, even later)."""
    from durable._base.version import __version__

    return trace.get_tracer(_SCOPE, __version__)


def _configured() -> bool:
    """Has the application installed a tracer provider (an SDK)? Until it does, spans are
    non-recording and only a context the caller already has is worth passing along."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def start_context(name: str, workflow_id: str) -> str | None:
    """The trace context to store with a workflow being created: that of a `durable.start`
    span, a child of the caller's current span. None when nothing is traced."""
    if trace is None:
        return None
    if not _configured():
        return current_context()
    span = _tracer().start_span(
        f"durable.start {name}",
        kind=SpanKind.PRODUCER,
        attributes={"durable.workflow.id": workflow_id, "durable.workflow.name": name},
    )
    try:
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
    finally:
        span.end()
    return json.dumps(carrier, sort_keys=True) if carrier else None


def current_context() -> str | None:
    """The caller's current trace context (a fork or a resume keeps no span of its own)."""
    if trace is None:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier, sort_keys=True) if carrier else None


@contextmanager
def run_span(run: Run) -> Iterator[None]:
    """The span of one run of a workflow, current while its code runs (the application's
    own spans nest inside it). A suspension or a stop ends it without an error."""
    if trace is None or not _configured():
        yield
        return
    parent = None
    if run.trace_context:
        try:
            parent = propagate.extract(json.loads(run.trace_context))
        except (ValueError, TypeError, AttributeError):
            parent = None  # an unreadable stored context: a trace of its own
    span = _tracer().start_span(
        f"durable.workflow {run.name}",
        context=parent,
        kind=SpanKind.CONSUMER if run.epoch > 1 else SpanKind.INTERNAL,
        attributes={
            "durable.workflow.id": run.workflow_id,
            "durable.workflow.name": run.name,
            "durable.durability": run.mode,
            "durable.executor.id": run.settings.executor_id,
            "durable.run.epoch": run.epoch,
            "durable.run.replaying": not run.journal.is_fresh,
        },
    )
    if not span.is_recording():
        span.end()
        yield
        return
    run.traced = True
    with trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        try:
            yield
        except WorkflowSuspended:
            span.set_attribute("durable.run.outcome", "suspended")
            raise
        except WorkflowInterrupted as stop:
            span.set_attribute("durable.run.outcome", f"interrupted: {stop.reason}")
            raise
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}"))
            raise


def _ignore(error: BaseException | None) -> None:
    return None


@contextmanager
def _step_span(run: Run, scope: StepScope) -> Iterator[Callable[[BaseException | None], None]]:
    span = _tracer().start_span(
        f"durable.{scope.kind} {scope.name}",
        attributes={
            "durable.workflow.id": run.workflow_id,
            "durable.workflow.name": run.name,
            "durable.step.position": scope.seq,
            "durable.step.name": scope.name,
            "durable.step.kind": scope.kind,
            "durable.step.attempt": scope.attempt,
            "durable.durability": run.mode,
            "durable.executor.id": run.settings.executor_id,
        },
    )

    def done(error: BaseException | None) -> None:
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))

    with trace.use_span(span, end_on_exit=True):
        yield done


class _Untraced:
    """What step_span gives when the run is not traced: a context manager doing nothing."""

    def __enter__(self) -> Callable[[BaseException | None], None]:
        return _ignore

    def __exit__(self, *exc: object) -> None:
        return None


_UNTRACED = _Untraced()


def step_span(
    run: Run | None, scope: StepScope | None
) -> AbstractContextManager[Callable[[BaseException | None], None]]:
    """A span around one attempt of a step, transaction, tool or effect whose code runs now
    (`done(error)` marks a failed attempt). Code that is not a journaled position (the
    workflow's body, a compensation, a reconcile) gets none of its own."""
    if run is None or not run.traced or scope is None or scope.seq < 0:
        return _UNTRACED
    return _step_span(run, scope)


def instrument_psycopg(**options: Any) -> None:
    """Turn on OpenTelemetry's psycopg instrumentation (package
    `opentelemetry-instrumentation-psycopg`), so every statement durable runs is a span
    under the step or run that ran it. Call it before the Engine or Client opens its pools:
    connections opened earlier are not instrumented."""
    with extra("otel"):
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    instrumentor = PsycopgInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(**options)
