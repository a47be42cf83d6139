"""An app whose spans are written to a file per process, for the OpenTelemetry crash test.

Importing it configures the OpenTelemetry SDK when DURABLE_TEST_SPANS_DIR is set: every
ended span is written at once (SimpleSpanProcessor) as one JSON line to
`<dir>/<pid>.jsonl`, so the spans of a process that is SIGKILLed later are on disk.

Usage: python -m tests.apps.traced_app run DATABASE_URL WORKFLOW_ID (sync|async)
starts the parent workflow under a "caller" span, as a web request would.
"""

from __future__ import annotations

import asyncio
import os
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import durable
from tests.apps.counter_app import World, setup

registry = durable.Registry()


def _configure() -> None:
    folder = os.environ.get("DURABLE_TEST_SPANS_DIR")
    if not folder:
        return
    out = open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a")

    def line(span: ReadableSpan) -> str:
        return span.to_json(indent=None) + "\n"

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=line)))
    trace.set_tracer_provider(provider)


_configure()


@durable.step(registry=registry, name="traced.step")
def work(workflow_id: str, label: str) -> str:
    World.record(workflow_id, label)
    return label


@durable.workflow(registry=registry, name="traced.child")
def child(workflow_id: str, /) -> str:
    return work(workflow_id, "c1")


@durable.workflow(registry=registry, name="traced.parent")
def parent(workflow_id: str, /) -> list[str]:
    done = [work(workflow_id, "s1"), work(workflow_id, "s2"), work(workflow_id, "s3")]
    done.append(child(f"{workflow_id}/child"))
    done.append(work(workflow_id, "s4"))
    return done


@durable.step(registry=registry, name="traced.step.async")
async def work_async(workflow_id: str, label: str) -> str:
    await asyncio.to_thread(World.record, workflow_id, label)
    return label


@durable.workflow(registry=registry, name="traced.child.async")
async def child_async(workflow_id: str, /) -> str:
    return await work_async(workflow_id, "c1")


@durable.workflow(registry=registry, name="traced.parent.async")
async def parent_async(workflow_id: str, /) -> list[str]:
    done = [await work_async(workflow_id, label) for label in ("s1", "s2", "s3")]
    done.append(await child_async(f"{workflow_id}/child"))
    done.append(await work_async(workflow_id, "s4"))
    return done


def main() -> None:
    _, url, workflow_id, driver = sys.argv[1:5]
    setup(url)
    tracer = trace.get_tracer("tests.traced_app")
    with tracer.start_as_current_span("caller") as caller:
        # The caller's own span never ends if this process is killed: say who it is.
        context = caller.get_span_context()
        print(f"{context.trace_id:032x} {context.span_id:016x}", flush=True)
        if driver == "async":

            async def go() -> None:
                async with durable.Engine(url, registry=registry, lease_seconds=1.0) as engine:
                    handle = await engine.start_async(
                        parent_async, workflow_id, workflow_id=workflow_id
                    )
                    await handle.result()

            asyncio.run(go())
        else:
            with durable.Engine(url, registry=registry, lease_seconds=1.0) as engine:
                engine.start(parent, workflow_id, workflow_id=workflow_id).result()


if __name__ == "__main__":
    main()
