"""`durable worker --processes N`: N worker processes under one command.

One worker process runs its workflows' Python under one interpreter lock, so recovering
thousands of workflows at once is bound by one core. With `--processes N` the command
starts N `durable worker` processes with the same options and supervises them: each is a
whole worker with its own executor id and its own heartbeat, and they share the claims
the way any workers do, row by row (FOR UPDATE SKIP LOCKED, or compare-and-set on Citus):
each interrupted or runnable workflow is claimed by exactly one of them. SIGTERM or SIGINT
is passed on, and the command waits for each to finish its grace period. A process that
dies otherwise is started again after a second (its claims are taken back at once by its
successor on the same host, see _host.py), backing off while it keeps failing at start;
one that cannot start at all stops the command with its exit code. Each process runs this
command's own command line (sys.argv) without --processes.
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

RESTART_DELAY = 1.0  # doubling while a process keeps failing at start, up to RESTART_MAX
RESTART_MAX = 30.0
FAST_SECONDS = 10.0  # an exit this soon after a start is a failure to start
FAST_FAILURES = 3
STOP_MARGIN = 30.0  # beyond the grace period, before a process that will not stop is killed
# Tells each process its number: an engine given an executor id in code (--app
# module:engine) gets `<id>-<k>`, as --executor-id does.
PROCESS_ENV = "DURABLE_WORKER_PROCESS"


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
    signal's as 128 + its number), else 0. A child that keeps failing at start (a bad
    --app, a wrong URL: FAST_FAILURES exits within FAST_SECONDS in a row) stops them all."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logger.info("signal %d: stopping %d worker processes", signum, processes)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    commands = [child_argv(argv, k) for k in range(processes)]

    def launch(k: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(commands[k], env={**os.environ, PROCESS_ENV: str(k)})

    children = [launch(k) for k in range(processes)]
    started = [time.monotonic()] * processes
    fast = [0] * processes
    failed: int | None = None
    logger.info(
        "started %d worker processes (pids %s)", processes, ", ".join(str(c.pid) for c in children)
    )
    while failed is None and not stop.wait(0.2):
        for k, child in enumerate(children):
            code = child.poll()
            if code is None or stop.is_set():
                continue
            fast[k] = fast[k] + 1 if time.monotonic() - started[k] < FAST_SECONDS else 0
            if code != 0 and fast[k] >= FAST_FAILURES:
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
            if stop.wait(delay):
                break
            children[k], started[k] = launch(k), time.monotonic()
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds + STOP_MARGIN
    codes = []
    for child in children:
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


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code
