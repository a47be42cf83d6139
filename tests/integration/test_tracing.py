"""OpenTelemetry spans in one process, recorded by the SDK's in-memory exporter.

The tracer provider is process-wide and can be set once, so it is set here with a sampler
that records only while a test holds the `spans` fixture: the rest of the suite runs
untraced, as an application without the SDK does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import StatusCode
from sqlalchemy import Connection, text

import durable
from tests.integration.test_client import wait_for


class _Switch(Sampler):
    on = False

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if not self.on:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "on while a test records"


_SWITCH = _Switch()
_EXPORTER = InMemorySpanExporter()
_LOCK = threading.Lock()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with _LOCK:
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            provider = TracerProvider(sampler=_SWITCH)
            provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
            trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    _SWITCH.on = True
    try:
        yield _EXPORTER
    finally:
        _SWITCH.on = False
        _EXPORTER.clear()


def _named(found: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in found if s.name.startswith(prefix)]


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_each_attempt_of_a_step_is_a_span_with_durable_attributes(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    reg = durable.Registry()
    failures = [1]

    @durable.step(registry=reg, name="flaky", retries=2, initial_delay=0.0)
    def flaky(x: int) -> int:
        if failures:
            failures.pop()
            raise ValueError("first attempt fails")
        return x * 2

    @durable.workflow(registry=reg, name="doubler")
    def doubler(x: int) -> int:
        return flaky(x) + 1

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(doubler, 20, workflow_id="w-attempts").result(timeout=10) == 41
        executor = engine.executor_id

    found = spans.get_finished_spans()
    first, second = _named(found, "durable.step flaky")
    assert [_attrs(s)["durable.step.attempt"] for s in (first, second)] == [1, 2]
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert second.status.status_code is StatusCode.UNSET
    assert _attrs(second) == {
        "durable.workflow.id": "w-attempts",
        "durable.workflow.name": "doubler",
        "durable.step.position": 0,
        "durable.step.name": "flaky",
        "durable.step.kind": "step",
        "durable.step.attempt": 2,
        "durable.durability": "sync",
        "durable.executor.id": executor,
    }
    (run,) = _named(found, "durable.workflow doubler")
    assert first.parent is not None and first.parent.span_id == run.context.span_id
    (start,) = _named(found, "durable.start doubler")
    assert run.parent is not None and run.parent.span_id == start.context.span_id


def test_transactions_effects_and_tools_have_their_kind(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    reg = durable.Registry()

    @durable.transaction(registry=reg, name="write")
    def write(conn: Connection, n: int) -> int:
        return int(conn.execute(text("SELECT :n + 1"), {"n": n}).scalar_one())

    @durable.effect(registry=reg, name="pay", idempotent=True)
    def pay(cents: int, *, idempotency_key: str) -> str:
        return idempotency_key

    @durable.tool(registry=reg, name="search")
    def search(query: str) -> str:
        return query.upper()

    @durable.workflow(registry=reg, name="mixed")
    def mixed() -> list[Any]:
        return [write(1), pay(5), search("q")]

    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(mixed, workflow_id="w-kinds").result(timeout=10)

    found = spans.get_finished_spans()
    kinds = {
        _attrs(s)["durable.step.name"]: (_attrs(s)["durable.step.kind"], s.name)
        for s in found
        if "durable.step.kind" in _attrs(s)
    }
    assert kinds == {
        "write": ("transaction", "durable.transaction write"),
        "pay": ("effect", "durable.effect pay"),
        "search": ("tool", "durable.tool search"),
    }


def test_a_run_resumed_after_a_wait_replays_without_spans_in_the_same_trace(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg, name="note")
    def note(label: str) -> str:
        return label

    @durable.workflow(registry=reg, name="waiter")
    def waiter() -> list[str]:
        first = note("before")
        message = durable.recv("go", timeout=30)
        return [first, message, note("after")]

    tracer = trace.get_tracer("test")
    with durable.Engine(database_url, registry=reg) as engine:
        with tracer.start_as_current_span("request") as request:
            handle = engine.start(waiter, workflow_id="w-wait")
        # The message after the run suspended in recv (sent sooner, it is there at the first
        # look, and the run never suspends).
        wait_for(lambda: engine.client.get_workflow("w-wait").status == "SUSPENDED", what="wait")
        engine.send("w-wait", "now", topic="go")
        assert handle.result(timeout=20) == ["before", "now", "after"]
        journaled = [r.step_seq for r in engine.steps("w-wait") if r.step_name == "note"]

    found = spans.get_finished_spans()
    assert [_attrs(s)["durable.step.name"] for s in _named(found, "durable.step ")] == [
        "note",
        "note",
    ]
    assert [_attrs(s)["durable.step.position"] for s in _named(found, "durable.step ")] == journaled
    runs = _named(found, "durable.workflow waiter")
    assert len(runs) == 2
    assert _attrs(runs[0])["durable.run.outcome"] == "suspended"
    assert _attrs(runs[1])["durable.run.replaying"] is True
    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for s in found if s.name.startswith("durable.")} == {trace_id}


def test_a_queued_workflow_joins_the_trace_of_whoever_enqueued_it(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    reg = durable.Registry()
    jobs = durable.Queue("traced.jobs", registry=reg)

    @durable.step(registry=reg, name="job.step")
    def job_step(n: int) -> int:
        return n + 1

    @durable.workflow(registry=reg, name="job")
    def job(n: int) -> int:
        return job_step(n)

    tracer = trace.get_tracer("test")
    with durable.Client(database_url) as client:
        with tracer.start_as_current_span("enqueuer") as enqueuer:
            client.enqueue(jobs, job, 1, workflow_id="w-queued")
    with durable.Engine(database_url, registry=reg, worker=True) as engine:
        assert engine.retrieve("w-queued").result(timeout=20) == 2

    found = spans.get_finished_spans()
    (step,) = _named(found, "durable.step job.step")
    assert step.context.trace_id == enqueuer.get_span_context().trace_id
    (start,) = _named(found, "durable.start job")
    assert start.parent is not None
    assert start.parent.span_id == enqueuer.get_span_context().span_id


def test_psycopg_instrumentation_puts_statements_under_the_steps(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    reg = durable.Registry()

    @durable.step(registry=reg, name="query")
    def query() -> int:
        with psycopg.connect(database_url) as conn:
            row = conn.execute("SELECT 42").fetchone()
        assert row is not None
        return int(row[0])

    @durable.workflow(registry=reg, name="querier")
    def querier() -> int:
        return query()

    # OpenTelemetry's uninstrument puts back `connect` bound to psycopg's own classes, so
    # that a subclass's (durable's pools' BoundedConnection) would make a plain connection
    # afterwards in this process: the originals are put back as they were.
    saved = {cls: cls.__dict__["connect"] for cls in (psycopg.Connection, psycopg.AsyncConnection)}
    durable.instrument_psycopg()
    try:
        with durable.Engine(database_url, registry=reg) as engine:
            assert engine.start(querier, workflow_id="w-sql").result(timeout=10) == 42
    finally:
        PsycopgInstrumentor().uninstrument()
        for cls, connect in saved.items():
            cls.connect = connect

    found = spans.get_finished_spans()
    (step,) = _named(found, "durable.step query")
    (run,) = _named(found, "durable.workflow querier")
    database = [s for s in found if _attrs(s).get("db.system") == "postgresql"]
    children_of = {s.parent.span_id: s for s in database if s.parent is not None}
    assert step.context.span_id in children_of  # the step's own SELECT 42
    assert run.context.span_id in children_of  # durable's journal writes for the run
