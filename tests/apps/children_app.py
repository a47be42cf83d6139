"""Parents that start a child from workflow code, for the crash tests of those starts.

`children.parent(how)` starts `children.kid` one way (`how`: durable.start_child, a
Client's submit, a queue's enqueue), notes the id it got, and returns it; with `how`
"submit quiet" it submits `children.quiet` (a workflow with no step), with "trigger" it
triggers schedule `children.yearly` (`children.tick`, no step either), so that the first
step a worker reaches is the parent's note, after the start. The crash point
`after_child_start` lies between the child's row and the parent's journal row of the start.
Every run of a child's step is recorded in the `world` table (tests.apps.counter_app).
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import durable
from tests.apps.counter_app import World

registry = durable.Registry()
kids = durable.Queue("children.kids", registry=registry)
_clients: list[durable.Client] = []


def _client() -> durable.Client:
    """A Client of the worker's database, made once per process (a Client's calls from
    workflow code are journaled like the engine's)."""
    if not _clients:
        client = durable.Client(os.environ["DURABLE_DATABASE_URL"])
        client.connect()
        _clients.append(client)
    return _clients[0]


@durable.step(registry=registry, name="children.note")
def note(workflow_id: str, what: str) -> None:
    World.record(workflow_id, what)


@durable.workflow(registry=registry, name="children.kid")
def kid(n: int) -> int:
    note(durable.workflow_id(), "kid ran")
    return n


@durable.workflow(registry=registry, name="children.quiet")
def quiet(n: int) -> int:
    return n


@durable.scheduled("0 0 1 1 *", name="children.yearly", registry=registry)
@durable.workflow(registry=registry, name="children.tick")
def tick(at: dt.datetime) -> str:
    return at.isoformat()


@durable.workflow(registry=registry, name="children.parent")
def parent(how: str) -> str:
    started: Any
    if how == "start_child":
        started = durable.start_child(kid, 1)
    elif how == "submit":
        started = _client().submit(kid, 1)
    elif how == "submit quiet":
        started = _client().submit(quiet, 1)
    elif how == "trigger":
        started = _client().trigger_schedule("children.yearly", registry=registry)
    else:
        started = kids.enqueue(kid, 1)
    note(durable.workflow_id(), f"started {started.workflow_id}")
    return str(started.workflow_id)
