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


@durable.workflow(registry=registry, name="logs.fails")
def fails() -> str:
    raise ValueError("this workflow fails on purpose")


@durable.workflow(registry=registry, name="logs.gated")
def gated() -> bool:
    return durable.approval("ship").approved
