"""An app for tests/acceptance/test_async_loop_faults.py, run by `durable worker`.

Run it as `durable worker --app tests.apps.loop_faults_app:engine`: one-second leases, and
a workflow is given up after two recoveries. Every async workflow here runs on the
worker's own event loop. Step calls are recorded in the `world` table
(tests/apps/counter_app.py) with the pid of the process that made them, outside durable.

- `exiting` raises SystemExit or KeyboardInterrupt from an async step, either in the
  workflow's own task or in a branch of an asyncio.gather (a task of its own).
- `napping` is harmless: it records "nap-start", sleeps, records "nap-end".
- `breaking` breaks the event loop itself, once (the first time it runs anywhere), when the
  test records "go" for it: the loop's next iteration raises, as a bug in asyncio or in
  durable's loop code would.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

import durable
from tests.apps import counter_app
from tests.apps.counter_app import World

registry = durable.Registry()

MAX_RECOVERY_ATTEMPTS = 2

# The URL comes from DURABLE_DATABASE_URL when `durable worker` launches it.
engine = durable.Engine(
    registry=registry,
    max_recovery_attempts=MAX_RECOVERY_ATTEMPTS,
    lease_seconds=1.0,
    poll_interval=0.1,
    max_workers=4,
)

EXITS: dict[str, type[BaseException]] = {
    "SystemExit": SystemExit,
    "KeyboardInterrupt": KeyboardInterrupt,
}


def setup(url: str) -> None:
    counter_app.setup(url)  # the world table


async def record(workflow_id: str, what: str) -> int:
    """Record `what` in the world (in a thread: the loop is not blocked); returns how many
    times it was recorded before."""
    return await asyncio.to_thread(_record, workflow_id, what)


def _record(workflow_id: str, what: str) -> int:
    url = World.url or os.environ["DURABLE_DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM world WHERE workflow_id = %s AND what = %s", [workflow_id, what]
        ).fetchone()
        conn.execute(
            "INSERT INTO world (workflow_id, what, pid) VALUES (%s, %s, %s)",
            [workflow_id, what, os.getpid()],
        )
    assert row is not None
    return int(row[0])


@durable.step(registry=registry, name="loop_faults.exit_step")
async def exit_step(workflow_id: str, kind: str, fail_times: int) -> int:
    """Raises `kind` on its first `fail_times` calls (counted in the world), then returns."""
    done = await record(workflow_id, "exit-step")
    await asyncio.sleep(0)
    if done < fail_times:
        raise EXITS[kind]()
    return done + 1


@durable.step(registry=registry, name="loop_faults.note")
async def note(workflow_id: str, what: str) -> str:
    await record(workflow_id, what)
    return what


@durable.workflow(registry=registry, name="loop_faults.exiting")
async def exiting(workflow_id: str, /, kind: str, fail_times: int, gathered: bool) -> int:
    if gathered:
        # The exit is raised in a task of its own (a branch of the gather).
        n, _ = await asyncio.gather(
            exit_step(workflow_id, kind, fail_times), note(workflow_id, "beside-exit")
        )
    else:
        n = await exit_step(workflow_id, kind, fail_times)
    await note(workflow_id, "after-exit")
    return n


@durable.step(registry=registry, name="loop_faults.nap_step")
async def nap_step(workflow_id: str, seconds: float, until_woken: bool = False) -> str:
    """Sleeps `seconds`; with `until_woken`, at most that long, until the test records
    "wake" for the workflow (so that the nap lasts as long as the test needs it to,
    however slowly the machine starts the processes around it)."""
    await record(workflow_id, "nap-start")
    if until_woken:
        deadline = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < deadline:
            if await asyncio.to_thread(_recorded, workflow_id, "wake"):
                break
            await asyncio.sleep(0.05)
    else:
        await asyncio.sleep(seconds)
    await record(workflow_id, "nap-end")
    return "rested"


@durable.workflow(registry=registry, name="loop_faults.napping")
async def napping(workflow_id: str, /, seconds: float, until_woken: bool = False) -> str:
    rested = await nap_step(workflow_id, seconds, until_woken)
    await note(workflow_id, "after-nap")
    return rested


def _recorded(workflow_id: str, what: str) -> bool:
    url = World.url or os.environ["DURABLE_DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM world WHERE workflow_id = %s AND what = %s", [workflow_id, what]
        ).fetchone()
    return row is not None and int(row[0]) > 0


def _broken_iteration() -> None:
    raise RuntimeError("the event loop broke (injected by loop_faults.break_step)")


@durable.step(registry=registry, name="loop_faults.break_step")
async def break_step(workflow_id: str) -> str:
    """The first call anywhere breaks the running loop's machinery once the test says
    "go": its next iteration raises out of run_forever. Later calls do nothing."""
    if await record(workflow_id, "break") == 0:
        while not await asyncio.to_thread(_recorded, workflow_id, "go"):
            await asyncio.sleep(0.05)
        loop: Any = asyncio.get_running_loop()
        loop._run_once = _broken_iteration
        await asyncio.sleep(0)  # the loop's next iteration: never comes back
    return "intact"


@durable.workflow(registry=registry, name="loop_faults.breaking")
async def breaking(workflow_id: str, /) -> str:
    state = await break_step(workflow_id)
    await note(workflow_id, "after-break")
    return state
