"""An MCP (Model Context Protocol) server over a durable.Client: what a coding assistant
reads and, with the operator token, does (`pip install 'durable-pg[mcp]'`).

    durable mcp --database-url postgresql://...                # reads only
    DURABLE_UI_TOKEN=... durable mcp --database-url ...        # and the operator actions
    durable mcp --http --token ...                             # streamable HTTP at /mcp

The read tools list and search workflows (status, name, attributes, a text search), show
one with its decoded inputs and output, its journal, its stored error and traceback, its
events and budget, and the queues, approvals and audit log. The operator actions (cancel,
resume, fork, decide an approval, raise a budget) are offered only to a server given the
console's operator token: without it they are not listed, and a call to one is refused by
name. Each goes through the Client's own operator method, so it is recorded in the audit
log as the server's actor (`user@host via mcp` for `durable mcp`).

Everything goes through Client methods (the server never runs SQL); stored values are
decoded with the client's serializer and every answer is plain JSON.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any

from pydantic import Field

from durable._base.extras import extra
from durable._base.models import StepRecord, WorkflowInfo
from durable._client.client import Client
from durable._core.journal import decode_error
from durable._run.filter import RunFilter
from durable.errors import DurableError

with extra("mcp"):
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

__all__ = ["GUARDED_TOOLS", "READ_TOOLS", "create_server", "http_app"]

READ_TOOLS = (
    "list_workflows",
    "show_workflow",
    "workflow_steps",
    "workflow_error",
    "workflow_events",
    "workflow_budget",
    "list_queues",
    "list_approvals",
    "list_executors",
    "audit_log",
)
GUARDED_TOOLS = (
    "cancel_workflow",
    "resume_workflow",
    "fork_workflow",
    "decide_approval",
    "raise_budget",
)
TOKEN_HINT = (
    "is an operator action: this server was started without the operator token; start "
    "it with --token (or DURABLE_UI_TOKEN) to allow cancel, resume, fork, decide and "
    "raise_budget"
)
INSTRUCTIONS = (
    "Durable workflows journaled in PostgreSQL. Find runs with list_workflows (status "
    "ERROR for the failed ones), then read one with show_workflow, workflow_steps and "
    "workflow_error (its stored traceback). Operator actions, when offered, are recorded "
    "in the audit log."
)

WorkflowId = Annotated[str, Field(min_length=1, max_length=512, description="A workflow id.")]


def _jsonable(value: Any) -> Any:
    """`value` as plain JSON (datetimes and other types as their text)."""
    return json.loads(json.dumps(value, default=str))


class _Server(MCPServer):
    """MCPServer whose operator actions, when not offered, are refused by name."""

    def __init__(self, *args: Any, guarded: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guarded = guarded

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        if name in GUARDED_TOOLS and not self._guarded:
            raise ToolError(f"{name} {TOKEN_HINT}")
        return await super().call_tool(name, arguments, context)


class _Tools:
    """The tools, over one Client."""

    def __init__(self, client: Client, actor: str | None) -> None:
        self.client = client
        self.actor = actor

    # -- decoding --------------------------------------------------------------------------

    def _value(self, text: str | None) -> Any:
        """A stored value decoded by the client's serializer (its text if it cannot be)."""
        if text is None:
            return None
        try:
            return _jsonable(self.client.serializer.loads(text))
        except Exception:
            return text

    @staticmethod
    def _error(text: str | None) -> dict[str, str] | None:
        if not text:
            return None
        try:
            etype, message, trace = decode_error(text)
        except (ValueError, AttributeError):
            return {"type": "", "message": text, "traceback": ""}
        return {"type": etype, "message": message, "traceback": trace}

    @staticmethod
    def _summary(info: WorkflowInfo) -> dict[str, Any]:
        return {
            "workflow_id": info.workflow_id,
            "name": info.name,
            "version": info.version,
            "status": info.status.value,
            "parent_id": info.parent_id,
            "created_at": info.created_at.isoformat(),
            "finished_at": info.finished_at.isoformat() if info.finished_at else None,
            "attributes": _jsonable(info.attributes),
        }

    def _step(self, s: StepRecord) -> dict[str, Any]:
        return {
            "step_seq": s.step_seq,
            "step_name": s.step_name,
            "kind": s.kind.value,
            "output": self._value(s.output),
            "error": self._error(s.error),
            "attempts": s.attempts,
            "child_workflow_id": s.child_workflow_id,
            "started_at": s.started_at.isoformat() if s.started_at else None,
            "finished_at": s.finished_at.isoformat() if s.finished_at else None,
        }

    # -- reads -----------------------------------------------------------------------------

    def list_workflows(
        self,
        status: str | list[str] | None = None,
        name: str | None = None,
        attributes: dict[str, str | int | float | bool | None] | None = None,
        where: list[str] | None = None,
        search: str | None = None,
        id_prefix: str | None = None,
        parent_id: str | None = None,
        top_level: bool = False,
        limit: Annotated[int, Field(ge=1, le=1000)] = 50,
    ) -> dict[str, Any]:
        """Workflows, newest first. status: any of PENDING, ENQUEUED, RUNNING, SUSPENDED,
        SUCCESS, ERROR, CANCELLED, ... (ERROR for the failed ones). attributes: values each
        must equal; where: conditions such as "amount>=100" or "customer=c-1"; search: text
        in the stored inputs or output (case-insensitive)."""
        statuses = [status] if isinstance(status, str) else status or []
        chosen = RunFilter.parse(
            where or (),
            status=tuple(s.upper() for s in statuses) or None,
            name=name,
            attributes=attributes or {},
            id_prefix=id_prefix,
            parent_id=parent_id,
            top_level=top_level,
        )
        infos = self.client.list_workflows(limit=limit, search=search, filter=chosen)
        return {"workflows": [self._summary(i) for i in infos]}

    def show_workflow(self, workflow_id: WorkflowId) -> dict[str, Any]:
        """One workflow: status, decoded inputs and output, its error (type, message,
        traceback), attributes, how many steps its journal holds, and whether it waits for
        a worker with its code (live_versions: the versions live workers have)."""
        info = self.client.get_workflow(workflow_id)
        steps = self.client.steps(workflow_id)
        wait = self.client.worker_wait(workflow_id)
        return self._summary(info) | {
            "waiting_for_worker": wait["waiting"],
            "live_versions": wait["live_versions"],
            "durability": info.durability,
            "owner": info.owner,
            "epoch": info.epoch,
            "recovery_attempts": info.recovery_attempts,
            "pause_requested": info.pause_requested,
            "inputs": self._value(info.inputs),
            "output": self._value(info.output),
            "error": self._error(info.error),
            "steps": len(steps),
            "failed_steps": [s.step_seq for s in steps if s.error],
        }

    def workflow_steps(self, workflow_id: WorkflowId) -> dict[str, Any]:
        """The journal of one workflow, in call order: each step's name, kind, decoded
        output or error, attempts and times."""
        self.client.get_workflow(workflow_id)  # WorkflowNotFoundError for an unknown id
        return {"steps": [self._step(s) for s in self.client.steps(workflow_id)]}

    def workflow_error(self, workflow_id: WorkflowId) -> dict[str, Any]:
        """Why a workflow failed: its stored error with the traceback, and the steps that
        recorded an error."""
        info = self.client.get_workflow(workflow_id)
        failed = [self._step(s) for s in self.client.steps(workflow_id) if s.error]
        return {
            "workflow_id": workflow_id,
            "status": info.status.value,
            "error": self._error(info.error),
            "failed_steps": failed,
        }

    def workflow_events(self, workflow_id: WorkflowId) -> dict[str, Any]:
        """The events the workflow published (durable.set_event), latest value by key."""
        self.client.get_workflow(workflow_id)
        return {"events": _jsonable(self.client.events(workflow_id))}

    def workflow_budget(self, workflow_id: WorkflowId) -> dict[str, Any]:
        """The budget the workflow draws from: limits, spent and every charge (null if it
        has none)."""
        return {"budget": _jsonable(self.client.budget(workflow_id))}

    def list_queues(self) -> dict[str, Any]:
        """Every queue with entries: how many wait for a slot, hold one, have finished."""
        return {"queues": _jsonable(self.client.queues())}

    def list_approvals(
        self, workflow_id: str | None = None, waiting_only: bool = True
    ) -> dict[str, Any]:
        """Approval gates (the waiting ones unless waiting_only is false)."""
        rows = self.client.list_approvals(workflow_id or None, waiting_only=waiting_only)
        return {"approvals": _jsonable(rows)}

    def list_executors(self) -> dict[str, Any]:
        """The workers and engines with their last heartbeat, and the runnable workflows no
        live one can run (their code, or its version, is registered nowhere)."""
        return {
            "executors": _jsonable(self.client.executors()),
            "waiting_for_worker": _jsonable(self.client.waiting_for_worker()),
        }

    def audit_log(
        self,
        workflow_id: str | None = None,
        action: str | None = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 50,
    ) -> dict[str, Any]:
        """The operator actions recorded (who cancelled, resumed, forked, decided, raised a
        budget...), newest first; of one workflow or all."""
        return {"audit": _jsonable(self.client.audit_log(workflow_id, action=action, limit=limit))}

    # -- operator actions ------------------------------------------------------------------

    def _acting(self, fn: Callable[[], Any]) -> Any:
        if self.actor is None:
            return fn()
        with self.client.acting_as(self.actor):
            return fn()

    def cancel_workflow(
        self, workflow_id: WorkflowId, reason: str = "cancelled from MCP"
    ) -> dict[str, Any]:
        """Cancel a workflow and the workflows it started: a running one stops at its next
        step and runs its compensations. Recorded in the audit log."""
        status = self._acting(lambda: self.client.cancel(workflow_id, reason))
        return {"workflow_id": workflow_id, "status": status.value}

    def resume_workflow(
        self, workflow_id: WorkflowId, version: str | None = None
    ) -> dict[str, Any]:
        """Run a stopped (CANCELLED, ERROR, ...) workflow again from its journal; version
        moves it to other code. Recorded in the audit log."""
        self._acting(lambda: self.client.resume(workflow_id, version=version))
        status = self.client.get_workflow(workflow_id).status
        return {"workflow_id": workflow_id, "status": status.value}

    def fork_workflow(
        self,
        workflow_id: WorkflowId,
        from_step: Annotated[int, Field(ge=0)],
        new_id: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """Start a new workflow with the same inputs that reuses the journal before
        from_step and runs the rest anew. Recorded in the audit log."""
        handle = self._acting(
            lambda: self.client.fork(
                workflow_id, from_step=from_step, new_id=new_id, version=version
            )
        )
        return {"workflow_id": handle.workflow_id, "forked_from": workflow_id}

    def decide_approval(
        self,
        workflow_id: WorkflowId,
        name: str,
        approve: bool,
        comment: str | None = None,
        decided_by: str | None = None,
    ) -> dict[str, Any]:
        """Approve or deny an approval gate (the first decision wins). Recorded in the
        audit log."""
        self._acting(
            lambda: self.client.decide(
                workflow_id, name, approve, comment=comment, decided_by=decided_by
            )
        )
        return {"workflow_id": workflow_id, "name": name, "approved": approve}

    def raise_budget(
        self,
        workflow_id: WorkflowId,
        dollars: Annotated[float, Field(ge=0)] | None = None,
        tokens: Annotated[int, Field(ge=0)] | None = None,
        steps: Annotated[int, Field(ge=0)] | None = None,
        seconds: Annotated[float, Field(ge=0)] | None = None,
    ) -> dict[str, Any]:
        """Add to the limits of the workflow's budget and let the workflows paused at its
        gates continue. Recorded in the audit log."""
        ledger = self._acting(
            lambda: self.client.raise_budget(
                workflow_id, dollars=dollars, tokens=tokens, steps=steps, seconds=seconds
            )
        )
        return {"workflow_id": workflow_id, "budget": _jsonable(ledger)}


def _guard_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A durable error becomes the tool's error message (bad input names the fix)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DurableError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc

    return wrapper


def create_server(
    client: Client, *, token: str | None = None, actor: str | None = None, name: str = "durable"
) -> MCPServer:
    """An MCP server over `client`. Given the operator `token` (any non-empty one: the
    server is as trusted as whoever starts it with it), it offers the operator actions
    too, each recorded in the audit log as `actor` (default: the client's own actor).
    Serve it with `.run()` (stdio) or connect an MCP client to it in-process."""
    guarded = bool(token)
    server = _Server(name=name, instructions=INSTRUCTIONS, guarded=guarded)
    tools = _Tools(client, actor)
    for tool in READ_TOOLS + (GUARDED_TOOLS if guarded else ()):
        server.add_tool(_guard_errors(getattr(tools, tool)), name=tool)
    return server


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def presented_token(scope: Scope) -> bytes | None:
    """The token an HTTP request presents: `Authorization: Bearer T` or `X-Durable-Token: T`."""
    headers = dict(scope.get("headers") or [])
    token = headers.get(b"x-durable-token")
    if token:
        return bytes(token).strip()
    scheme, _, value = bytes(headers.get(b"authorization", b"")).partition(b" ")
    if scheme.lower() == b"bearer" and value.strip():
        return value.strip()
    return None


def http_app(server: MCPServer, *, token: str | None, host: str = "127.0.0.1") -> ASGIApp:
    """The server as a streamable-HTTP ASGI app (at /mcp). Given `token`, every request
    must present it (`Authorization: Bearer T` or `X-Durable-Token: T`; else 401): over
    HTTP, whoever reaches the port would otherwise have the operator actions."""
    inner = server.streamable_http_app(host=host)
    if not token:
        return inner
    expected = token.encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = presented_token(scope)
            if given is None or not hmac.compare_digest(given, expected):
                body = b"this MCP server needs its operator token: Authorization: Bearer T"
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"www-authenticate", b'Bearer realm="durable mcp"'),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await inner(scope, receive, send)

    return guarded
