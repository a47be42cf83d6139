"""This machine, as an executor row names it: whether a process that registered from here
is gone, so that its claims can be taken at once instead of after its lease.

A pid can be asked about only where it means the same process: the same kernel (its boot
id) and the same pid namespace (containers on one host each have their own). The host key
holds the hostname and both; rows with another key are never judged from here. A pid can
also be reused by a later process: the row holds its process's start (in clock ticks since
boot, which no clock adjustment moves), and a pid whose process started at another tick
is not the executor's. No time of day is compared, so a database clock that is behind
(or a fake clock) cannot make a live process look dead.

A row can name this process's own pid: a predecessor of this pid namespace, killed, whose
pid came round to this process (pid 1 of a container restarted). Its start tick, not
this one's, says it is gone. A row of another pid namespace (another container, even
under the same hostname) says nothing here: only its heartbeat going stale does.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def identity() -> tuple[str, int]:
    """This process as an executor row names it: (hostname, pid)."""
    return socket.gethostname(), os.getpid()


def host_key() -> str:
    """Where pids mean what they mean here: hostname, boot id and pid namespace. '' where
    they cannot be read (not Linux): such rows are never judged by their pid."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
        mounted_for = os.readlink("/proc/self")
    except OSError:
        return ""
    if mounted_for != str(os.getpid()):
        return ""  # /proc is another pid namespace's: /proc/<pid> is not our pid's process
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


def gone(pid: int, pid_start: int | None) -> bool:
    """Whether the process an executor row names (`pid`, which started at tick `pid_start`
    since boot) is gone from this host: no such pid, or the pid now names a process that
    started at another tick (reused). Where the start is unknown, a live pid counts as
    the executor's. No clock is read: a database's, skewed or fake, cannot fool it.

    This process's own pid names it only at its own start tick (or where the tick is
    unknown): at another, a predecessor whose pid came round to this process."""
    if pid == os.getpid():
        mine = start_tick(pid)
        return pid_start is not None and mine is not None and mine != pid_start
    if not pid_alive(pid):
        return True
    now = start_tick(pid)
    return pid_start is not None and now is not None and now != pid_start


def start_tick(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/<pid>/stat, field 22):
    fixed for the life of the process, and unlike a time of day never adjusted. None where
    it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The fields after the command (which may hold spaces and parentheses) start at
    # field 3; starttime is field 22.
    fields = stat[stat.rindex(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None
