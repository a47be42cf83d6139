"""Workflows that make a worker log each kind of event (see test_worker_logs.py)."""

from __future__ import annotations

import durable

registry = durable.Registry()


@durable.step(registry=registry, name="logs.a")
def a() -> str:
    return "a"


@durable.workflow(registry=registry, name="logs.steps")
def steps() -> str:
    return a()


@durable.workflow(registry=registry, name="logs.napper")
def napper() -> str:
    a()
    durable.sleep(1.5)  # long enough to suspend: the wake-up is a claim
    return a()


@durable.workflow(registry=registry, name="logs.fails")
def fails() -> str:
    raise ValueError("this workflow fails on purpose")


@durable.workflow(registry=registry, name="logs.gated")
def gated() -> bool:
    return durable.approval("ship").approved


# What a workflow may store and a worker then logs: escape sequences a terminal obeys.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x9b31m\r\u202e"


@durable.workflow(registry=registry, name="logs.hostile" + HOSTILE)
def hostile(text: str) -> str:
    raise ValueError("refused" + text)
