"""The one clock durable reads time from, and a fake one tests can move.

Every time the engine compares — a sleep's wake-up, a workflow's deadline, a schedule's
next tick, a lease — comes from one place: `engine.config.clock` in Python, and
`{schema}.current_time()` in SQL, which the engine points at the same clock by setting
the `durable.fake_now` setting on each connection it checks out. With the system clock
nothing is set and SQL reads the server's own time.

A FakeClock runs at real speed from an offset that `advance()` moves, so leases still
expire while a test waits, yet a one-day sleep or a month of schedules passes in seconds.
Given a file path, the offset is shared by every process that opens the same file: a test
moves time for the worker processes it started.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

from durable.errors import ConfigurationError


@runtime_checkable
class Clock(Protocol):
    """Where durable reads the current time (timezone-aware, UTC)."""

    # True for the real clock: then SQL reads the server's own time and nothing is set.
    is_system: bool

    def now(self) -> dt.datetime: ...


class SystemClock:
    """The real time."""

    is_system = True

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


class FakeClock:
    """Real time shifted by an offset that `advance()` and `set()` move.

    FakeClock(start) begins at `start`; FakeClock(path=...) keeps the offset in a file so
    that every process opening the same path sees the same time (the file is created at
    offset zero if missing, or at `start` if given).
    """

    is_system = False

    def __init__(self, start: dt.datetime | None = None, *, path: str | Path | None = None):
        self._path = Path(path) if path is not None else None
        self._offset = 0.0
        if start is not None:
            if start.tzinfo is None:
                raise ConfigurationError(
                    f"FakeClock(start={start!r}): give a timezone-aware datetime, e.g. "
                    "datetime(2026, 1, 1, tzinfo=datetime.UTC)"
                )
            self._write(start.timestamp() - time.time())
        elif self._path is not None and not self._path.exists():
            self._write(0.0)

    def _write(self, offset: float) -> None:
        self._offset = offset
        if self._path is not None:
            tmp = self._path.with_name(f"{self._path.name}.{os.getpid()}.tmp")
            tmp.write_text(repr(offset))
            os.replace(tmp, self._path)  # atomic: readers never see half a number

    def _read(self) -> float:
        if self._path is not None:
            self._offset = float(self._path.read_text())
        return self._offset

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(time.time() + self._read(), dt.UTC)

    def advance(self, seconds: float | dt.timedelta) -> dt.datetime:
        """Move time forward (never back: durable's ordering relies on it); returns now."""
        delta = seconds.total_seconds() if isinstance(seconds, dt.timedelta) else seconds
        if delta < 0:
            raise ConfigurationError(f"advance({seconds!r}): time only moves forward")
        self._write(self._read() + delta)
        return self.now()

    def set(self, when: dt.datetime) -> None:
        """Jump to `when` (aware); it must not be earlier than now."""
        if when.tzinfo is None:
            raise ConfigurationError(f"set({when!r}): give a timezone-aware datetime")
        if when < self.now():
            raise ConfigurationError(f"set({when!r}): time only moves forward")
        self._write(when.timestamp() - time.time())

    def __repr__(self) -> str:
        where = f", path={str(self._path)!r}" if self._path else ""
        return f"FakeClock({self.now().isoformat()}{where})"
