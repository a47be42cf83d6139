"""`durable worker --processes N`: N worker processes under one command.

One worker process runs its workflows' Python under one interpreter lock, so recovering
thousands of workflows at once is bound by one core. With `--processes N` the command
starts N `durable worker` processes with the same options and supervises them: each is a
whole worker with its own executor id and its own heartbeat, and they share the claims
the way any workers do, row by row (FOR UPDATE SKIP LOCKED, or compare-and-set on Citus):
each interrupted or runnable workflow is claimed by exactly one of them. SIGTERM or SIGINT
is passed on, and the command waits for each to finish its grace period. Each process runs
this command's own command line (sys.argv) without --processes.

A process that dies otherwise is started again, after a second (its claims are taken back
at once by its successor on the same host, see _io/machine.py), backing off, each process on its
own clock, while it keeps dying soon after its start (an OOM kill loop): its siblings go on
working meanwhile. Only a process that keeps *exiting* at start with an error (a bad --app,
a wrong URL: a configuration the next start would fail on again) stops the command, with
its exit code; one killed by a signal never does.

The processes die with the command: each watches a pipe whose only write end the command
holds, and stops (as on SIGTERM: hands its workflows back, within its grace period) when it
reads end-of-file, which the kernel gives it however the command ended, a SIGKILL
included. A pipe rather than Linux's parent-death signal (prctl PR_SET_PDEATHSIG): it works
on every OS, has no race with a command that dies before its child set the signal, and is
tied to the command's process, not to the thread that started the child. A command started
again meanwhile finds a process's id held while the old one finishes its grace period: that
process exits with EXIT_ID_IN_USE and is started again (backing off) until the old one is
gone, instead of the refusal stopping the command.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

logger = logging.getLogger("durable.worker")

RESTART_DELAY = 1.0  # doubling while a process keeps dying soon after its start, up to RESTART_MAX
RESTART_MAX = 30.0
FAST_SECONDS = 10.0  # an exit this soon after a start is a failure to start
FAST_FAILURES = 3
STOP_MARGIN = 30.0  # beyond the grace period, before a process that will not stop is killed
# Tells each process its number: an engine given an executor id in code (--app
# module:engine) gets `<id>-<k>`, as --executor-id does.
PROCESS_ENV = "DURABLE_WORKER_PROCESS"
# The read end of the pipe a process watches: end-of-file on it means the command is gone.
SUPERVISOR_FD_ENV = "DURABLE_SUPERVISOR_FD"
# `durable worker`'s exit code when its executor id is in use by a live process
# (ExecutorIdInUseError): EX_TEMPFAIL, as the holder may be a predecessor still stopping.
EXIT_ID_IN_USE = 75


def watch_supervisor(stop: threading.Event, fd: int | None) -> None:
    """In a process of `--processes N` (`fd`: the pipe its supervisor named in
    DURABLE_SUPERVISOR_FD): set `stop` (the worker's SIGTERM path) once the command that
    started it is gone, as end-of-file on the pipe tells."""
    if fd is None:
        return

    def watch() -> None:
        try:
            while os.read(fd, 512):
                pass
        except OSError:
            pass
        if not stop.is_set():
            logger.warning("the supervising `durable worker --processes` is gone: stopping")
            stop.set()

    threading.Thread(target=watch, name="durable-supervisor-watch", daemon=True).start()


def child_argv(argv: Sequence[str], k: int) -> list[str]:
    """The command line of process `k`: the worker's own options without --processes, and
    an --executor-id, if one was given, made unique per process (`<id>-<k>`)."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--processes":
            skip = True
            continue
        if arg.startswith("--processes="):
            continue
        if arg == "--executor-id" and i + 1 < len(argv):
            out += [arg, f"{argv[i + 1]}-{k}"]
            skip = True
            continue
        if arg.startswith("--executor-id="):
            out.append(f"{arg}-{k}")
            continue
        out.append(arg)
    return [sys.executable, "-m", "durable.cli", *out]


def supervise(argv: Sequence[str], processes: int, grace_seconds: float) -> int:
    """Run `processes` workers (argv: this command's arguments after the program name) until
    SIGTERM or SIGINT; returns the exit code: the first non-zero last exit of a child (a
    signal's as 128 + its number), else 0. A child that keeps exiting with an error at
    start (FAST_FAILURES exits within FAST_SECONDS of their start in a row) stops them all;
    one that keeps being killed only backs off (see the module docstring)."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logger.info("signal %d: stopping %d worker processes", signum, processes)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    commands = [child_argv(argv, k) for k in range(processes)]
    # The write end stays in this process alone: its children get the read end only.
    watched, _held = os.pipe()
    began = time.monotonic()

    def launch(k: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, PROCESS_ENV: str(k), SUPERVISOR_FD_ENV: str(watched)}
        return subprocess.Popen(commands[k], env=env, pass_fds=(watched,))

    children = [launch(k) for k in range(processes)]
    started = [time.monotonic()] * processes
    due: list[float | None] = [None] * processes  # when a dead child is started again
    fast = [0] * processes
    failed: int | None = None
    logger.info(
        "started %d worker processes (pids %s)", processes, ", ".join(str(c.pid) for c in children)
    )
    while failed is None and not stop.wait(0.2):
        now = time.monotonic()
        for k, child in enumerate(children):
            restart_at = due[k]
            if restart_at is not None:
                if now >= restart_at:
                    children[k], started[k], due[k] = launch(k), now, None
                continue
            code = child.poll()
            if code is None:
                continue
            fast[k] = fast[k] + 1 if now - started[k] < FAST_SECONDS else 0
            if _fails_at_start(code, fast[k], now - began, grace_seconds):
                logger.error(
                    "worker process %d exited with code %d %d times in a row at start: "
                    "stopping (see its errors above)",
                    k,
                    code,
                    fast[k],
                )
                failed = _exit_code(code)
                break
            delay = min(RESTART_MAX, RESTART_DELAY * 2 ** max(0, fast[k] - 1))
            logger.warning(
                "worker process %d (pid %d) exited with code %d: starting it again in %.0f s",
                k,
                child.pid,
                code,
                delay,
            )
            due[k] = now + delay
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds + STOP_MARGIN
    codes = []
    for k, child in enumerate(children):
        if due[k] is not None:
            continue  # dead, waiting to be started again: its exit was reported then
        try:
            codes.append(child.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            logger.warning("worker process %d did not stop: killing it", child.pid)
            child.kill()
            codes.append(child.wait())
    if failed is not None:
        return failed
    bad = [_exit_code(c) for c in codes if c not in (0, -signal.SIGTERM)]
    return bad[0] if bad else 0


def _fails_at_start(code: int, fast: int, running: float, grace_seconds: float) -> bool:
    """Whether a child's exit stops the command: it exited with an error (not a signal's
    kill) FAST_FAILURES times in a row at start. Its id held by a live process is not one
    while a predecessor of this command may still be stopping (its grace period)."""
    if code <= 0 or fast < FAST_FAILURES:
        return False
    return code != EXIT_ID_IN_USE or running > grace_seconds + STOP_MARGIN


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code
