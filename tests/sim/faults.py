"""Processes that die in-process, at a chosen round trip to the server.

A simulated process is an `Engine` whose connections carry the application name
`sim_<pid>_<n>`. Every exchange with PostgreSQL (psycopg's `wait`, one per round trip:
a statement, a COMMIT, a pipeline) passes `_wait`, which knows the process by that name.
A fault armed on the process fires at its k-th round trip made by workflow code (a run's
thread or task, not the engine's background loops), either before the exchange (nothing
reached the server) or after it (the server did the work, even committed it, and the reply
is lost with the process).

A crash is what SIGKILL does, seen from the database: the process marks itself dead, its
backends are terminated (their open transactions roll back, their locks go), and from then
on each of its round trips raises `Crash` (so no code of the dead process writes anything
more, not even its clean-up), and `alive()` refuses the world's calls from its threads.
A lost reply instead closes the connection after the exchange and raises psycopg's
OperationalError, as a network cut does; the process lives on and reconnects. An outage
terminates every backend of the process at once (a database restart): the exchange under
way fails, so does each pooled connection's next one, and the process reconnects.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import threading
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from durable._run.context import current_run


class Crash(BaseException):
    """The simulated process died here."""


@dataclass
class Fault:
    """Fire at the `at`-th round trip of workflow code: `crash` (before or after the
    exchange) or `lost` (the reply lost after the exchange; the process lives)."""

    at: int
    kind: str  # "crash_before" | "crash_after" | "lost" | "outage" | "pause"


@dataclass
class Process:
    name: str
    admin_url: str
    dead: bool = False
    trips: int = 0
    fault: Fault | None = None
    fired: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    paused: threading.Event = field(default_factory=threading.Event)
    resumed: threading.Event = field(default_factory=threading.Event)

    def pause_here(self) -> None:
        """Hold the calling run until the simulation releases it (a paused process)."""
        self.paused.set()
        if not self.resumed.wait(60):
            raise Crash(f"{self.name}: never released")

    def release(self) -> None:
        self.resumed.set()

    def arm(self, fault: Fault | None) -> None:
        with self.lock:
            self.trips = 0
            self.fault = fault

    def kill(self) -> None:
        """Die: mark dead, then drop every backend of this process (as the kernel does)."""
        with self.lock:
            if self.dead:
                return
            self.dead = True
        _terminate(self.admin_url, self.name)

    def alive(self) -> None:
        """Called by the world on each call: a dead process's threads reach nothing."""
        if self.dead:
            raise Crash(self.name)

    def _next(self) -> str | None:
        """Count a workflow round trip; the fault's kind if it fires now."""
        with self.lock:
            self.trips += 1
            fault = self.fault
            if fault is not None and self.trips == fault.at:
                self.fault = None
                self.fired.append(f"{fault.kind}@{fault.at}")
                return fault.kind
        return None


_counter = itertools.count(1)
_processes: dict[str, Process] = {}
_installed = False


def new_process(admin_url: str) -> Process:
    install()
    name = f"sim_{os.getpid()}_{next(_counter)}"
    proc = Process(name, admin_url)
    _processes[name] = proc
    return proc


def forget(proc: Process) -> None:
    _processes.pop(proc.name, None)


def process_of_run() -> Process | None:
    """The process whose workflow code runs in this thread or task (None: not a run)."""
    run = current_run.get()
    if run is None:
        return None
    host = getattr(run, "host", None)
    db = getattr(host, "db", None) if host is not None else None
    name = getattr(db, "_sim_process", None)
    return _processes.get(name) if name else None


def _terminate(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True, application_name="sim_admin") as conn:
        for _ in range(200):
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (name,),
            ).fetchall()
            if not rows:
                return
            conn.execute("SELECT pg_sleep(0.005)")


def _process_of(conn: Any) -> Process | None:
    try:
        raw = conn.pgconn.parameter_status(b"application_name")
    except Exception:
        return None
    if not raw or not raw.startswith(b"sim_"):
        return None
    return _processes.get(raw.decode())


# Generators that send nothing when no transaction is open (a COMMIT of an autocommit
# connection): no exchange, so no fault point.
_NO_OP_OUTSIDE_TX = ("_commit_gen", "_rollback_gen")


def _decide(conn: Any, gen: Any) -> tuple[Process | None, str | None]:
    proc = _process_of(conn)
    if proc is None:
        return None, None
    if proc.dead:
        raise Crash(proc.name)
    if current_run.get() is None:  # the engine's loops: not counted, never faulted
        return proc, None
    name = getattr(gen, "__qualname__", "")
    if name.endswith(_NO_OP_OUTSIDE_TX) and conn.pgconn.transaction_status == 0:  # IDLE
        return proc, None
    return proc, proc._next()


def _before(conn: Any, gen: Any) -> tuple[Process | None, str | None, Any]:
    """Before an exchange: the process, the fault left for after it, and what to do first
    that may block (a pause, an outage's terminations), for the caller to run in its way."""
    proc, kind = _decide(conn, gen)
    if proc is None or kind is None:
        return proc, None, None
    if kind == "crash_before":
        proc.kill()
        raise Crash(proc.name)
    if kind == "outage":  # every connection of it drops; it lives
        return proc, None, functools.partial(_terminate, proc.admin_url, proc.name)
    if kind == "pause":
        return proc, None, proc.pause_here
    return proc, kind, None


def _after(conn: Any, proc: Process | None, kind: str | None) -> None:
    """After an exchange (or a pause): a dead process learns nothing; a fault fires."""
    if proc is None:
        return
    if proc.dead:
        raise Crash(proc.name)
    if kind == "crash_after":
        proc.kill()
        raise Crash(proc.name)
    if kind == "lost":
        conn.pgconn.finish()
        raise psycopg.OperationalError("simulated: server closed the connection unexpectedly")


def install() -> None:
    """Hook psycopg's waits (once per interpreter; a no-op for connections not simulated)."""
    global _installed
    if _installed:
        return
    _installed = True
    sync_wait = psycopg.Connection.wait
    async_wait = psycopg.AsyncConnection.wait

    def wait(self: Any, gen: Generator[Any, Any, Any], *args: Any, **kwargs: Any) -> Any:
        proc, kind, first = _before(self, gen)
        if first is not None:
            first()
            _after(self, proc, None)
        try:
            result = sync_wait(self, gen, *args, **kwargs)
        except psycopg.Error:
            _after(self, proc, None)  # killed meanwhile: the process is gone, not the server
            raise
        _after(self, proc, kind)
        return result

    async def await_(self: Any, gen: Generator[Any, Any, Any], *args: Any, **kwargs: Any) -> Any:
        proc, kind, first = _before(self, gen)
        if first is not None:
            await asyncio.to_thread(first)
            _after(self, proc, None)
        try:
            result = await async_wait(self, gen, *args, **kwargs)
        except psycopg.Error:
            _after(self, proc, None)
            raise
        _after(self, proc, kind)
        return result

    psycopg.Connection.wait = wait  # type: ignore[method-assign]
    psycopg.AsyncConnection.wait = await_  # type: ignore[method-assign]


def _quiet_crashes(args: threading.ExceptHookArgs) -> None:
    """A thread of a dead process ends on Crash: that is the simulation, not an error."""
    if isinstance(args.exc_value, Crash):
        return
    _default_hook(args)


_default_hook = threading.excepthook
threading.excepthook = _quiet_crashes
