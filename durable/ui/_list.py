"""The workflows list's sorting and paging, the running step of each running row, a
workflow's JSON export (a POST, checked as every action is), and the database the header
names.

Sorting: `sort` is a column (created, updated, status, name), with a leading "-" for
descending; the default, "-created", pages by keyset (the last row's created_at and id)
and walks one index; any other order pages by offset (`offset`), the rows sorted by
Client.list_workflows in the database.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from durable._base.models import WorkflowInfo, WorkflowStatus
from durable._base.urls import redact
from durable._client.client import Client
from durable._client.reading import SORTS
from durable.errors import DatabaseUnavailableError, DurableError, WorkflowNotFoundError
from durable.ui._timeline import human_duration

DEFAULT_SORT = "-created"
#: What a column's first click sorts by: times newest first, text A to Z.
FIRST = {"created": "-created", "updated": "-updated", "status": "status", "name": "name"}


class Console(Protocol):
    """What these routes use of the console."""

    client: Client

    def message(self, request: Request, text: str, status: int, back: str = "") -> Response: ...

    async def permitted(self, request: Request) -> tuple[dict[str, str], Response | None]: ...


def parse_sort(text: str | None) -> tuple[str, bool]:
    """(column, descending) of a `sort` parameter; ValueError naming the choices."""
    value = (text or DEFAULT_SORT).strip()
    column = value.removeprefix("-")
    if column not in SORTS:
        choices = ", ".join(SORTS)
        raise ValueError(f"sort={value!r}: sort by {choices} (a leading '-' for descending)")
    return column, value.startswith("-")


def sort_links(kept: Mapping[str, str], sort: str, descending: bool) -> dict[str, Any]:
    """Each column's header link (its query string, the filters kept, the page reset) and
    the arrow of the column sorted by."""
    current = ("-" if descending else "") + sort
    links = {}
    for column, first in FIRST.items():
        if column == sort:  # a second click turns the order round
            chosen = column if descending else f"-{column}"
        else:
            chosen = first
        query = dict(kept) | ({} if chosen == DEFAULT_SORT else {"sort": chosen})
        links[column] = {
            "query": urlencode(query),
            "arrow": ("↓" if descending else "↑") if column == sort else "",
            "current": current,
        }
    return links


def offset_param(text: str | None) -> int:
    value = int(text or 0)
    if value < 0:
        raise ValueError(f"offset={value}: give 0 or more")
    return value


def running(client: Client, infos: list[WorkflowInfo], now: dt.datetime) -> dict[str, Any]:
    """The running step of each RUNNING row, for people: {id: {label, elapsed, title}}."""
    ids = [i.workflow_id for i in infos if i.status is WorkflowStatus.RUNNING]
    return {k: describe_step(v, now) for k, v in client.running_steps(ids).items()}


def describe_step(row: Mapping[str, Any], now: dt.datetime) -> dict[str, str]:
    """The call a running workflow is at: its position, the call before it, how long."""
    after = f" after {row['previous_step']}" if row["previous_step"] else ""
    elapsed = human_duration((now - row["since"]).total_seconds())
    title = "the name of a step under way is recorded when it is journaled"
    if row["heartbeat_at"] is not None:
        beat = human_duration((now - row["heartbeat_at"]).total_seconds())
        title = f"attempt {row['attempt']}, last heartbeat {beat} ago"
    return {"label": f"#{row['step_seq']}{after}", "elapsed": elapsed, "title": title}


def database_name(client: Client) -> str:
    """The database the console shows, its password hidden ("" if it cannot say)."""
    try:
        return redact(client.database_url)
    except (DurableError, OSError, ValueError):
        return ""


def export_route(console: Console) -> Callable[[Request], Awaitable[Response]]:
    """POST /export: a workflow's export (Client.export_workflow, its descendants with
    children=1) as a JSON download. A POST checked as actions are (CSRF, the token), since
    it carries every stored value of the run at once."""

    async def export(request: Request) -> Response:
        form, refused = await console.permitted(request)
        if refused is not None:
            return refused
        workflow_id = form.get("workflow_id", "")
        back = f"/workflows/{workflow_id}"
        try:
            data = await run_in_threadpool(
                console.client.export_workflow, workflow_id, children=form.get("children") == "1"
            )
        except DatabaseUnavailableError:
            raise
        except WorkflowNotFoundError as exc:
            return console.message(request, f"not exported: {exc}", 404, back)
        except (DurableError, ValueError) as exc:
            return console.message(request, f"not exported: {exc}", 400, back)
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in workflow_id)[:100]
        return Response(
            json.dumps(data, indent=2, ensure_ascii=False),
            media_type="application/json",
            headers={
                "Content-Disposition": f'attachment; filename="{name or "workflow"}.json"',
                "Cache-Control": "no-store",
                "X-Content-Type-Options": "nosniff",
            },
        )

    return export
