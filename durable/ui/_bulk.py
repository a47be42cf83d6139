"""The console's bulk actions and attribute filter: the list page's filter as a RunFilter,
the page that counts what a bulk action would act on (GET /bulk, with the list's filter
in its query) and offers to confirm it, and the confirmed action (POST /actions/bulk,
checked as every action is: CSRF, the token, the audit log's actor).

The count is shown before anything is done: the confirm form carries the filter, not a
list of ids, so what is acted on is what matches when the operator confirms (a run that
stopped meanwhile is no longer acted on; one started since, matching, is). Client.bulk
does the rest: batches, a second run that does nothing, an audit row per run.
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from durable._client.bulk import ACTIONS
from durable._client.client import Client
from durable._run.filter import RunFilter
from durable.errors import DatabaseUnavailableError, DurableError

#: The list page's filter fields a bulk action carries over.
FIELDS = ("status", "name", "id", "from", "to", "attr", "children")
SAMPLE = 20


class Console(Protocol):
    """What the bulk page uses of the console."""

    client: Client
    read_only: bool

    def render(
        self, request: Request, name: str, status: int = 200, **context: Any
    ) -> Response: ...

    def message(self, request: Request, text: str, status: int, back: str = "") -> Response: ...


def attribute_filter(text: str) -> RunFilter | None:
    """The list page's attribute field: expressions separated by spaces, quoted as a shell
    quotes them (`customer="Acme Inc" amount>=100`); None when empty."""
    expressions = shlex.split(text or "")
    return RunFilter.parse(expressions) if expressions else None


def time_field(text: str | None) -> dt.datetime | None:
    """A time from a filter field (ISO 8601; without a zone, UTC)."""
    if not text:
        return None
    value = dt.datetime.fromisoformat(text.strip())
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def run_filter(fields: Mapping[str, str]) -> RunFilter:
    """The RunFilter of the list page's fields (as the list reads them: top-level runs
    unless children are listed as rows)."""
    attributes = attribute_filter(fields.get("attr", "")) or RunFilter()
    status = fields.get("status", "").strip().upper()
    return RunFilter(
        status=status or None,
        name=fields.get("name", "").strip() or None,
        id_prefix=fields.get("id", "").strip() or None,
        created_from=time_field(fields.get("from", "")),
        created_to=time_field(fields.get("to", "")),
        top_level=fields.get("children", "") != "1",
        attributes=attributes.attributes,
        ranges=attributes.ranges,
    )


def bulk_page(console: Console) -> Callable[[Request], Awaitable[Response]]:
    """GET /bulk?action=...&<the list's filter>: the count and a sample of what the action
    would act on, and (signed in) the form that confirms it."""

    async def page(request: Request) -> Response:
        q = request.query_params
        fields = {k: q.get(k, "").strip() for k in FIELDS}
        action = q.get("action", "")
        back = "/workflows?" + urlencode({k: v for k, v in fields.items() if v})
        if action not in ACTIONS:
            return console.message(
                request, f"no such bulk action {action!r}: {', '.join(ACTIONS)}", 400, back
            )
        if q.get("q"):
            return console.message(
                request,
                "a bulk action takes the list's filters but not its search text: clear the "
                "search and filter by status, name, id, time or attributes",
                400,
                back,
            )
        version = q.get("version")
        try:
            chosen = run_filter(fields)
            result = await run_in_threadpool(
                lambda: console.client.bulk(
                    action,
                    chosen,
                    dry_run=True,
                    sample=SAMPLE,
                    version=(version or "") if action == "move" else None,
                )
            )
        except DatabaseUnavailableError:
            raise
        except (ValueError, DurableError) as exc:
            return console.message(request, f"bad filter: {exc}", 400, back)
        return console.render(
            request,
            "bulk.html",
            action=action,
            version=version or "",
            fields=fields,
            described=" ".join(f"{k}={v}" for k, v in fields.items() if v) or "every run",
            result=result,
            back=back,
        )

    return page


def bulk_action(client: Client, form: dict[str, str]) -> str:
    """The confirmed bulk action (POST /actions/bulk): what it did, for the operator."""
    action = form["action"]
    version = form.get("version", "").strip() if action == "move" else None
    result = client.bulk(
        action,
        run_filter(form),
        version=version,
        reason=form.get("reason") or "cancelled in bulk from the console",
    )
    refused = f"; refused: {len(result.refused)}" if result.refused else ""
    return (
        f"{action}: {result.changed} run(s) changed, {result.unchanged} already done"
        f"{refused} (of {result.matched} matched)"
    )
