"""What every command does around its work: find the database, open a Client, turn a
durable error into exit code 1, print tables, shorten values and show progress.

Kept apart from the commands so that they all behave alike on errors and output.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click
from rich.console import Console

from durable._base.terminal import InertConsole, inert
from durable._client.audit import whoami
from durable._client.client import Client
from durable._io.config import Config, describe_database
from durable.errors import DurableError

if TYPE_CHECKING:
    from durable._embedded.projects import Project

P = ParamSpec("P")
R = TypeVar("R")
_T = TypeVar("_T")


def _resolve_url(url: str | None, *, create: bool = True) -> str:
    """The URL given, else this project's database on the embedded server; one that only
    reads (`create=False`) says that a project with no database yet has none. Which
    database it is goes to stderr (see announce_database)."""
    if url:
        announce_database(url)
        return url
    from durable import _embedded

    config = Config.resolve()
    project = config.embedded_project()
    announce_database(None, project=project)
    data_dir = config.embedded_data_dir()
    return _embedded.project_url(data_dir=data_dir, create=create, project=project)


def announce_database(url: str | None, *, project: Project | None = None) -> None:
    """Say on stderr which database a command uses (stdout stays the command's output,
    clean for --json), and how the project was chosen when it is only a guess."""
    if url:
        about = describe_database(url)
    else:
        project = project if project is not None else Config.resolve().embedded_project()
        about = project.describe()
        if project.pinned:
            about += " (DURABLE_PROJECT_DIR)"
    click.echo(inert(f"using {about}"), err=True)
    guess = project.how_chosen() if project is not None and not url else None
    if guess is not None:
        click.echo(inert(f"note: {guess}"), err=True)


def embedded_data_dir() -> Path | None:
    """The embedded server's data directory the environment names (see _io/config.py)."""
    return Config.resolve().embedded_data_dir()


def _handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except DurableError as exc:
            click.echo(f"error: {inert(str(exc), keep_newlines=True)}", err=True)
            sys.exit(1)

    return wrapper


@contextmanager
def _client(
    url: str | None, schema: str, *, migrate: bool = False, via: str = "cli"
) -> Iterator[Client]:
    """A Client for one command: a small pool, no threads, no executor row. Its operator
    actions are recorded as `user@host via <via>`."""
    resolved = _resolve_url(url, create=migrate)
    actor = f"{whoami()} via {via}"  # the audit log's record of who acted
    with Client(
        resolved, schema=schema, migrate=migrate, connect_timeout=10, actor=actor
    ) as client:
        yield client


def _console() -> Console:
    # Stored values (inputs, outputs, names, errors) are data, never markup or terminal
    # controls: with markup, an input holding "[/bold]" would crash the command and
    # "[link=...]" would emit a hyperlink the operator never saw; raw, an id holding
    # ESC]8;; would do the same (durable._base.terminal escapes them).
    return InertConsole(width=max(100, _columns()))


def _columns() -> int:
    """The terminal's width from COLUMNS (120 when it is unset or not a number)."""
    try:
        return int(os.environ.get("COLUMNS", "120"))
    except ValueError:
        return 120


class _Progress:
    """Progress of a long command on stderr: a rich bar per task on a terminal, or (asked
    for with --progress elsewhere, as in a job's log) a plain line per update."""

    def __init__(self, enabled: bool | None) -> None:
        terminal = sys.stderr.isatty()
        self.lines = bool(enabled) and not terminal
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}
        if (enabled is None or enabled) and terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=InertConsole(stderr=True),
                transient=False,
            )

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    @property
    def active(self) -> bool:
        return self.lines or self._bar is not None

    def update(self, what: str, done: int, total: int, note: str = "") -> None:
        if self._bar is not None:
            if what not in self._tasks:
                self._tasks[what] = self._bar.add_task(what, total=total)
            self._bar.update(self._tasks[what], completed=done, total=total)
        elif self.lines:
            click.echo(f"{what}: {done}/{total}{note}", err=True)


class _CtrlC:
    """Ctrl-C for a watch, taken only where the watch waits between looks.

    Python raises KeyboardInterrupt wherever the main thread happens to be: inside a
    database call, a connection pool's bookkeeping or a lock's release in threading's own
    code, which can leave a lock held and hang the way out (a watch that ignored Ctrl-C).
    Here the signal only sets a flag; the wait between looks waits in short slices and
    ends the watch when it sees the flag, so a Ctrl-C ends it within a slice of the look
    it lands in. A second Ctrl-C interrupts wherever it lands, for a look (or a connect)
    that hangs. Once the watch is ending, further Ctrl-Cs are let go: the way out closes
    the client, which is bounded, and one torn apart could hang."""

    SLICE = 0.1

    def __init__(self) -> None:
        self.pending = False
        self.ending = False

    def on_signal(self, _signum: int, _frame: object) -> None:
        if self.ending:
            return
        if self.pending:
            self.ending = True
            raise KeyboardInterrupt
        self.pending = True

    def guard(self, wait: Callable[[float], bool]) -> Callable[[float], bool]:
        """`wait` (seconds -> whether a notification woke it), made the one place a Ctrl-C
        ends the watch."""

        def guarded(seconds: float) -> bool:
            deadline = time.monotonic() + seconds
            while not self.pending:
                left = deadline - time.monotonic()
                if wait(max(0.0, min(self.SLICE, left))):
                    return True
                if left <= self.SLICE:
                    return False
            self.ending = True
            raise KeyboardInterrupt

        return guarded


@contextmanager
def _interruptible() -> Iterator[_CtrlC]:
    """Ctrl-C ends a watch quietly, with exit code 0, at its next wait (see _CtrlC): pass
    the watch's wait through the yielded object's `guard`. Enter it before the client is
    opened, so that the handler covers the connect and the close as well."""
    ctrl_c = _CtrlC()
    # Only the main thread may set a handler (a command run from another thread, as a
    # test harness may, keeps Python's own: a KeyboardInterrupt, still ended here).
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, ctrl_c.on_signal) if main else None
    try:
        yield ctrl_c
    except KeyboardInterrupt:
        sys.exit(0)
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


_FULL = False  # `workflows show --full`: set for the one command that runs


def _show_full(full: bool) -> None:
    """Set by `workflows show --full`, which lives in another module than `_short`."""
    global _FULL
    _FULL = full


def _short(text: str | None, width: int = 60) -> str:
    if text is None:
        return ""
    if _FULL:
        return text
    return text if len(text) <= width else text[: width - 1] + "…"
