"""`durable workflows ...` and `durable send`: list, follow, show, cancel, resume, pause,
unpause, fork a workflow, raise its budget, export and import it, send it a message.

The commands an operator points at one workflow (or lists them to find it).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

import click
from rich.table import Table

from durable._base.models import WorkflowInfo, WorkflowStatus
from durable._base.names import workflow_label
from durable._base.terminal import inert
from durable._core import decode_error
from durable._run.attributes import shown as shown_attributes
from durable._run.filter import RunFilter
from durable.cli._audit import audit_table
from durable.cli._common import (
    _client,
    _console,
    _handle_errors,
    _interruptible,
    _short,
    _show_full,
)
from durable.cli._options import (
    _BIGINT,
    _HOUR,
    _INTEGER,
    MOMENT,
    _FiniteRange,
    attr_option,
    json_option,
    schema_option,
    url_option,
)
from durable.cli._tracebacks import fold, json_value
from durable.errors import ExportFormatError, WorkflowNotFoundError

if TYPE_CHECKING:
    from durable._client.client import Client


@click.group()
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
        "waiting_for_worker": info.waiting_for_worker,
        "attributes": info.attributes,
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
@click.option("--version", default=None, help="Only runs of this version ('' for none).")
@click.option("--parent", default=None, help="Only the runs this workflow started.")
@click.option("--id-prefix", default=None, help="Only workflows whose id starts with this.")
@click.option(
    "--since",
    type=MOMENT,
    default=None,
    help="Only workflows created at or after this time: ISO (2026-03-01T12:00Z) or ago (1h).",
)
@click.option("--until", type=MOMENT, default=None, help="Only workflows created before this time.")
@attr_option
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option(
    "--full-ids", "--wide", "full_ids", is_flag=True, help="Show whole ids, never shortened."
)
@click.option("--watch", is_flag=True, help="Refresh the table until Ctrl-C.")
@click.option("--interval", type=_FiniteRange(0.1, _HOUR), default=2.0, show_default=True)
@json_option
@_handle_errors
def list_cmd(
    database_url: str | None,
    schema: str,
    status: str | None,
    name: str | None,
    version: str | None,
    parent: str | None,
    id_prefix: str | None,
    since: dt.datetime | None,
    until: dt.datetime | None,
    attrs: tuple[str, ...],
    limit: int,
    full_ids: bool,
    watch: bool,
    interval: float,
    as_json: bool,
) -> None:
    """List workflows, newest first (--attr: by their attributes; --id-prefix, --parent,
    --since and --until narrow it; --full-ids never shortens an id)."""
    from durable.cli._watch import refresh, widened, workflow_table

    chosen = RunFilter.parse(attrs, version=version, parent_id=parent)

    def listed(client: Client) -> list[WorkflowInfo]:
        return client.list_workflows(
            status,
            name=name,
            limit=limit,
            id_prefix=id_prefix,
            created_from=since,
            created_to=until,
            filter=chosen,
        )

    if watch:  # until Ctrl-C, which ends the command
        with _interruptible() as ctrl_c, _client(database_url, schema) as client:
            console = _console()
            if full_ids:
                widened(console, workflow_table(listed(client), full_ids=True))
            refresh(
                client,
                lambda: workflow_table(listed(client), full_ids=full_ids),
                console,
                interval,
                ctrl_c.guard,
            )
    with _client(database_url, schema) as client:
        infos = listed(client)
    if as_json:
        click.echo(json.dumps([_info_dict(i) for i in infos], indent=2))
        return
    table = workflow_table(infos, full_ids=full_ids)
    (widened(_console(), table) if full_ids else _console()).print(table)


@workflows.command("watch")
@click.argument("workflow_id")
@url_option
@schema_option
@click.option("--interval", type=_FiniteRange(0.05, _HOUR), default=0.5, show_default=True)
@_handle_errors
def watch(workflow_id: str, database_url: str | None, schema: str, interval: float) -> None:
    """Follow a workflow live: its steps as they are journaled, its waits and budget, until
    it finishes (exit 0 on SUCCESS, 1 otherwise)."""
    from durable.cli._watch import follow

    with _interruptible() as ctrl_c, _client(database_url, schema) as client:
        status = follow(client, workflow_id, _console(), interval, ctrl_c.guard)
    sys.exit(0 if status is WorkflowStatus.SUCCESS else 1)


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
    state, tool calls, conversation, and the operator actions on it (the audit log)."""
    _show_full(full)
    with _client(database_url, schema) as client:
        tools = client.tool_calls(workflow_id)
        turns = client.conversation(workflow_id)
        events = client.events(workflow_id)
        info = client.get_workflow(workflow_id)
        steps = client.steps(workflow_id)
        effects = client.effects(workflow_id)
        state_text = client.state_text(workflow_id)
        budget = client.budget(workflow_id)
        wait = client.worker_wait(workflow_id)
        audited = client.audit_log(workflow_id, limit=50)
    orphan = wait["waiting"]
    label = workflow_label(info.name, info.version)
    live = [workflow_label(info.name, v) for v in wait["live_versions"]]
    state = None if state_text is None else json.loads(state_text)
    if as_json:
        data = _info_dict(info) | {
            "waiting_for_worker": orphan,
            "live_versions": wait["live_versions"],
            "state": state,
            "budget": None
            if budget is None
            else {k: budget[k] for k in ("budget_id", "limits", "spent")},
            "inputs": json_value(info.inputs, info.serializer),
            "output": json_value(info.output, info.serializer),
            "error": json.loads(info.error) if info.error else None,
            "steps": [
                {
                    "step_seq": s.step_seq,
                    "step_name": s.step_name,
                    "kind": s.kind.value,
                    "output": json_value(s.output, info.serializer),
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
                    "result": json_value(e["result"], info.serializer),
                    "error": json.loads(e["error"]) if e["error"] else None,
                    "attempts": e["attempts"],
                    "reconciled": e["reconciled"],
                    "undone_by": e["undone_by"],
                }
                for e in effects
            ],
            "audit": audited,
        }
        click.echo(json.dumps(data, indent=2, default=str))
        return
    console = _console()
    console.print(f"{info.workflow_id}  {info.name}  {info.status.value}", style="bold")
    if orphan:
        served = (
            f"live workers serve {', '.join(live)}"
            if live
            else f"no live worker serves any version of {info.name}"
        )
        console.print(f"waiting for a worker with {label}; {served}")
        if live:
            console.print(f"move it: durable workflows resume {info.workflow_id} --version V")
    if info.status is WorkflowStatus.PAUSED:
        console.print(f"paused: durable workflows unpause {info.workflow_id} lets it go on")
    elif info.pause_requested:
        console.print("pause requested: it stops at its next step")
    console.print(f"inputs: {_short(info.inputs, 200)}")
    if info.attributes:
        console.print(f"attributes: {_short(shown_attributes(info.attributes), 400)}")
    console.print(f"durability: {info.durability}  epoch: {info.epoch}  owner: {info.owner or '-'}")
    if info.output is not None:
        console.print(f"output: {_short(info.output, 200)}")
    if info.error is not None:
        etype, message, trace = decode_error(info.error)
        console.print(f"error: {etype}: {message}")
        _print_trace(console, trace, full)
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
    for s in steps:
        if s.error is None:
            continue
        trace = decode_error(s.error)[2]
        if info.error is not None and trace.partition("\n")[2] in decode_error(info.error)[2]:
            continue  # the workflow's own traceback, above, ends with it
        console.print(f"step #{s.step_seq} {s.step_name} failed:")
        _print_trace(console, trace, full)
    if effects:
        ledger = Table(
            "#", "effect", "idempotency key", "status", "params", "result", title="effects"
        )
        for e in effects:
            status = e["status"] + (" (reconciled)" if e["reconciled"] else "")
            if e["undone_by"] is not None:
                status += f", undone by {e['undone_by']}"
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
    if audited:
        console.print(audit_table(audited, "operator actions (newest first)"))


def _print_trace(console: Any, trace: str, full: bool) -> None:
    """A stored traceback: the user's frames first and durable's folded (--full: as
    stored)."""
    if not trace:
        return
    lines = trace.rstrip("\n").split("\n") if full else fold(trace)
    for line in lines:
        console.print(line, soft_wrap=True)
    if not full and any(x.endswith(" in durable …") for x in lines):
        console.print("(--full shows durable's frames too)")


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
@click.option(
    "--version",
    "version",
    default=None,
    help="Move it to this version of its code ('' for no version): a stopped workflow is "
    "resumed under it, one waiting for a worker is recorded under it; workers of that "
    "version replay its journal.",
)
@url_option
@schema_option
@_handle_errors
def resume(workflow_id: str, version: str | None, database_url: str | None, schema: str) -> None:
    """Run a cancelled, failed or given-up workflow again from its journal (any worker
    picks it up; completed steps are not run again), or with --version move a workflow to
    other code: one stopped, or one waiting for a worker, a queue slot or its wake-up."""
    with _client(database_url, schema) as client:
        row = client._resume(workflow_id, version=version)
        if row and version is None:
            click.echo(inert(f"resumed {workflow_id}: a worker will pick it up"))
            return
        if row:
            label = workflow_label(row["name"], row["version"])
            after = (
                f"it waits for its wake-up, then a worker with {label} runs it"
                if row["status"] == WorkflowStatus.SUSPENDED
                else f"a worker with {label} will pick it up ({row['status']})"
            )
            click.echo(inert(f"moved {workflow_id} to {label}: {after}"))
            wait = client.worker_wait(workflow_id)
            if label not in [workflow_label(row["name"], v) for v in wait["live_versions"]]:
                click.echo(inert(f"note: no live worker has {label} yet"), err=True)
            return
        status = client.get_workflow(workflow_id).status
    if status is WorkflowStatus.SUCCESS:
        click.echo(inert(f"{workflow_id} already succeeded: nothing to resume"))
    else:
        click.echo(inert(f"{workflow_id} is {status}: it is still going, nothing to resume"))


@workflows.command("pause")
@click.argument("workflow_id")
@url_option
@schema_option
@_handle_errors
def pause(workflow_id: str, database_url: str | None, schema: str) -> None:
    """Hold a workflow where it is until `unpause`: a running one stops at its next step
    boundary, a queued, runnable or waiting one at once; no worker takes it meanwhile."""
    with _client(database_url, schema) as client:
        status = client.pause(workflow_id)
    if status is WorkflowStatus.PAUSED:
        click.echo(inert(f"paused {workflow_id}: `durable workflows unpause` lets it go on"))
    else:
        click.echo(inert(f"pause requested for {workflow_id}: it stops at its next step"))


@workflows.command("unpause")
@click.argument("workflow_id")
@url_option
@schema_option
@_handle_errors
def unpause(workflow_id: str, database_url: str | None, schema: str) -> None:
    """Let a paused workflow go on where it stopped (a worker replays its journal; no
    completed step runs again)."""
    with _client(database_url, schema) as client:
        before = client.get_workflow(workflow_id)
        status = client.unpause(workflow_id)
    if before.status is WorkflowStatus.PAUSED or before.pause_requested:
        click.echo(inert(f"unpaused {workflow_id} (now {status}): a worker will go on with it"))
    else:
        click.echo(inert(f"{workflow_id} is {status}: it is not paused, nothing to unpause"))


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
@click.option(
    "--version",
    "version",
    default=None,
    help="Record the fork under this version of its code ('' for no version; default: "
    "the original's).",
)
@url_option
@schema_option
@_handle_errors
def fork(
    workflow_id: str,
    from_step: int,
    new_id: str | None,
    version: str | None,
    database_url: str | None,
    schema: str,
) -> None:
    """Start a new workflow with the same inputs, reusing the journal before a step."""
    with _client(database_url, schema) as client:
        handle = client.fork(workflow_id, from_step=from_step, new_id=new_id, version=version)
    said = (
        f"forked {workflow_id} from step {from_step} as {handle.workflow_id}: steps before it "
        "are reused, the rest run anew on a worker"
    )
    if sys.stdout.isatty():  # a person: one sentence, in the order it is read
        click.echo(inert(said))
        return
    click.echo(handle.workflow_id)  # a script: the id alone on stdout, the sentence beside it
    click.echo(inert(said), err=True)


@workflows.command("export")
@click.argument("workflow_id")
@click.option("--children", is_flag=True, help="Export the workflows it started too, at any depth.")
@url_option
@schema_option
@_handle_errors
def export(workflow_id: str, children: bool, database_url: str | None, schema: str) -> None:
    """Print a workflow's stored rows as JSON (journal, effects, gates, messages, events,
    streams, budget), to import into another database with `durable workflows import`."""
    with _client(database_url, schema) as client:
        data = client.export_workflow(workflow_id, children=children)
    click.echo(json.dumps(data, indent=2))
    count = len(data["workflow_ids"])
    steps = len(data["tables"]["steps"])
    click.echo(
        inert(
            f"exported {count} workflow(s) with {steps} journal row(s), root {workflow_id}: "
            "import them elsewhere with `durable workflows import FILE`"
        ),
        err=True,
    )


@workflows.command("import")
@click.argument("file", type=click.File("r", encoding="utf-8"))
@url_option
@schema_option
@_handle_errors
def import_cmd(file: TextIO, database_url: str | None, schema: str) -> None:
    """Store the workflows of FILE (what `durable workflows export` printed; - reads
    stdin) in this database, all or nothing. Prints the ids imported."""
    try:
        data = json.load(file)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExportFormatError(f"{file.name} is not JSON ({exc})") from None
    with _client(database_url, schema) as client:
        ids = client.import_workflow(data)
        statuses = [client.get_workflow(i).status for i in ids]
    unfinished = sum(not status.is_terminal for status in statuses)
    click.echo(
        inert(
            f"imported {len(ids)} workflow(s), {unfinished} unfinished (a worker with their "
            "code takes them up; `durable workflows fork ID --from-step N` runs a finished "
            "one again); their ids are:"
        ),
        err=True,
    )
    for workflow_id in ids:
        click.echo(workflow_id)


@click.command()
@click.argument("workflow_id")
@click.argument("message")
@click.option("--topic", default=None)
@click.option("--key", "idempotency_key", default=None, help="Idempotency key: deliver once.")
@click.option(
    "--before-start",
    is_flag=True,
    help="No workflow has the id yet: keep the message for the one that starts under it.",
)
@url_option
@schema_option
@_handle_errors
def send(
    workflow_id: str,
    message: str,
    topic: str | None,
    idempotency_key: str | None,
    before_start: bool,
    database_url: str | None,
    schema: str,
) -> None:
    """Send MESSAGE (JSON, or else a string) to a workflow waiting in durable.recv(); one
    that has finished receives nothing more, so that is an error (exit code 1)."""
    try:
        value: Any = json.loads(message)
    except json.JSONDecodeError:
        value = message
    with _client(database_url, schema) as client:
        try:
            status = client.get_workflow(workflow_id).status
        except WorkflowNotFoundError:
            status = None  # send says so, unless --before-start keeps it for the workflow
        if status is not None and status.is_terminal:
            click.echo(
                inert(
                    f"error: workflow {workflow_id!r} has already finished ({status}): "
                    "nothing will receive the message, so it was not sent"
                ),
                err=True,
            )
            sys.exit(1)
        client.send(
            workflow_id,
            value,
            topic=topic,
            idempotency_key=idempotency_key,
            before_start=before_start,
        )
    click.echo(inert(f"sent to {workflow_id}"))
