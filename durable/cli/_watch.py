"""Live progress in the terminal: follow one workflow as its journal grows, or keep a
workflow table fresh.

Between looks a watcher waits on `Client._notifications()` (LISTEN on the work channel:
wake-ups, decisions, messages, cancels, resumes), so those show at once; journal writes send
no notification (a step stays one round trip), so the journal is polled every `interval`
seconds too, and a lost LISTEN connection only means polling.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Column, Table

from durable._base.models import StepRecord, WorkflowInfo, WorkflowStatus
from durable._base.names import workflow_label
from durable._client.client import Client
from durable._core import decode_error
from durable._run.attributes import shown as shown_attributes

# A watch's wait between looks: seconds -> whether a notification came (a watcher looks
# again either way; it only needs to know that the wait is over).
Wait = Callable[[float], bool]


def _preview(text: str | None, width: int = 60) -> str:
    if text is None:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


def _step_line(step: StepRecord) -> str:
    took = ""
    if step.started_at is not None and step.finished_at is not None:
        took = f" {(step.finished_at - step.started_at).total_seconds() * 1000:.0f} ms"
    retried = f" ({step.attempts} attempts)" if step.attempts > 1 else ""
    result = (
        "error " + _preview(decode_error(step.error)[1]) if step.error else _preview(step.output)
    )
    child = f" -> {step.child_workflow_id}" if step.child_workflow_id else ""
    return f"  #{step.step_seq} {step.kind.value} {step.step_name}{child}{retried}{took}: {result}"


def _budget_line(budget: dict[str, Any]) -> str:
    parts = []
    for key in ("dollars", "tokens", "steps"):
        limit = budget["limits"][key]
        spent = budget["spent"][key]
        parts.append(f"{key} {spent}" + ("" if limit is None else f"/{limit}"))
    return "  budget: " + ", ".join(parts)


def follow(
    client: Client,
    workflow_id: str,
    console: Console,
    interval: float = 0.5,
    guard: Callable[[Wait], Wait] = lambda wait: wait,
) -> WorkflowStatus:
    """Print a workflow's steps as they are journaled, its waits and budget, until it
    finishes; returns its final status. `guard` wraps the wait between looks (the CLI's
    Ctrl-C is taken there)."""
    info = client.get_workflow(workflow_id)  # WorkflowNotFoundError before anything prints
    console.print(f"{info.workflow_id}  {info.name}  {info.status.value}", style="bold")
    shown = 0
    said: dict[str, str] = {"status": info.status.value}
    with client._notifications() as notified:
        wait = guard(notified.woken)
        while True:
            info = client.get_workflow(workflow_id)
            steps = client.steps(workflow_id)
            for step in steps[shown:]:
                console.print(_step_line(step))
            shown = max(shown, len(steps))
            if info.status.value != said["status"]:
                said["status"] = info.status.value
                console.print(f"  status: {info.status.value}")
            if info.status is WorkflowStatus.RUNNING:
                moment, line = running_line(info, steps)
                if said.get("running") != moment:
                    said["running"] = moment
                    console.print(line)
            else:
                said.pop("running", None)
            if info.status is WorkflowStatus.SUSPENDED:
                gates = client.list_approvals(workflow_id)
                waits = ", ".join(
                    f"approval {g['name']!r} payload {_preview(g['payload'], 40)}" for g in gates
                )
                _say(console, said, "wait", f"  waiting: {waits or 'a sleep, message or child'}")
            budget = client.budget(workflow_id)
            if budget is not None:
                _say(console, said, "budget", _budget_line(budget))
            if info.status.is_terminal:
                break
            wait(interval)
    outcome = info.output if info.output is not None else ""
    if info.error:
        kind, message, _ = decode_error(info.error)
        outcome = f"{kind}: {message}"
    console.print(f"{info.status.value} {_preview(outcome, 200)}", style="bold")
    return info.status


# When the running line is said again: as its time passes each of these (in seconds), then
# every hour, so a long step shows it is still going without a line per look.
_MILESTONES = (0, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)


def _took(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def running_line(
    info: WorkflowInfo, steps: list[StepRecord], now: dt.datetime | None = None
) -> tuple[str, str]:
    """What a running workflow is doing: the step at the position after its journal (its
    name is journaled when it ends) and how long it has run, since the last journaled step
    ended or the run began. With the line, a key that changes only with the step and as
    its time passes a milestone (1s, 2s, 5s, 10s, ... then hourly): the line is said again
    when the key changes, not at every look."""
    now = now or dt.datetime.now(dt.UTC)
    since = info.updated_at
    for step in steps:
        ended = step.finished_at or step.started_at
        if ended is not None and ended > since:
            since = ended
    position = max((s.step_seq for s in steps), default=-1) + 1
    elapsed = max(0.0, (now - since).total_seconds())
    passed = (
        max(m for m in _MILESTONES if m <= elapsed) if elapsed < 3600 else elapsed // 3600 * 3600
    )
    after = f" (after #{steps[-1].step_seq} {steps[-1].step_name})" if steps else ""
    return f"{position}:{passed}", f"  running: step #{position}{after}, for {_took(elapsed)}"


def _say(console: Console, said: dict[str, str], key: str, line: str) -> None:
    """Print a line only when it changed since it was last said."""
    if said.get(key) != line:
        said[key] = line
        console.print(line)


def workflow_table(infos: list[Any], *, full_ids: bool = False) -> Table:
    """Workflows as rows; a "waits for worker" column (only when some row needs it) marks
    those that wait for a worker with their name and version, which no live worker has.
    `full_ids`: the id column is as wide as the longest id, so no id is shortened or
    broken over lines (print it with `widened`)."""
    waiting = any(i.waiting_for_worker for i in infos)
    attributed = any(i.attributes for i in infos)
    widest = max((len(i.workflow_id) for i in infos), default=2)
    first = Column("id", no_wrap=True, min_width=widest) if full_ids else "id"
    columns = ["name", "status", "epoch", "created", "finished"]
    extra = (["attributes"] if attributed else []) + (["waits for worker"] if waiting else [])
    table = Table(first, *columns, *extra)
    for i in infos:
        label = workflow_label(i.name, i.version)
        table.add_row(
            i.workflow_id,
            label,
            i.status.value,
            str(i.epoch),
            i.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            i.finished_at.strftime("%Y-%m-%d %H:%M:%S") if i.finished_at else "",
            *([shown_attributes(i.attributes)] if attributed else []),
            *([label if i.waiting_for_worker else ""] if waiting else []),
        )
    if waiting:
        table.caption = (
            "waits for worker: no live worker has that name@version. `durable workflows "
            "show ID` names the versions live workers have; `durable workflows resume ID "
            "--version V` moves a workflow to one"
        )
    return table


def widened(console: Console, table: Table) -> Console:
    """The console, made wide enough for the whole table (lines longer than the terminal:
    what `--full-ids` asks for)."""
    natural = Console(width=100_000).measure(table).maximum
    console.width = max(console.width, natural)
    return console


def refresh(
    client: Client,
    read: Callable[[], Table],
    console: Console,
    interval: float = 2.0,
    guard: Callable[[Wait], Wait] = lambda wait: wait,
) -> None:
    """Redraw a table every `interval` seconds (and on wake-ups) until interrupted; on a
    terminal in place, elsewhere (a pipe, a log) one table after another. `guard` wraps
    the wait between looks (the CLI's Ctrl-C is taken there)."""
    with client._notifications() as notified:
        wait = guard(notified.woken)
        if not console.is_terminal:
            while True:
                console.print(read())
                wait(interval)
        with Live(read(), console=console, auto_refresh=False) as live:
            while True:
                wait(interval)
                live.update(read(), refresh=True)
