"""`durable workflows bulk ACTION`: cancel, resume, retry or move every run a filter
matches (Client.bulk).

It counts first: --dry-run prints the count and a sample and stops; without --yes it
prints them and asks before acting (a terminal only: elsewhere --yes is required). Then
it acts in batches, each run recorded in the audit log; run again after an interruption,
it does nothing twice.
"""

from __future__ import annotations

import datetime as dt
import json
import sys

import click

from durable._base.models import WorkflowStatus
from durable._base.terminal import inert
from durable._client.bulk import ACTIONS, BulkResult
from durable._run.filter import RunFilter
from durable.cli._common import _client, _console, _handle_errors
from durable.cli._options import attr_option, json_option, schema_option, url_option


def _when(_ctx: click.Context, _param: click.Parameter, value: str | None) -> dt.datetime | None:
    if value is None:
        return None
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give an ISO time, e.g. 2026-01-31T00:00Z") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def _result_dict(result: BulkResult) -> dict[str, object]:
    return {
        "action": result.action,
        "dry_run": result.dry_run,
        "matched": result.matched,
        "changed": result.changed,
        "unchanged": result.unchanged,
        "refused": result.refused,
        "started": list(result.started),
        "sample": [
            {"workflow_id": i.workflow_id, "name": i.name, "status": i.status.value}
            for i in result.sample
        ],
    }


@click.command("bulk")
@click.argument("action", type=click.Choice(list(ACTIONS)))
@url_option
@schema_option
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([s.value for s in WorkflowStatus], case_sensitive=False),
    help="Only runs in this status (repeat for several); cut to those the action changes.",
)
@click.option("--name", default=None, help="Only runs of this workflow name.")
@click.option("--version", default=None, help="Only runs of this version ('' for none).")
@click.option("--parent", default=None, help="Only the runs this workflow started.")
@attr_option
@click.option("--created-from", default=None, callback=_when, help="Created at or after (ISO).")
@click.option("--created-to", default=None, callback=_when, help="Created before (ISO).")
@click.option("--to-version", default=None, help="move: the version to move the runs to.")
@click.option("--reason", default="cancelled in bulk from the command line", show_default=True)
@click.option("--batch-size", default=100, show_default=True, type=click.IntRange(1, 1000))
@click.option("--dry-run", is_flag=True, help="Count and list a sample; change nothing.")
@click.option("--yes", is_flag=True, help="Act without asking.")
@json_option
@_handle_errors
def bulk(
    action: str,
    database_url: str | None,
    schema: str,
    statuses: tuple[str, ...],
    name: str | None,
    version: str | None,
    parent: str | None,
    attrs: tuple[str, ...],
    created_from: dt.datetime | None,
    created_to: dt.datetime | None,
    to_version: str | None,
    reason: str,
    batch_size: int,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Cancel, resume, retry (fork from the start) or move (--to-version) every run the
    filter matches: counted first, then acted on in batches, each audited."""
    chosen = RunFilter.parse(
        attrs,
        status=tuple(s.upper() for s in statuses) or None,
        name=name,
        version=version,
        parent_id=parent,
        created_from=created_from,
        created_to=created_to,
    )
    if action == "move" and to_version is None:
        raise click.UsageError("bulk move needs --to-version V ('' for no version)")
    moved_to = to_version if action == "move" else None
    with _client(database_url, schema) as client:
        counted = client.bulk(action, chosen, dry_run=True, version=moved_to)
        if dry_run or counted.matched == 0:
            _report(counted, as_json)
            return
        if not yes:
            if not sys.stdin.isatty():
                raise click.UsageError(
                    f"{counted.matched} run(s) match: give --yes to {action} them "
                    "(or --dry-run to list them)"
                )
            _report(counted, False)
            click.confirm(f"{action} {counted.matched} run(s)?", abort=True)
        result = client.bulk(action, chosen, version=moved_to, reason=reason, batch_size=batch_size)
    _report(result, as_json)


def _report(result: BulkResult, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(_result_dict(result), indent=2))
        return
    if result.dry_run:
        click.echo(f"{result.matched} run(s) match; {result.action} would act on them")
        for info in result.sample:
            click.echo(inert(f"  {info.workflow_id}  {info.name}  {info.status.value}"))
        return
    click.echo(
        f"{result.action}: {result.changed} changed, {result.unchanged} already done, "
        f"{len(result.refused)} refused (of {result.matched} matched)"
    )
    for workflow_id, why in result.refused.items():
        _console().print(f"  refused {workflow_id}: {why}")
