"""The `durable` command: migrate the schema, inspect workflows, manage the embedded server.

Every command takes --database-url (or DURABLE_DATABASE_URL); without either it uses the
embedded server. Tables are printed for people; --json prints data for scripts. Exit codes:
0 success, 1 a durable error (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click
from rich.console import Console
from rich.table import Table

from durable import _citus
from durable._client import Client
from durable._config import check_schema
from durable._models import WorkflowInfo, WorkflowStatus
from durable._names import check_name
from durable._protocol import decode_error
from durable._terminal import InertConsole, inert
from durable.errors import DurableError, InvalidNameError

if TYPE_CHECKING:
    from durable._engine import Engine

P = ParamSpec("P")
R = TypeVar("R")

url_option = click.option(
    "--database-url",
    envvar="DURABLE_DATABASE_URL",
    default=None,
    help="System database URL (default: $DURABLE_DATABASE_URL, else the embedded server).",
)
schema_option = click.option("--schema", default="durable", show_default=True)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _resolve_url(url: str | None) -> str:
    if url:
        return url
    from durable import _embedded

    return _embedded.project_url()  # this project's database on the embedded server


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
def _client(url: str | None, schema: str, *, migrate: bool = False) -> Iterator[Client]:
    """A Client for one command: a small pool, no threads, no executor row."""
    with Client(_resolve_url(url), schema=schema, migrate=migrate, connect_timeout=10) as client:
        yield client


def _console() -> Console:
    # Stored values (inputs, outputs, names, errors) are data, never markup or terminal
    # controls: with markup, an input holding "[/bold]" would crash the command and
    # "[link=...]" would emit a hyperlink the operator never saw; raw, an id holding
    # ESC]8;; would do the same (durable._terminal escapes them).
    return InertConsole(width=max(100, _columns()))


def _columns() -> int:
    """The terminal's width from COLUMNS (120 when it is unset or not a number)."""
    try:
        return int(os.environ.get("COLUMNS", "120"))
    except ValueError:
        return 120


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# The longest duration an option takes. A retention window is subtracted from now() in
# SQL, where a few thousand years already fall off the timestamp range, and a worker
# sleeps an interval through threading, which refuses waits past ~292 years: a century
# is "never" for every option here, and keeps each of them working.
_MAX_DURATION = dt.timedelta(days=36500)


class Duration(click.ParamType[dt.timedelta, Any]):
    """A duration such as 90d, 12h, 30m, 45s or plain seconds, from zero to 36500d."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dt.timedelta:
        if isinstance(value, dt.timedelta):
            return value
        text = str(value).strip().lower()
        unit = text[-1:] if text[-1:] in _UNITS else "s"
        number = text[:-1] if text[-1:] in _UNITS else text
        try:
            amount = float(number)
        except ValueError:
            self.fail(f"{value!r}: give a duration such as 7d, 12h, 30m or 45s", param, ctx)
        if math.isnan(amount):
            self.fail(f"{value!r}: give a duration such as 7d, 12h, 30m or 45s", param, ctx)
        if amount < 0:
            self.fail(f"{value!r}: a duration is zero or more", param, ctx)
        seconds = amount * _UNITS[unit]  # inf past the float range, refused just below
        if seconds > _MAX_DURATION.total_seconds():
            self.fail(f"{value!r}: a duration is at most {_MAX_DURATION.days}d", param, ctx)
        return dt.timedelta(seconds=seconds)


DURATION = Duration()


class _FiniteRange(click.FloatRange):
    """A finite number within a range. click's FloatRange lets NaN through (every
    comparison with it is false) and, without a maximum, infinity: a wait of either
    spins or never ends, and neither is an amount of money, so both are refused."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r}: give a finite number", param, ctx)
        return number


def _checked_name(what: str, value: str | None) -> str | None:
    """An id given on the command line, checked as the library checks ids (non-empty, at
    most 512 bytes, no NUL): a bad one is a usage error before anything starts."""
    if value is not None:
        try:
            check_name(what, value)
        except InvalidNameError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


_HOUR = 3600.0
_DAY = 86400.0
_BIGINT = 2**63 - 1  # PostgreSQL's bigint, where token counts are kept
_INTEGER = 2**31 - 1  # PostgreSQL's integer, where step counts are kept


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="durable-pg", prog_name="durable")
def main() -> None:
    """durable: durable workflows journaled in PostgreSQL."""


progress_option = click.option(
    "--progress/--no-progress",
    default=None,
    help="Show progress on stderr (default: a bar when stderr is a terminal).",
)


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


@main.command()
@url_option
@schema_option
@progress_option
@click.option(
    "--citus",
    is_flag=True,
    help="Then distribute the tables over a Citus cluster (see docs/scaling.md).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="With --citus: print the statements it would run, connect to nothing.",
)
@_handle_errors
def migrate(
    database_url: str | None, schema: str, progress: bool | None, citus: bool, dry_run: bool
) -> None:
    """Create or upgrade durable's tables (safe to run concurrently: a second run waits for
    the first, then finds nothing to do)."""
    if dry_run and not citus:
        raise click.UsageError("--dry-run goes with --citus")
    if dry_run:
        check_schema(schema)  # what the real run would refuse, refused here too
        for statement in _citus.statements(schema):
            click.echo(f"{statement};")
        return
    client = Client(_resolve_url(database_url), schema=schema, migrate=True, connect_timeout=10)
    with _Progress(progress) as shown:
        if shown.active:

            def report(version: int, name: str, index: int, count: int, took: float | None) -> None:
                label = f"migration {version:04d}_{name}"
                if took is None:
                    shown.update("migrations", index - 1, count, f" (applying {label})")
                else:
                    shown.update("migrations", index, count, f" ({label} took {took:.2f} s)")

            client._migration_progress = report
        with client:
            applied = client.applied_migrations
            distributed = client.distribute_citus() if citus else None
    click.echo(f"applied migrations: {applied}" if applied else "schema is up to date")
    if distributed is not None:
        click.echo(f"distributed {distributed} tables over Citus")


@main.group()
def workflows() -> None:
    """Inspect workflows."""


def _info_dict(info: WorkflowInfo) -> dict[str, Any]:
    return {
        "workflow_id": info.workflow_id,
        "name": info.name,
        "version": info.version,
        "status": info.status.value,
        "durability": info.durability,
        "parent_id": info.parent_id,
        "owner": info.owner,
        "epoch": info.epoch,
        "recovery_attempts": info.recovery_attempts,
        "created_at": info.created_at.isoformat(),
        "finished_at": info.finished_at.isoformat() if info.finished_at else None,
    }


@workflows.command("list")
@url_option
@schema_option
@click.option(
    "--status",
    type=click.Choice([s.value for s in WorkflowStatus], case_sensitive=False),
    default=None,
    callback=lambda _ctx, _param, value: None if value is None else value.upper(),
)
@click.option("--name", default=None, help="Only workflows registered under this name.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--watch", is_flag=True, help="Refresh the table until Ctrl-C.")
@click.option("--interval", type=_FiniteRange(0.1, _HOUR), default=2.0, show_default=True)
@json_option
@_handle_errors
def list_cmd(
    database_url: str | None,
    schema: str,
    status: str | None,
    name: str | None,
    limit: int,
    watch: bool,
    interval: float,
    as_json: bool,
) -> None:
    """List workflows, newest first."""
    from durable._watch import refresh, workflow_table

    with _client(database_url, schema) as client:

        def listed() -> list[WorkflowInfo]:
            return client.list_workflows(status, name=name, limit=limit)

        if watch:
            with _interruptible():
                refresh(client, lambda: workflow_table(listed()), _console(), interval)
        infos = listed()
    if as_json:
        click.echo(json.dumps([_info_dict(i) for i in infos], indent=2))
        return
    _console().print(workflow_table(infos))


@workflows.command("watch")
@click.argument("workflow_id")
@url_option
@schema_option
@click.option("--interval", type=_FiniteRange(0.05, _HOUR), default=0.5, show_default=True)
@_handle_errors
def watch(workflow_id: str, database_url: str | None, schema: str, interval: float) -> None:
    """Follow a workflow live: its steps as they are journaled, its waits and budget, until
    it finishes (exit 0 on SUCCESS, 1 otherwise)."""
    from durable._watch import follow

    with _client(database_url, schema) as client, _interruptible():
        status = follow(client, workflow_id, _console(), interval)
    sys.exit(0 if status is WorkflowStatus.SUCCESS else 1)


@contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C ends a watch quietly, with exit code 0."""
    try:
        yield
    except KeyboardInterrupt:
        sys.exit(0)


_FULL = False  # `workflows show --full`: set for the one command that runs


def _short(text: str | None, width: int = 60) -> str:
    if text is None:
        return ""
    if _FULL:
        return text
    return text if len(text) <= width else text[: width - 1] + "…"


@workflows.command("show")
@click.argument("workflow_id")
@url_option
@schema_option
@json_option
@click.option("--full", is_flag=True, help="Print whole values instead of shortening them.")
@_handle_errors
def show(
    workflow_id: str, database_url: str | None, schema: str, as_json: bool, full: bool
) -> None:
    """Show one workflow: inputs, status, every journaled step, its effects, budget,
    state, tool calls and conversation."""
    global _FULL
    _FULL = full
    with _client(database_url, schema) as client:
        tools = client.tool_calls(workflow_id)
        turns = client.conversation(workflow_id)
        events = client.events(workflow_id)
        info = client.get_workflow(workflow_id)
        steps = client.steps(workflow_id)
        effects = client.effects(workflow_id)
        state_text = client.state_text(workflow_id)
        budget = client.budget(workflow_id)
        orphan = any(w["workflow_id"] == workflow_id for w in client.waiting_for_worker(120, 1000))
    state = None if state_text is None else json.loads(state_text)
    if as_json:
        data = _info_dict(info) | {
            "state": state,
            "budget": None
            if budget is None
            else {k: budget[k] for k in ("budget_id", "limits", "spent")},
            "inputs": info.inputs,
            "output": info.output,
            "error": json.loads(info.error) if info.error else None,
            "steps": [
                {
                    "step_seq": s.step_seq,
                    "step_name": s.step_name,
                    "kind": s.kind.value,
                    "output": s.output,
                    "error": json.loads(s.error) if s.error else None,
                    "attempts": s.attempts,
                    "child_workflow_id": s.child_workflow_id,
                    "started_at": s.started_at.isoformat() if s.started_at else None,
                    "finished_at": s.finished_at.isoformat() if s.finished_at else None,
                }
                for s in steps
            ],
            "waiting_for_code": orphan,
            "tool_calls": tools,
            "events": events,
            "conversation": turns,
            "effects": [
                {
                    "step_seq": e["step_seq"],
                    "effect_name": e["effect_name"],
                    "idempotency_key": e["idempotency_key"],
                    "status": e["status"],
                    "params_fingerprint": e["params_fingerprint"],
                    "result": e["result"],
                    "error": json.loads(e["error"]) if e["error"] else None,
                    "attempts": e["attempts"],
                    "reconciled": e["reconciled"],
                }
                for e in effects
            ],
        }
        click.echo(json.dumps(data, indent=2, default=str))
        return
    console = _console()
    console.print(f"{info.workflow_id}  {info.name}  {info.status.value}", style="bold")
    if orphan:
        console.print(
            f"waiting for a worker that has its code ({info.name}"
            f"{'@' + info.version if info.version else ''}): no live executor registers it"
        )
    console.print(f"inputs: {_short(info.inputs, 200)}")
    console.print(f"durability: {info.durability}  epoch: {info.epoch}  owner: {info.owner or '-'}")
    if info.output is not None:
        console.print(f"output: {_short(info.output, 200)}")
    if info.error is not None:
        etype, message, _ = decode_error(info.error)
        console.print(f"error: {etype}: {message}")
    if state is not None:
        console.print(f"state: {_short(json.dumps(state), 400)}")
    if budget is not None:
        ledger_table = Table("budget", "limit", "spent", title=f"budget {budget['budget_id']}")
        for dim in ("dollars", "tokens", "steps"):
            limit = budget["limits"][dim]
            ledger_table.add_row(
                dim, "unlimited" if limit is None else str(limit), str(budget["spent"][dim])
            )
        console.print(ledger_table)
        why = budget["exhausted"]
        if why:
            console.print(
                f"budget used up ({why}): raise it with "
                f"`durable workflows raise-budget {budget['budget_id']} --dollars N`"
            )
    table = Table("#", "step", "kind", "output / error", "attempts", "ms")
    for s in steps:
        outcome = (
            _short(s.output)
            if s.error is None
            else "ERROR " + _short(": ".join(decode_error(s.error)[:2]))
        )
        ms = ""
        if s.started_at and s.finished_at:
            ms = f"{(s.finished_at - s.started_at).total_seconds() * 1000:.1f}"
        table.add_row(str(s.step_seq), s.step_name, s.kind.value, outcome, str(s.attempts), ms)
    console.print(table)
    if effects:
        ledger = Table(
            "#", "effect", "idempotency key", "status", "params", "result", title="effects"
        )
        for e in effects:
            status = e["status"] + (" (reconciled)" if e["reconciled"] else "")
            ledger.add_row(
                str(e["step_seq"]),
                e["effect_name"],
                e["idempotency_key"],
                status,
                e["params_fingerprint"][:12],
                _short(e["result"] or e["error"], 40),
            )
        console.print(ledger)
    if tools:
        calls = Table("#", "tool", "arguments", "result / error", "ms", "$", title="tool calls")
        for t in tools:
            calls.add_row(
                str(t["step_seq"]),
                t["tool"],
                _short(json.dumps(t["arguments"], default=str), 50),
                _short(t["error"] if t["error"] else json.dumps(t["result"], default=str), 50),
                f"{t['latency_ms']:.1f}",
                f"{t['dollars']:.4f}",
            )
        console.print(calls)
    for turn in turns:
        console.print(f"{turn.get('role')}: {_short(str(turn.get('content')), 300)}")
    for key, value in events.items():
        console.print(f"event {key}: {_short(json.dumps(value, default=str), 200)}")


@workflows.command("cancel")
@click.argument("workflow_id")
@click.option("--reason", default="cancelled from the command line", show_default=True)
@url_option
@schema_option
@_handle_errors
def cancel(workflow_id: str, reason: str, database_url: str | None, schema: str) -> None:
    """Cancel a workflow and its children: each stops at its next step or wait and runs
    its compensations; one that never started is cancelled at once."""
    with _client(database_url, schema) as client:
        asked = client.cancel_tree(workflow_id, reason)
        if workflow_id not in asked:
            info = client.get_workflow(workflow_id)  # WorkflowNotFoundError if none
            click.echo(
                f"error: workflow {workflow_id!r} has already finished ({info.status})",
                err=True,
            )
            sys.exit(1)
    others = len(asked) - 1
    children = f" and {others} descendant(s)" if others else ""
    if asked[workflow_id] is WorkflowStatus.CANCELLED:
        click.echo(inert(f"cancelled {workflow_id}{children}"))
    else:
        click.echo(
            inert(
                f"cancel requested for {workflow_id}{children}: it stops at its next step or wait"
            )
        )


@workflows.command("resume")
@click.argument("workflow_id")
@url_option
@schema_option
@_handle_errors
def resume(workflow_id: str, database_url: str | None, schema: str) -> None:
    """Run a cancelled, failed or given-up workflow again from its journal (any worker
    picks it up; completed steps are not run again)."""
    with _client(database_url, schema) as client:
        if client._resume(workflow_id):
            click.echo(inert(f"resumed {workflow_id}: a worker will pick it up"))
            return
        status = client.get_workflow(workflow_id).status
    if status is WorkflowStatus.SUCCESS:
        click.echo(inert(f"{workflow_id} already succeeded: nothing to resume"))
    else:
        click.echo(inert(f"{workflow_id} is {status}: it is still going, nothing to resume"))


@workflows.command("raise-budget")
@click.argument("workflow_id")
@click.option("--dollars", type=_FiniteRange(min=0), default=None)
@click.option("--tokens", type=click.IntRange(0, _BIGINT), default=None)
@click.option("--steps", type=click.IntRange(0, _INTEGER), default=None)
@click.option("--by", default=lambda: os.environ.get("USER"), help="Who raises it.")
@url_option
@schema_option
@_handle_errors
def raise_budget(
    workflow_id: str,
    dollars: float | None,
    tokens: int | None,
    steps: int | None,
    by: str | None,
    database_url: str | None,
    schema: str,
) -> None:
    """Add to a workflow's budget; workflows paused at its budget gates continue."""
    if dollars is None and tokens is None and steps is None:
        raise click.UsageError("give --dollars, --tokens or --steps")
    with _client(database_url, schema) as client:
        ledger = client.raise_budget(
            workflow_id, dollars=dollars, tokens=tokens, steps=steps, decided_by=by
        )
    click.echo(json.dumps(ledger))


@workflows.command("fork")
@click.argument("workflow_id")
@click.option(
    "--from-step",
    "from_step",
    type=click.IntRange(0),
    required=True,
    help="Reuse the outputs of steps before this position; run the rest anew.",
)
@click.option("--new-id", default=None, help="Id of the fork (default: a new UUID).")
@url_option
@schema_option
@_handle_errors
def fork(
    workflow_id: str, from_step: int, new_id: str | None, database_url: str | None, schema: str
) -> None:
    """Start a new workflow with the same inputs, reusing the journal before a step."""
    with _client(database_url, schema) as client:
        handle = client.fork(workflow_id, from_step=from_step, new_id=new_id)
    click.echo(
        f"forked {workflow_id} from step {from_step}: steps before it are reused, the rest "
        "run anew on a worker; the fork's id is:",
        err=True,
    )
    click.echo(handle.workflow_id)


@main.group()
def executors() -> None:
    """Inspect executors (worker processes and engines)."""


@executors.command("list")
@url_option
@schema_option
@json_option
@click.option("--all", "show_all", is_flag=True, help="Include executors silent for over --stale.")
@click.option("--stale", type=DURATION, default="2m", show_default=True)
@_handle_errors
def executors_list(
    database_url: str | None, schema: str, as_json: bool, show_all: bool, stale: dt.timedelta
) -> None:
    """List live executors with their heartbeat age and running workflows."""
    with _client(database_url, schema) as client:
        rows = [
            r for r in client.executors() if show_all or r["heartbeat_age"] <= stale or r["running"]
        ]
        waiting = client.waiting_for_worker()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "executors": [
                        {
                            "executor_id": r["executor_id"],
                            "hostname": r["hostname"],
                            "pid": r["pid"],
                            "heartbeat_age_seconds": r["heartbeat_age"].total_seconds(),
                            "running": r["running"],
                        }
                        for r in rows
                    ],
                    "waiting_for_worker": [w["workflow_id"] for w in waiting],
                },
                indent=2,
            )
        )
        return
    table = Table("executor", "host", "pid", "heartbeat age (s)", "running")
    for r in rows:
        table.add_row(
            r["executor_id"],
            r["hostname"],
            str(r["pid"]),
            f"{r['heartbeat_age'].total_seconds():.1f}",
            str(r["running"]),
        )
    console = _console()
    console.print(table)
    if waiting:
        console.print(
            f"{len(waiting)} workflow(s) waiting for a worker that has their code: "
            + ", ".join(f"{w['workflow_id']} ({w['name']})" for w in waiting[:10])
        )


def _load_app(
    app: str,
    database_url: str | None,
    concurrency: int | None,
    lease: float | None,
    poll: float | None,
    schema: str = "durable",
    executor_id: str | None = None,
) -> Engine:
    import importlib

    from durable._engine import Engine
    from durable._registry import Registry, default_registry

    module_name, _, attr = app.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        engine = getattr(module, attr) if attr else None
    except (ImportError, ValueError, AttributeError) as exc:
        raise click.UsageError(
            f"--app {app!r} cannot be loaded ({exc}): give an importable module, or "
            "module:engine, run from the directory that holds it"
        ) from None
    if attr:
        if not isinstance(engine, Engine):
            raise click.UsageError(f"{app} is not a durable.Engine")
        changes: dict[str, object] = {}
        if concurrency is not None:
            changes["max_workers"] = concurrency
        if lease is not None:
            changes["lease_seconds"] = float(lease)
        if poll is not None:
            changes["poll_interval"] = poll
        if executor_id is not None:
            changes.update(executor_id=executor_id, explicit_id=True)
        if changes:
            engine._override(**changes)
        return engine
    registry = getattr(module, "registry", None)
    if not isinstance(registry, Registry):
        registry = default_registry
    return Engine(
        database_url,
        schema=schema,
        executor_id=executor_id,
        registry=registry,
        max_workers=concurrency or 8,
        lease_seconds=lease or 30.0,
        poll_interval=poll or 1.0,
    )


@executors.command("prune")
@click.option("--stale", type=DURATION, default="10m", show_default=True)
@url_option
@schema_option
@_handle_errors
def executors_prune(stale: dt.timedelta, database_url: str | None, schema: str) -> None:
    """Forget executors silent for longer than --stale that own no running workflow."""
    with _client(database_url, schema) as client:
        n = client.prune_executors(stale.total_seconds())
    click.echo(f"removed {n} executor(s)")


@main.group()
def queues() -> None:
    """Inspect queues."""


@queues.command("list")
@url_option
@schema_option
@json_option
@_handle_errors
def queues_list(database_url: str | None, schema: str, as_json: bool) -> None:
    """Queues with entries: waiting for a slot, holding one, finished."""
    with _client(database_url, schema) as client:
        rows = client.queues()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("queue", "queued", "active", "finished")
    for r in rows:
        table.add_row(r["queue_name"], str(r["queued"]), str(r["active"]), str(r["finished"]))
    _console().print(table)


@main.command()
@click.option("--app", required=True, help="Module defining the workflows, or module:engine.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 10_000),
    default=None,
    help="Workflows run at once (default 8).",
)
@click.option("--lease-seconds", type=_FiniteRange(0.1, _DAY), default=None)
@click.option("--poll-interval", type=_FiniteRange(0.01, _HOUR), default=None)
@click.option("--grace-seconds", type=_FiniteRange(0, _DAY), default=30.0, show_default=True)
@click.option(
    "--prune-finished-after",
    type=DURATION,
    default=None,
    help="Retention: delete journals of workflows finished longer ago than this (e.g. 7d).",
)
@click.option(
    "--prune-effects-after",
    type=DURATION,
    default=None,
    help="Retention: keep the effect ledger this long (default 90d when pruning).",
)
@click.option("--prune-interval", type=DURATION, default="5m", show_default=True)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per log line, with the event's fields (for log shippers).",
)
@click.option(
    "--executor-id",
    default=None,
    callback=lambda _ctx, _param, value: _checked_name("executor_id", value),
    help="Stable identity of this worker (unique per process): a restart takes back its "
    "interrupted workflows at once instead of after their lease. A worker whose id another "
    "process took over (it was paused past its lease) exits with code 1.",
)
@url_option
@schema_option
@_handle_errors
def worker(
    app: str,
    concurrency: int | None,
    lease_seconds: float | None,
    poll_interval: float | None,
    grace_seconds: float,
    prune_finished_after: dt.timedelta | None,
    prune_effects_after: dt.timedelta | None,
    prune_interval: dt.timedelta,
    database_url: str | None,
    schema: str,
    executor_id: str | None,
    log_format: str,
) -> None:
    """Run the recovery daemon and workflow executor until SIGTERM or SIGINT.

    With --prune-finished-after it also applies retention (as Engine(retention=...) does).
    """
    import logging
    import signal
    import threading

    from durable._logging import configure

    configure(os.environ.get("DURABLE_LOG_LEVEL", "INFO"), log_format)
    engine = _load_app(
        app, database_url, concurrency, lease_seconds, poll_interval, schema, executor_id
    )
    if prune_finished_after is not None or prune_effects_after is not None:
        from durable._retention import RetentionPolicy

        base = engine.retention or RetentionPolicy()
        engine.retention = RetentionPolicy(
            finished_after=prune_finished_after or base.finished_after,
            effects_after=prune_effects_after or base.effects_after,
            batch_size=base.batch_size,
            interval=prune_interval,
        )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("durable.worker").info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    engine.launch()
    try:
        engine.run_worker(stop, grace_seconds=grace_seconds)
    except DurableError as exc:
        if engine.runner.loop_failure is None:
            raise
        # The event loop of async workflows died: its runs were given up. Their tasks,
        # frozen on it, and the threads they started must neither hold the process up
        # nor run their code as it ends: release what is left, then leave at once.
        engine.shutdown(wait=True)
        click.echo(f"error: {exc}", err=True)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    finally:
        engine.shutdown(wait=not engine.superseded)
    if engine.superseded:
        # Another process holds this worker's executor id (the engine logged it, as an
        # error): exit now, non-zero, for a supervisor to restart it. Not a clean exit,
        # which would wait for the runs still inside a step: this process can no longer
        # renew their leases, so another worker may take them over while they run.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


@main.command()
@click.argument("workflow_id")
@click.argument("message")
@click.option("--topic", default=None)
@click.option("--key", "idempotency_key", default=None, help="Idempotency key: deliver once.")
@url_option
@schema_option
@_handle_errors
def send(
    workflow_id: str,
    message: str,
    topic: str | None,
    idempotency_key: str | None,
    database_url: str | None,
    schema: str,
) -> None:
    """Send MESSAGE (JSON, or else a string) to a workflow waiting in durable.recv()."""
    try:
        value: Any = json.loads(message)
    except json.JSONDecodeError:
        value = message
    with _client(database_url, schema) as client:
        client.send(workflow_id, value, topic=topic, idempotency_key=idempotency_key)
    click.echo(inert(f"sent to {workflow_id}"))


@main.command()
@click.option("--finished-after", type=DURATION, default="7d", show_default=True)
@click.option("--effects-after", type=DURATION, default="90d", show_default=True)
@click.option("--batch-size", type=click.IntRange(1, 1_000_000), default=500, show_default=True)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@url_option
@schema_option
@json_option
@progress_option
@_handle_errors
def prune(
    finished_after: dt.timedelta,
    effects_after: dt.timedelta,
    batch_size: int,
    dry_run: bool,
    database_url: str | None,
    schema: str,
    as_json: bool,
    progress: bool | None,
) -> None:
    """Delete journals of long-finished workflows and old effect records (retention).

    Workflows that can still run, or wait, are never touched; safe while workers run."""
    from durable._retention import RetentionPolicy

    policy = RetentionPolicy(
        finished_after=finished_after, effects_after=effects_after, batch_size=batch_size
    )
    with _client(database_url, schema) as client, _Progress(progress) as shown:
        report = client.prune(
            policy, dry_run=dry_run, progress=shown.update if shown.active else None
        )
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(report)))
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{verb} {report.workflows} finished workflows ({report.steps} journal rows) and "
        f"{report.effects} effect records"
    )


@main.group()
def approvals() -> None:
    """List and decide human approval gates."""


@approvals.command("list")
@url_option
@schema_option
@click.option("--all", "show_all", is_flag=True, help="Include decided gates.")
@json_option
@_handle_errors
def approvals_list(database_url: str | None, schema: str, show_all: bool, as_json: bool) -> None:
    """Gates waiting for a decision (the workflows hold no worker while they wait)."""
    with _client(database_url, schema) as client:
        rows = client.list_approvals(waiting_only=not show_all, limit=500)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "workflow_id": r["workflow_id"],
                        "name": r["name"],
                        "status": r["status"],
                        "payload": r["payload"],
                        "comment": r["comment"],
                        "decided_by": r["decided_by"],
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
        return
    table = Table("workflow", "gate", "status", "payload", "requested", "expires")
    for r in rows:
        table.add_row(
            r["workflow_id"],
            r["name"],
            r["status"],
            _short(r["payload"], 50),
            r["requested_at"].strftime("%Y-%m-%d %H:%M:%S"),
            r["expires_at"].strftime("%Y-%m-%d %H:%M:%S") if r["expires_at"] else "",
        )
    _console().print(table)


def _decision_command(approve: bool) -> click.Command:
    verb = "approve" if approve else "deny"

    @click.argument("workflow_id")
    @click.argument("name")
    @click.option("--comment", default=None)
    @click.option("--by", default=lambda: os.environ.get("USER"), help="Who decides.")
    @url_option
    @schema_option
    @_handle_errors
    def command(
        workflow_id: str,
        name: str,
        comment: str | None,
        by: str | None,
        database_url: str | None,
        schema: str,
    ) -> None:
        with _client(database_url, schema) as client:
            client.decide(workflow_id, name, approve, comment=comment, decided_by=by)
        click.echo(inert(f"{'approved' if approve else 'denied'} {name} of {workflow_id}"))

    command.__doc__ = (
        "Approve a gate: its workflow resumes on any worker."
        if approve
        else "Deny a gate: its workflow resumes and sees the denial."
    )
    return approvals.command(verb)(command)


approve = _decision_command(True)
deny = _decision_command(False)


@main.group()
def schedules() -> None:
    """List, pause and resume cron schedules."""


@schedules.command("list")
@url_option
@schema_option
@json_option
@_handle_errors
def schedules_list(database_url: str | None, schema: str, as_json: bool) -> None:
    """Stored schedules with their policy, state and latest tick."""
    with _client(database_url, schema) as client:
        rows = client.list_schedules()
    if as_json:
        keys = ("schedule_name", "workflow_name", "cron", "timezone", "catch_up", "paused")
        out = [
            {
                **{k: r[k] for k in keys},
                "last_tick": r["last_tick"].isoformat() if r["last_tick"] else None,
            }
            for r in rows
        ]
        click.echo(json.dumps(out, indent=2))
        return
    table = Table("schedule", "workflow", "cron", "timezone", "catch up", "state", "last tick")
    for r in rows:
        table.add_row(
            r["schedule_name"],
            r["workflow_name"],
            r["cron"],
            r["timezone"],
            str(r["catch_up"]),
            "paused" if r["paused"] else "active",
            r["last_tick"].isoformat() if r["last_tick"] else "",
        )
    _console().print(table)


def _pause_command(paused: bool) -> click.Command:
    @click.argument("name")
    @url_option
    @schema_option
    @_handle_errors
    def command(name: str, database_url: str | None, schema: str) -> None:
        with _client(database_url, schema) as client:
            client.pause_schedule(name, paused)
        click.echo(inert(f"{'paused' if paused else 'resumed'} schedule {name}"))

    command.__doc__ = (
        "Stop firing a schedule."
        if paused
        else "Fire a paused schedule again (missed ticks follow its catch-up policy)."
    )
    return click.command("pause" if paused else "resume")(command)


schedules.add_command(_pause_command(True))
schedules.add_command(_pause_command(False))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8321, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    envvar="DURABLE_UI_TOKEN",
    default=None,
    help="What actions must present ($DURABLE_UI_TOKEN; default: a new one, printed).",
)
@click.option(
    "--read-only",
    is_flag=True,
    help="No actions at all (and no token, unless it listens beyond loopback).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Another name to answer to, e.g. a reverse proxy's (its pages need the token).",
)
@url_option
@schema_option
@_handle_errors
def ui(
    host: str,
    port: int,
    token: str | None,
    read_only: bool,
    allowed_hosts: tuple[str, ...],
    database_url: str | None,
    schema: str,
) -> None:
    """Serve the web console (pip install 'durable-pg[ui]'). Bound beyond loopback (--host
    0.0.0.0), every page needs the token, not only the actions."""
    try:
        import uvicorn

        from durable.ui import create_app
        from durable.ui._app import _is_loopback
    except ImportError as exc:
        hint = "install the console with pip install 'durable-pg[ui]'"
        raise click.UsageError(f"{exc}: {hint}") from None
    beyond = not _is_loopback(host.strip("[]").lower())
    if beyond or allowed_hosts or not read_only:
        if not token:
            import secrets

            token = secrets.token_urlsafe(18)
            needs = (
                "every page needs"
                if beyond
                else "pages under an --allowed-host name need"
                if read_only
                else "actions need"
            )
            click.echo(f"{needs} this token (or set DURABLE_UI_TOKEN): {token}", err=True)
    else:
        token = None
    if beyond:
        click.echo(
            f"listening beyond loopback ({host}): every page needs the token, not only the "
            "actions (the browser asks for it as a password, any user name; scripts send "
            "the X-Durable-Token header); use https in front of it on an untrusted network",
            err=True,
        )
    with _client(database_url, schema) as client:
        app = create_app(
            client,
            token=token,
            read_only=read_only,
            reads_need_token=beyond,
            allowed_hosts=allowed_hosts,
        )
        click.echo(f"durable console on http://{host}:{port}/ (Ctrl-C stops)", err=True)
        uvicorn.run(app, host=host, port=port, log_level="warning")


@main.group()
def db() -> None:
    """Manage the embedded PostgreSQL server."""


@db.command("url")
@_handle_errors
def db_url() -> None:
    """Start the embedded server and create this project's database if needed (named after
    the working directory), then print its URL: `psql "$(durable db url)"` works at once."""
    from durable import _embedded

    click.echo(_embedded.project_url())


@db.command("stop")
@_handle_errors
def db_stop() -> None:
    """Stop the embedded server."""
    from durable import _embedded

    click.echo("stopped" if _embedded.stop_server() else "not running")


if __name__ == "__main__":
    main()
