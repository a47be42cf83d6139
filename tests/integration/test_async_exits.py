"""SystemExit and KeyboardInterrupt out of an async step, in one process.

As out of a sync step: the run is given up at once (counted as a recovery attempt) and
recovered; the event loop it ran on, and every other run on it, go on. (The same against
real worker processes, and a loop that dies anyway: tests/acceptance/
test_async_loop_faults.py.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

import durable

EXITS: dict[str, type[BaseException]] = {
    "SystemExit": SystemExit,
    "KeyboardInterrupt": KeyboardInterrupt,
}


def exiting_app() -> tuple[durable.Registry, Any]:
    """A workflow whose async step raises `kind` on its first call (in a gather branch, a
    task of its own, when `gathered`), then returns how many times it ran."""
    reg = durable.Registry()
    calls: list[str] = []

    @durable.step(registry=reg)
    async def exit_once(kind: str, key: str) -> int:
        calls.append(key)
        await asyncio.sleep(0)
        if calls.count(key) == 1:
            raise EXITS[kind]()
        return calls.count(key)

    @durable.workflow(registry=reg)
    async def exiting(kind: str, key: str, gathered: bool) -> int:
        if gathered:
            n, _ = await asyncio.gather(exit_once(kind, key), asyncio.sleep(0.01))
            return int(n)
        return await exit_once(kind, key)

    return reg, exiting


def attempts(url: str, workflow_id: str) -> tuple[str, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status, recovery_attempts FROM durable.workflows WHERE workflow_id = %s",
            [workflow_id],
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_an_exit_in_an_async_step_is_given_up_and_the_engines_loop_goes_on(
    database_url: str,
) -> None:
    reg, exiting = exiting_app()
    ids = [f"{kind}-{gathered}" for kind in EXITS for gathered in (False, True)]
    with durable.Engine(
        database_url,
        registry=reg,
        worker=True,
        poll_interval=0.05,
        lease_seconds=1.0,
        max_recovery_attempts=2,
    ) as engine:
        handles = [
            engine.start(exiting, w.split("-")[0], w, w.endswith("True"), workflow_id=w)
            for w in ids
        ]
        values: list[object] = []
        for handle in handles:
            try:
                values.append(handle.result(timeout=30))
            except BaseException as exc:  # a KeyboardInterrupt here would end the session
                values.append(exc)
    assert values == [2] * len(ids)
    assert [attempts(database_url, w) for w in ids] == [("SUCCESS", 1)] * len(ids)


def run_on_the_applications_loop(url: str, kind: str) -> object:
    """Start the workflow with start_async (it runs on this loop) and wait for it: what
    asyncio.run returned, or raised. Then another engine sees the workflow to its end."""
    reg, exiting = exiting_app()
    settings: dict[str, Any] = {
        "registry": reg,
        "worker": True,
        "poll_interval": 0.05,
        "lease_seconds": 1.0,
        "max_recovery_attempts": 2,
    }
    engine = durable.Engine(url, **settings)

    async def main() -> object:
        async with engine:
            handle = await engine.start_async(exiting, kind, "app", False, workflow_id="app")
            return await handle.result(timeout=30)

    value: object
    try:
        value = asyncio.run(main())
    except BaseException as exc:  # a KeyboardInterrupt here would end the session
        value = exc
    finally:
        engine.shutdown()  # when asyncio.run ended without leaving `async with`
    with durable.Engine(url, **settings) as after:
        after.retrieve("app").result(timeout=30)
    return value


def test_a_system_exit_in_an_async_step_does_not_end_the_applications_loop(
    database_url: str,
) -> None:
    """A workflow started with start_async runs on the application's loop: SystemExit in
    its step gives the run up (a worker recovers it), not the application."""
    value = run_on_the_applications_loop(database_url, "SystemExit")
    assert value == 2, f"asyncio.run raised {value!r}"
    assert attempts(database_url, "app") == ("SUCCESS", 1)


def test_a_keyboard_interrupt_on_the_main_thread_gives_the_run_up_and_goes_on(
    database_url: str,
) -> None:
    """On the main thread a KeyboardInterrupt may be the user's Ctrl-C: it goes on to end
    the program, once the run it went through was given up (counted, and recovered)."""
    value = run_on_the_applications_loop(database_url, "KeyboardInterrupt")
    assert isinstance(value, KeyboardInterrupt), value
    assert attempts(database_url, "app") == ("SUCCESS", 1)
