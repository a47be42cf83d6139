"""This machine, as an executor row names it: whether a process that registered from here
is gone, so that its claims can be taken at once instead of after its lease.

A pid can be asked about only where it means the same process: the same kernel (its boot
id) and the same pid namespace (containers on one host each have their own). The host key
holds the hostname and both; rows with another key are never judged from here. A pid can
also be reused by a later process: one that started after the executor registered is not
the executor's process.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

# How far a process's start may come after its executor's registration and still be that
# process (the database's clock and this host's may differ a little).
_CLOCK_SLACK = 5.0


def identity() -> tuple[str, int]:
    """This process as an executor row names it: (hostname, pid)."""
    return socket.gethostname(), os.getpid()


def host_key() -> str:
    """Where pids mean what they mean here: hostname, boot id and pid namespace. '' where
    they cannot be read (not Linux): such rows are never judged by their pid."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{socket.gethostname()}/{boot}/{namespace}"


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists here (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, as another user
    return True


def gone(pid: int, registered_at: float) -> bool:
    """Whether the process that registered at `registered_at` (epoch seconds) with `pid` on
    this host is gone: no such pid, or the pid now belongs to a process that started
    later (reused)."""
    if pid == os.getpid():
        return False
    if not pid_alive(pid):
        return True
    started = _started_at(pid)
    return started is not None and started > registered_at + _CLOCK_SLACK


def _started_at(pid: int) -> float | None:
    """When process `pid` started (epoch seconds), from /proc; None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError):
        return None
    # The fields after the command (which may hold spaces) start at field 3; starttime is
    # field 22, in clock ticks since boot.
    fields = stat[stat.rindex(")") + 2 :].split()
    try:
        ticks = int(fields[19])
    except (IndexError, ValueError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")
