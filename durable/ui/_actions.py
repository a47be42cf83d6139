"""The console's actions: each reads its fields from a checked form, calls the Client (in a
thread, as the operator the console names: see _client/audit.py) and returns what to tell the
operator. The form never names who acts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from durable._base.models import WorkflowStatus
from durable._base.names import workflow_label
from durable._client.audit import acting_as
from durable._client.client import Client
from durable.ui._bulk import bulk_action


def _decide(client: Client, form: dict[str, str]) -> str:
    approve = form["decision"] == "approve"
    if form["decision"] not in ("approve", "deny"):
        raise ValueError(f"decision={form['decision']!r}: approve or deny")
    client.decide(
        form["workflow_id"],
        form["name"],
        approve,
        comment=form.get("comment") or None,
        decided_by=form.get("by") or "console",
    )
    verb = "approved" if approve else "denied"
    return f"{verb} {form['name']} of {form['workflow_id']}"


_CANCELLABLE = frozenset(
    {WorkflowStatus.ENQUEUED, WorkflowStatus.PENDING, WorkflowStatus.RUNNING}
    | {WorkflowStatus.SUSPENDED, WorkflowStatus.PAUSED}
)
_RESUMABLE = frozenset(
    {WorkflowStatus.CANCELLED, WorkflowStatus.ERROR, WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED}
)


def _cancel(client: Client, form: dict[str, str]) -> str:
    workflow_id = form["workflow_id"]
    status = client.cancel(workflow_id, form.get("reason") or "cancelled from the console")
    if status.is_terminal and status is not WorkflowStatus.CANCELLED:
        return f"{workflow_id} already finished ({status.value}): nothing to cancel"
    return f"cancel requested for {workflow_id} (now {status.value})"


def _terminate(client: Client, form: dict[str, str]) -> str:
    """Client.terminate: CANCELLED now, no compensation, pending effects as they are."""
    workflow_id = form["workflow_id"]
    if form.get("confirm") != workflow_id:
        raise ValueError(
            f"a terminate undoes nothing: type the workflow's id ({workflow_id}) to confirm"
        )
    before = client.get_workflow(workflow_id).status
    if before.is_terminal:
        return f"{workflow_id} already finished ({before.value}): nothing to terminate"
    status = client.terminate(workflow_id, form.get("reason") or "terminated from the console")
    if status is not WorkflowStatus.CANCELLED:  # it finished meanwhile
        return f"{workflow_id} finished first ({status.value}): nothing to terminate"
    return f"terminated {workflow_id}: CANCELLED, no compensation ran"


def _send(client: Client, form: dict[str, str]) -> str:
    """Client.send: a JSON body on a topic (none: the default topic), audited as a send."""
    workflow_id, topic = form["workflow_id"], form.get("topic", "").strip() or None
    try:
        body = json.loads(form["body"], parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f'the message body is not JSON ({exc}): quote a text, "like this"'
        ) from None
    with_key = form.get("key", "").strip() or None
    client.send(workflow_id, body, topic, with_key)
    return f"sent {workflow_id} a message" + (f" on {topic}" if topic else "")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _raise_budget(client: Client, form: dict[str, str]) -> str:
    """Client.raise_budget by the amounts given (blank: that limit unchanged)."""
    amounts: dict[str, Any] = {}
    for key, kind in (("dollars", float), ("tokens", int), ("steps", int), ("seconds", float)):
        text = form.get(key, "").strip()
        if text:
            try:
                amounts[key] = kind(text)
            except ValueError:
                raise ValueError(f"{key}={text!r}: give a number") from None
    if not amounts:
        raise ValueError("give an amount to add: dollars, tokens, steps or seconds")
    client.raise_budget(form["workflow_id"], **amounts, decided_by="console")
    added = ", ".join(f"{v} {k}" for k, v in amounts.items())
    return f"raised the budget of {form['workflow_id']} by {added}"


def _resume(client: Client, form: dict[str, str]) -> str:
    """Resume, or with a version in the form move the workflow to it (a blank field keeps
    its version; moving to no version is the CLI's `--version ''`)."""
    workflow_id = form["workflow_id"]
    version = form.get("version", "").strip() or None
    row = client._resume(workflow_id, version=version)
    if row and version is not None:
        return f"moved {workflow_id} to {workflow_label(row['name'], row['version'])}"
    if row:
        return f"resumed {workflow_id}"
    status = client.get_workflow(workflow_id).status
    if status is WorkflowStatus.SUCCESS:
        return f"{workflow_id} already succeeded: nothing to resume"
    return f"{workflow_id} is {status.value}: it is still going, nothing to resume"


def _pause(client: Client, form: dict[str, str]) -> str:
    workflow_id = form["workflow_id"]
    status = client.pause(workflow_id)
    if status is WorkflowStatus.PAUSED:
        return f"paused {workflow_id}: no worker takes it until it is unpaused"
    return f"pause requested for {workflow_id}: it stops at its next step"


def _unpause(client: Client, form: dict[str, str]) -> str:
    workflow_id = form["workflow_id"]
    status = client.unpause(workflow_id)
    return f"unpaused {workflow_id} (now {status.value})"


def _fork(client: Client, form: dict[str, str]) -> str:
    handle = client.fork(form["workflow_id"], from_step=int(form["from_step"]))
    return f"forked {form['workflow_id']} from step {form['from_step']} as {handle.workflow_id}"


def _schedule(client: Client, form: dict[str, str]) -> str:
    if form["paused"] not in ("0", "1"):
        raise ValueError(f"paused={form['paused']!r}: 1 pauses, 0 resumes")
    paused = form["paused"] == "1"
    client.pause_schedule(form["name"], paused)
    return f"{'paused' if paused else 'resumed'} schedule {form['name']}"


def _delete_schedule(client: Client, form: dict[str, str]) -> str:
    client.delete_schedule(form["name"])
    return f"deleted schedule {form['name']}: it fires no more; the runs of its ticks are kept"


_ACTIONS: dict[str, Callable[[Client, dict[str, str]], str]] = {
    "decide": _decide,
    "cancel": _cancel,
    "terminate": _terminate,
    "send": _send,
    "raise-budget": _raise_budget,
    "resume": _resume,
    "pause": _pause,
    "unpause": _unpause,
    "fork": _fork,
    "schedule": _schedule,
    "delete-schedule": _delete_schedule,
    "bulk": bulk_action,
}


def _acting(
    actor: str,
    action: Callable[[Client, dict[str, str]], str],
    client: Client,
    form: dict[str, str],
) -> str:
    """An action, recorded in the audit log as `actor`'s (run in a worker thread)."""
    with acting_as(actor):
        return action(client, form)
