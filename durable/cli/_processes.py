"""`durable worker --processes N`: N worker processes under one command.

One worker process runs its workflows' Python under one interpreter lock, so recovering
thousands of workflows at once is bound by one core. With `--processes N` the command
starts N `durable worker` processes with the same options and supervises them: each is a
whole worker with its own executor id and its own heartbeat, and they share the claims
the way any workers do, row by row (FOR UPDATE SKIP LOCKED, or compare-and-set on Citus):
each interrupted or runnable workflow is claimed by exactly one of them. SIGTERM or SIGINT
is passed on, and the command waits for each to finish its grace period. A process that
dies otherwise is started again after a second (its claims are taken back at once by its
successor on the same host, see _host.py).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

logger = logging.getLogger("durable.worker")

RESTART_DELAY = 1.0


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


def supervise(argv: Sequence[str], processes: int) -> int:
    """Run `processes` workers (argv: this command's arguments after the program name) until
    SIGTERM or SIGINT; returns the exit code (the first non-zero one of a child's last
    exit, else 0)."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logger.info("signal %d: stopping %d worker processes", signum, processes)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    commands = [child_argv(argv, k) for k in range(processes)]
    children = [subprocess.Popen(c) for c in commands]
    logger.info(
        "started %d worker processes (pids %s)", processes, ", ".join(str(c.pid) for c in children)
    )
    while not stop.wait(0.2):
        for k, child in enumerate(children):
            code = child.poll()
            if code is None or stop.is_set():
                continue
            logger.warning(
                "worker process %d (pid %d) exited with code %d: starting it again in %.0f s",
                k,
                child.pid,
                code,
                RESTART_DELAY,
            )
            if stop.wait(RESTART_DELAY):
                break
            children[k] = subprocess.Popen(commands[k])
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    codes = [child.wait() for child in children]
    bad = [c for c in codes if c not in (0, -signal.SIGTERM)]
    return bad[0] if bad else 0


def forwarded_argv() -> list[str]:
    """This command's arguments after the program name (`durable` or `python -m durable`)."""
    return list(sys.argv[1:])
