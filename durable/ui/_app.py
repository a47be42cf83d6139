"""The console's routes. Every request first passes the guard (the Host header, and the token
when it is reached beyond loopback); pages are plain GETs rendered from Client reads; actions
are POSTs that check the CSRF token, then the operator token, then call the Client in a
thread."""

from __future__ import annotations

import datetime as dt
import hmac
import ipaddress
import secrets
import time
import uuid
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from durable._base.clock import SystemClock
from durable._base.models import WorkflowStatus
from durable._base.names import workflow_label
from durable._client.client import Client
from durable._host.engine import Engine
from durable.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DurableError,
    InvalidNameError,
    WorkflowNotFoundError,
)
from durable.ui._actions import _ACTIONS, _CANCELLABLE, _RESUMABLE, _acting
from durable.ui._auth import (
    SESSION_COOKIE,
    SESSION_SECONDS,
    TOKEN_HEADER,
    Sessions,
    Throttle,
    check_strong,
    credential,
    weakness,
)
from durable.ui._bulk import attribute_filter, bulk_page
from durable.ui._bulk import time_field as _time_param
from durable.ui._callbacks import callback_route, is_callback
from durable.ui._list import (
    database_name,
    export_route,
    offset_param,
    parse_sort,
    running,
    sort_links,
)
from durable.ui._metrics import metrics_route
from durable.ui._render import HERE, _next_tick, _templates
from durable.ui._timeline import timeline

CSRF_COOKIE = "durable_csrf"
PAGE_SIZE = 50
COUNT_CAP = 10_000
REFRESH_SECONDS = 5  # lists, and the page of a workflow that has not finished
MAX_FORM_BYTES = 64 * 1024  # an action's form is a few short fields


def create_app(
    client: Client | Engine,
    *,
    token: str | None = None,
    read_only: bool = False,
    reads_need_token: bool = False,
    allowed_hosts: Iterable[str] = (),
) -> Starlette:
    """The console as an ASGI app over a connected `client` (or a launched engine: its
    client, on the engine's pool).

    token: what every action must present, and every page reached beyond loopback: a person
      signs in with it once (a session cookie, HttpOnly and SameSite=Strict, bound to this
      token); scripts send the X-Durable-Token header (or Basic authentication).
    read_only: no actions at all (no forms are shown, every POST is refused); then no token
      is needed, but without one the console answers over loopback only.
    reads_need_token: every page needs the token, over loopback too (`durable ui` sets it
      when it listens beyond loopback). Default False: pages are open to a request that came
      in on a loopback address under a loopback name (localhost, 127.0.0.1, [::1]).
    allowed_hosts: more names the console answers to (a reverse proxy's public name), each
      needing the token. Over loopback it answers to no other name, so that a DNS-rebinding
      page (whose requests name the page's own host) is refused; given names, it answers to
      no other name at all.

    A console that is neither read-only nor given a token is refused, so that a mounted
    console never acts for anyone who can reach it; one that serves others (reads_need_token,
    allowed_hosts) refuses a weak token (WeakTokenError); one given a weak token answers to
    loopback clients only (a 403 beyond, naming the fix). Wrong tokens are throttled per
    client address and in all (see _auth.py); each action is recorded in the audit log as
    "console <client address> ...".
    """
    if isinstance(client, Engine):
        client = client.client
    if not read_only and not token:
        raise ConfigurationError(
            "the console's actions need a token: give token=... (durable ui: --token or "
            "DURABLE_UI_TOKEN), or read_only=True"
        )
    if (reads_need_token or allowed_hosts) and not token:
        raise ConfigurationError(
            "reads_need_token and allowed_hosts need a token (the pages they serve ask for "
            "it): give token=... (durable ui: --token or DURABLE_UI_TOKEN)"
        )
    if token and (reads_need_token or allowed_hosts):
        check_strong(token)
    if isinstance(allowed_hosts, str):
        raise ConfigurationError(
            f"allowed_hosts={allowed_hosts!r}: give a list of names, e.g. [{allowed_hosts!r}]"
        )
    hosts = set()
    for name in allowed_hosts:
        host = _host_name(name)
        if not host:
            raise ConfigurationError(f"allowed_hosts: {name!r} is not a host name")
        hosts.add(host)
    console = _Console(client, token, read_only, reads_need_token, frozenset(hosts))
    routes = [
        Route("/", console.home),
        Route("/workflows", console.workflows),
        Route("/workflows/{workflow_id:path}", console.workflow),
        Route("/approvals", console.approvals),
        Route("/executors", console.executors),
        Route("/queues", console.queues),
        Route("/schedules", console.schedules),
        Route("/metrics", metrics_route(client)),
        Route("/audit", console.audit),
        Route("/bulk", bulk_page(console)),
        Route("/signin", console.signin, methods=["GET", "POST"]),
        Route("/signout", console.signout, methods=["POST"]),
        Route("/actions/{action}", console.act, methods=["POST"]),
        Route("/export", export_route(console), methods=["POST"]),
        *([] if read_only else [callback_route(client)]),  # before the guard: see _Guard
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(_Guard, console=console)],
        exception_handlers={DatabaseUnavailableError: console.unavailable},
    )


def _is_loopback(host: str) -> bool:
    """Whether a host name or address (no port, no brackets) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _host_name(header: str | None) -> str | None:
    """The host of a Host header ("name", "name:port", "[v6]:port"), lower case and without
    its port or trailing dot; None when there is none or it is malformed."""
    text = (header or "").strip().lower()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
        if not port.isdigit():
            return None
    elif ":" in text:
        return None
    else:
        host = text
    host = host.rstrip(".")
    if not host or any(c in host for c in "/\\@?# \t") or not host.isprintable():
        return None
    return host


class _Guard:
    """Runs before every route: refuses a Host that a request over loopback should not name
    (DNS rebinding), and asks for the token when the request is not local."""

    def __init__(self, app: ASGIApp, console: _Console) -> None:
        self.app = app
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_callback(scope):  # a callback URL: its own token
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        refusal = self.console.refusal(request)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)


class _Console:
    def __init__(
        self,
        client: Client,
        token: str | None,
        read_only: bool,
        reads_need_token: bool,
        allowed_hosts: frozenset[str],
    ) -> None:
        self.client = client
        self.token = token
        self.sessions = Sessions(token) if token else None
        self.weak = weakness(token) if token else None  # why, if it is too weak to guard
        clock = client.clock
        self.throttle = Throttle(
            clock=time.monotonic
            if isinstance(clock, SystemClock)
            else lambda: clock.now().timestamp()
        )
        self.read_only = read_only
        self.reads_need_token = reads_need_token
        self.allowed_hosts = allowed_hosts
        self.env = _templates()
        self.database = database_name(client)

    # -- the guard -------------------------------------------------------------------------

    def refusal(self, request: Request) -> Response | None:
        """The answer to a request the console must not serve, or None to serve it.

        Over loopback the Host must name loopback (or an allowed host): a DNS-rebinding
        page's requests come in on 127.0.0.1 but name the page's own host. A page is open
        only to a request that came in on a loopback address under a loopback name; any
        other needs the token."""
        server = request.scope.get("server") or (None, None)  # the socket it came in on
        via_loopback = _is_loopback(str(server[0]).lower())
        host = _host_name(request.headers.get("host"))
        named_loopback = host is not None and _is_loopback(host)
        if not named_loopback and (via_loopback or self.allowed_hosts):
            if host is None or host not in self.allowed_hosts:
                shown = request.headers.get("host", "")
                return self.message(
                    request,
                    f"refused: Host {shown!r} is not a name of this console; open it as "
                    "http://127.0.0.1 or http://localhost (behind a proxy: add its name with "
                    "allowed_hosts=..., durable ui --allowed-host)",
                    400,
                )
        if self.weak is not None and not _is_loopback(_address(request)):
            return self.message(
                request,
                f"refused: this console's token is too weak to guard it beyond loopback "
                f"({self.weak}), so it answers loopback clients only; give it a strong one: "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'",
                403,
            )
        if via_loopback and named_loopback and not self.reads_need_token:
            return None
        path = request.url.path[len(request.scope.get("root_path", "")) :]
        if self.sessions is not None and (path == "/signin" or path.startswith("/static/")):
            return None  # the sign-in page, and what it is drawn with
        if self.sessions is None:
            return self.message(
                request,
                "refused: this console has no token, so it answers over loopback only; give "
                "it one (durable ui --token, or create_app(token=...)) to serve it further",
                403,
            )
        allowed = self.authorized(request)
        if allowed is not False:
            return None if allowed is True else allowed
        asked = path + (f"?{request.url.query}" if request.url.query else "")
        back = _back(asked) if request.method == "GET" else ""  # where signing in leads
        answer = self.render(
            request,
            "signin.html",
            401,
            next=back,
            here="",
            note="this console needs its token to show anything from here: sign in (scripts "
            f"send it in the {TOKEN_HEADER} header, or as a Bearer token)",
        )
        # A scheme this console takes that browsers answer with no dialog of their own: a
        # person signs in with the form above (a session that signing out ends).
        answer.headers["WWW-Authenticate"] = 'Bearer realm="durable console"'
        return answer

    def authorized(self, request: Request, given: str | None = None) -> bool | Response:
        """Whether this request may read and act: the token it presents (the header, a
        Bearer token or a Basic password), else its live session cookie, else `given` (a
        form's token field). A presented token is compared in constant time and counts
        against the throttle: past its limits the answer is a 429 (Retry-After), whatever
        the token. Decided once per request (request.state), as pages ask again; a form's
        field is looked at only when given."""
        decided = getattr(request.state, "durable_auth", None)
        if decided is not None and given is None:
            return bool(decided)
        sessions = self.sessions
        token = credential(request)
        if sessions is None:
            allowed: bool | Response = False
        elif token is None and sessions.valid(request.cookies.get(SESSION_COOKIE)):
            allowed = True
        elif token is None and given is None:
            allowed = False
        else:
            allowed = self._guess(request, token if token is not None else str(given).encode())
        request.state.durable_auth = allowed is True
        return allowed

    def _guess(self, request: Request, token: bytes) -> bool | Response:
        """A presented token, throttled: the 429 while its address (or everyone) is held
        back, else whether it is the token (a wrong one counted, a right one clearing its
        address's count)."""
        assert self.sessions is not None
        address = _address(request)
        wait = self.throttle.wait(address)
        if wait:
            request.state.durable_auth = False
            answer = self.message(
                request,
                f"refused: too many wrong tokens (from {address}, or from everywhere): try "
                f"again in {wait} s",
                429,
            )
            answer.headers["Retry-After"] = str(wait)
            return answer
        if self.sessions.is_token(token):
            self.throttle.succeeded(address)
            return True
        self.throttle.failed(address)
        return False

    def signed_in(self, request: Request) -> bool:
        """Whether this request may act: it carries the token, or a live session."""
        return self.authorized(request) is True

    def actor(self, request: Request) -> str:
        """Who acts, for the audit log: the client's address, and its session (a prefix of
        its nonce, which names it and proves nothing) or that it sent the token."""
        assert self.sessions is not None
        nonce = self.sessions.nonce(request.cookies.get(SESSION_COOKIE))
        how = f"session {nonce[:8]}" if nonce and credential(request) is None else "token"
        return f"console {_address(request)} {how}"

    async def unavailable(self, request: Request, exc: Exception) -> Response:
        """A lost database is the server's trouble, not the request's: 503, try again."""
        return self.message(
            request, f"the database cannot be reached now ({exc}): try again shortly", 503
        )

    # -- rendering -----------------------------------------------------------------------

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
        base = request.scope.get("root_path", "")
        context.setdefault(
            "here",
            request.url.path[len(base) :] + (f"?{request.url.query}" if request.url.query else ""),
        )
        html = self.env.get_template(name).render(
            base=base,
            csrf=csrf,
            read_only=self.read_only,
            database=self.database,
            session=self.sessions is not None and self.signed_in(request),
            signed_in=not self.read_only and self.signed_in(request),
            request=request,
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        if request.cookies.get(CSRF_COOKIE) != csrf:
            response.set_cookie(
                CSRF_COOKIE, csrf, httponly=True, samesite="strict", path=base or "/"
            )
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'"
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        return response

    def message(self, request: Request, text: str, status: int, back: str = "") -> Response:
        return self.render(request, "message.html", status, text=text, back=back, here="")

    def _checked_form(self, request: Request, form: dict[str, str]) -> Response | None:
        """The refusal of a browser's form that did not come from one of our pages (its
        CSRF field must match the SameSite=Strict cookie, and its Origin, if sent, be ours)."""
        cookie = request.cookies.get(CSRF_COOKIE, "")
        sent = form.get("csrf", "")
        if not cookie or not hmac.compare_digest(cookie.encode(), sent.encode()):
            return self.message(request, "CSRF check failed: reload the page", 403)
        if not _same_origin(request):
            return self.message(request, "CSRF check failed: another origin", 403)
        return None

    # -- signing in and out ----------------------------------------------------------------

    async def signin(self, request: Request) -> Response:
        """GET: the form. POST: the token, checked in constant time; right, a session cookie
        (HttpOnly, SameSite=Strict, Secure over https) and on to `next`; wrong, a refusal
        that sets nothing, so a mistyped token is never remembered. (A read-only console
        given a token signs in too: beyond loopback its pages need it.)"""
        if self.sessions is None:  # read-only, open over loopback only: nothing to sign in to
            return self.message(request, "this console is read-only: there is no signing in", 404)
        if request.method == "GET":
            return self.render(
                request, "signin.html", next=_back(request.query_params.get("next", "")), here=""
            )
        body = await _body(request, MAX_FORM_BYTES)
        form = _Form(_form(body or b""))
        refused = self._checked_form(request, form)
        if refused is not None:
            return refused
        after = _back(form.get("next", ""))
        if not after or after.startswith(("/signin", "/signout", "/actions/")):
            after = "/workflows"
        allowed = self._guess(request, form.get("token", "").encode())
        if isinstance(allowed, Response):
            return allowed
        if not allowed:
            return self.render(
                request,
                "signin.html",
                403,
                next=after,
                here="",
                note="refused: that is not the token",
            )
        base = request.scope.get("root_path", "")
        answer = RedirectResponse(base + after, 303)
        answer.set_cookie(
            SESSION_COOKIE,
            self.sessions.issue(),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=base or "/",
        )
        return answer

    async def signout(self, request: Request) -> Response:
        if self.sessions is None:
            return self.message(request, "this console has no sessions", 404)
        body = await _body(request, MAX_FORM_BYTES)
        refused = self._checked_form(request, _Form(_form(body or b"")))
        if refused is not None:
            return refused
        self.sessions.revoke(request.cookies.get(SESSION_COOKIE))
        base = request.scope.get("root_path", "")
        answer = RedirectResponse(base + "/signin", 303)
        answer.delete_cookie(SESSION_COOKIE, path=base or "/", httponly=True, samesite="strict")
        return answer

    # -- pages -----------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        return RedirectResponse(request.scope.get("root_path", "") + "/workflows", 303)

    async def workflows(self, request: Request) -> Response:
        q = request.query_params
        keys = ("status", "name", "id", "from", "to", "q", "children", "attr")
        filters = {k: q.get(k, "").strip() for k in keys}
        # Top-level rows, their children folded under; a search lists every run it finds.
        nested = filters["children"] != "1" and not filters["q"]
        try:
            sort, descending = parse_sort(q.get("sort"))
            offset = offset_param(q.get("offset"))
            limit = min(500, max(1, int(q.get("limit") or PAGE_SIZE)))
            after_at = _time_param(q.get("after_at"))
            after_id = q.get("after_id", "")
            if (after_at is None) != (not after_id):
                raise ValueError("after_at and after_id go together (the older link has both)")
            after = (after_at, after_id) if after_at else None
            chosen: dict[str, Any] = {
                "name": filters["name"] or None,
                "id_prefix": filters["id"] or None,
                "created_from": _time_param(filters["from"]),
                "created_to": _time_param(filters["to"]),
                "top_level": nested,
                "search": filters["q"] or None,
                "filter": attribute_filter(filters["attr"]),
            }
            if (sort, descending) != ("created", True) or offset:
                chosen |= {"sort": sort, "descending": descending, "offset": offset}
            status = filters["status"].upper() or None
            infos, count, children, steps = await run_in_threadpool(
                self._list_data, status, chosen, after, limit, nested
            )
        except DatabaseUnavailableError:
            raise
        except (ValueError, DurableError) as exc:
            return self.message(request, f"bad filter: {exc}", 400, back="/workflows")
        kept = {k: v for k, v in filters.items() if v}
        if q.get("limit"):
            kept["limit"] = str(limit)
        links = sort_links(kept, sort, descending)
        kept |= {"sort": q["sort"]} if q.get("sort") else {}
        older = None
        if len(infos) == limit and "offset" in chosen:  # another order: paged by offset
            older = urlencode(kept | {"offset": str(offset + limit)})
        elif len(infos) == limit:
            last = infos[-1]
            older = urlencode(
                kept | {"after_at": last.created_at.isoformat(), "after_id": last.workflow_id}
            )
        return self.render(
            request,
            "workflows.html",
            refresh=REFRESH_SECONDS,
            infos=infos,
            count=count,
            capped=count > COUNT_CAP,
            children=children,
            nested=nested,
            filters=filters,
            statuses=[s.value for s in WorkflowStatus],
            older=older,
            paged=after is not None or offset > 0,
            newest=urlencode(kept),
            sorts=links,
            steps=steps,
        )

    def _list_data(
        self,
        status: str | None,
        chosen: dict[str, Any],
        after: tuple[dt.datetime, str] | None,
        limit: int,
        nested: bool,
    ) -> tuple[list[Any], int, dict[str, list[dict[str, Any]]], dict[str, Any]]:
        """A page of the list, how many rows match (counted up to COUNT_CAP, unless the first
        page holds them all), when the page lists top-level workflows the children of its
        rows, and the running step of its running rows."""
        c = self.client
        infos = c.list_workflows(status, after=after, limit=limit, **chosen)
        if after is None and not chosen.get("offset") and len(infos) < limit:
            count = len(infos)  # the first page holds every match: no second scan
        else:
            order = ("sort", "descending", "offset")
            counted = {k: v for k, v in chosen.items() if k not in order}
            count = c.count_workflows(status, cap=COUNT_CAP + 1, **counted)
        children = c.list_children([i.workflow_id for i in infos]) if nested and infos else {}
        return infos, count, children, running(c, infos, dt.datetime.now(dt.UTC))

    async def workflow(self, request: Request) -> Response:
        workflow_id = request.path_params["workflow_id"]
        try:
            data = await run_in_threadpool(self._workflow_data, workflow_id)
        except WorkflowNotFoundError as exc:
            return self.message(request, str(exc), 404, back="/workflows")
        except InvalidNameError as exc:  # no stored id can be this one (NUL, over 512 bytes)
            return self.message(request, f"no workflow has this id: {exc}", 404, back="/workflows")
        status = data["info"].status
        return self.render(
            request,
            "workflow.html",
            refresh=None if status.is_terminal else REFRESH_SECONDS,
            can_cancel=status in _CANCELLABLE,
            can_resume=status in _RESUMABLE,
            can_send=not status.is_terminal,
            **data,
        )

    def _workflow_data(self, workflow_id: str) -> dict[str, Any]:
        c = self.client
        info = c.get_workflow(workflow_id)
        steps = c.steps(workflow_id)
        now = dt.datetime.now(dt.UTC)
        wait = c.worker_wait(workflow_id)
        return {
            "info": info,
            "timeline": timeline(info, steps, now),
            "running": running(c, [info], now).get(workflow_id),
            "wait": {
                "waiting": wait["waiting"],
                "label": workflow_label(info.name, info.version),
                "live": [workflow_label(info.name, v) for v in wait["live_versions"]],
            },
            "steps": steps,
            "children": [s.child_workflow_id for s in steps if s.child_workflow_id],
            "effects": c.effects(workflow_id),
            "budget": c.budget(workflow_id),
            "state": c.state_text(workflow_id),
            "conversation": c.conversation(workflow_id),
            "tools": c.tool_calls(workflow_id),
            "events": c.events(workflow_id),
            "gates": c.list_approvals(workflow_id, waiting_only=False, limit=500),
            "audit": c.audit_log(workflow_id, limit=PAGE_SIZE),
        }

    async def approvals(self, request: Request) -> Response:
        show_all = request.query_params.get("all") == "1"
        rows = await run_in_threadpool(
            self.client.approval_inbox, waiting_only=not show_all, limit=200
        )
        return self.render(
            request, "approvals.html", refresh=REFRESH_SECONDS, gates=rows, show_all=show_all
        )

    async def executors(self, request: Request) -> Response:
        """Live executors; the dead ones (no heartbeat for the time after which their work
        is recovered) only when asked, since they pile up after every restart."""
        show_all = request.query_params.get("all") == "1"
        rows, waiting = await run_in_threadpool(
            lambda: (self.client.executors(), self.client.waiting_for_worker())
        )
        live_seconds = self.client.config.live_seconds
        for row in rows:
            row["dead"] = row["heartbeat_age"].total_seconds() > live_seconds
        dead = sum(1 for row in rows if row["dead"])
        shown = rows if show_all else [row for row in rows if not row["dead"]]
        return self.render(
            request,
            "executors.html",
            refresh=REFRESH_SECONDS,
            executors=shown,
            dead=dead,
            show_all=show_all,
            waiting=waiting,
        )

    async def queues(self, request: Request) -> Response:
        def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            rows = self.client.queues()
            # The partitions of the queues with unfinished entries (a statement per queue:
            # queues are few).
            parts = [
                {"queue_name": q["queue_name"], **p}
                for q in rows
                if q["queued"] or q["active"]
                for p in self.client.queue_partitions(q["queue_name"])
            ]
            return rows, parts

        rows, parts = await run_in_threadpool(read)
        return self.render(
            request, "queues.html", refresh=REFRESH_SECONDS, queues=rows, partitions=parts
        )

    async def schedules(self, request: Request) -> Response:
        rows = await run_in_threadpool(self.client.list_schedules)
        for row in rows:
            row["next_tick"] = _next_tick(row)
        return self.render(request, "schedules.html", refresh=REFRESH_SECONDS, schedules=rows)

    async def audit(self, request: Request) -> Response:
        """The audit log, newest first, a page at a time (keyset: the last row's time and
        id)."""
        q = request.query_params
        try:
            at, audit_id = _time_param(q.get("before_at")), q.get("before_id", "")
            if (at is None) != (not audit_id):
                raise ValueError("before_at and before_id go together (the older link has both)")
            before = (at, uuid.UUID(audit_id)) if at is not None else None
        except ValueError as exc:
            return self.message(request, f"bad filter: {exc}", 400, back="/audit")
        rows = await run_in_threadpool(self.client.audit_log, before=before, limit=PAGE_SIZE)
        older = None
        if len(rows) == PAGE_SIZE:
            older = urlencode(
                {"before_at": rows[-1]["at"].isoformat(), "before_id": rows[-1]["audit_id"]}
            )
        return self.render(request, "audit.html", refresh=REFRESH_SECONDS, rows=rows, older=older)

    # -- actions ---------------------------------------------------------------------------

    async def permitted(self, request: Request) -> tuple[dict[str, str], Response | None]:
        """An action's form, and the refusal of it (None: act): read-only, too big, a
        browser's form not from our pages (CSRF), or no token."""
        if self.read_only:
            return {}, self.message(request, "this console is read-only: no actions", 403)
        body = await _body(request, MAX_FORM_BYTES)
        if body is None:
            too_big = f"refused: an action's form is at most {MAX_FORM_BYTES} bytes"
            return {}, self.message(request, too_big, 413)
        form = _Form(_form(body))
        assert self.sessions is not None
        if request.headers.get(TOKEN_HEADER) is None:  # a browser's form: from our pages only
            refused = self._checked_form(request, form)
            if refused is not None:
                return form, refused
        # The header, a Bearer token, Basic authentication, a signed-in session, or (for
        # scripts written against forms) a `token` field.
        allowed = self.authorized(request, form.get("token"))
        if isinstance(allowed, Response):
            return form, allowed
        if not allowed:
            no = "refused: this action needs the console's token: sign in first"
            return form, self.message(request, no, 403)
        return form, None

    async def act(self, request: Request) -> Response:
        form, refused = await self.permitted(request)
        if refused is not None:
            return refused
        action = _ACTIONS.get(request.path_params["action"])
        if action is None:
            return self.message(request, "no such action", 404)
        back = _back(form.get("back", ""))
        try:
            text = await run_in_threadpool(_acting, self.actor(request), action, self.client, form)
        except DatabaseUnavailableError as exc:
            return self.message(request, f"not done: {exc}; try again shortly", 503, back=back)
        except (DurableError, ValueError, KeyError) as exc:
            status = 409 if type(exc).__name__ == "ApprovalConflictError" else 400
            if isinstance(exc, WorkflowNotFoundError):
                status = 404
            return self.message(request, f"not done: {exc}", status, back=back)
        return self.message(request, text, 200, back=back)


def _address(request: Request) -> str:
    """The client's address (behind a proxy, the proxy's unless the server is told to trust
    its X-Forwarded-For: uvicorn's --forwarded-allow-ips)."""
    return request.client.host if request.client else "unknown"


async def _body(request: Request, limit: int) -> bytes | None:
    """The request's body, read no further than `limit` bytes (None past it)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
    except ClientDisconnect:
        return b""
    return b"".join(chunks)


def _form(body: bytes) -> dict[str, str]:
    """An url-encoded form's fields (last value wins); multipart is never needed here."""
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in parsed.items()}


class _Form(dict[str, str]):
    """A form whose missing field is refused by name (a bare KeyError would say only 'key')."""

    def __missing__(self, key: str) -> str:
        raise ValueError(f"the form is missing its {key} field")


def _back(path: str) -> str:
    """Where a message page links back to: a path on this console, else nowhere. A browser
    reads "/\\host" as "//host", and drops tabs and newlines, so those are refused too."""
    if not path.startswith("/") or path.startswith("//"):
        return ""
    if "\\" in path or not path.isprintable():
        return ""
    return path


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host
