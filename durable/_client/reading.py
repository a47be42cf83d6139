"""Reading stored workflows: their rows, journals, ledgers, events, approvals, schedules,
budgets, state and outcomes. Nothing here writes."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from durable._base.models import (
    Ledger,
    StepRecord,
    WorkflowInfo,
    WorkflowStatus,
)
from durable._base.names import check_name, check_text
from durable._base.registry import WorkflowDef
from durable._client.client_base import ClientBase
from durable._core import decode_error
from durable._run.filter import RunFilter
from durable._run.handles import WorkflowHandle
from durable.errors import (
    ConfigurationError,
    WorkflowCancelledError,
    WorkflowConflictError,
    WorkflowFailedError,
    WorkflowNotFoundError,
    WorkflowTimeoutError,
)

if TYPE_CHECKING:
    import concurrent.futures


#: The orders list_workflows sorts by.
SORTS = ("created", "updated", "status", "name")


class Reading(ClientBase):
    """The reads of a Client (see Client)."""

    # -- workflows and outcomes --------------------------------------------------------

    def handle(
        self, workflow_id: str, future: concurrent.futures.Future[Any] | None = None
    ) -> WorkflowHandle:
        return WorkflowHandle(self, workflow_id, future)

    @property
    def default_durability(self) -> str:
        """What the workflows this client records are run with, unless their code says
        (an Engine's `durability=`; "sync" for a plain Client)."""
        return self.config.durability

    def existing(
        self, defn: WorkflowDef, workflow_id: str, inputs: str | None = None
    ) -> WorkflowInfo:
        """The WorkflowInfo a start of `defn` (stored `inputs`) under an existing id attaches
        to: WorkflowConflictError if another function, or the same method on another
        instance, holds the id; JournalVersionError if its journal is newer than this code."""
        info = self.get_workflow(workflow_id)
        if info.name != defn.name:
            raise WorkflowConflictError(workflow_id, info.name, defn.name)
        if defn.receiver is not None and inputs is not None:
            self.inputs.check_receiver(info, defn, inputs)
        info.check_journal()
        return info

    def get_workflow(self, workflow_id: str) -> WorkflowInfo:
        check_name("workflow_id", workflow_id)
        row = self.db.fetch_one("get_workflow", {"workflow_id": workflow_id})
        if row is None:
            raise WorkflowNotFoundError(workflow_id)
        return WorkflowInfo.from_row(row)

    def list_workflows(
        self,
        status: WorkflowStatus | str | None = None,
        *,
        name: str | None = None,
        limit: int = 100,
        id_prefix: str | None = None,
        created_from: dt.datetime | None = None,
        created_to: dt.datetime | None = None,
        after: tuple[dt.datetime, str] | None = None,
        top_level: bool = False,
        search: str | None = None,
        filter: RunFilter | None = None,
        sort: str = "created",
        descending: bool = True,
        offset: int = 0,
    ) -> list[WorkflowInfo]:
        """Stored workflows, newest first (at most `limit`, 1 to 100,000), optionally only
        those whose id starts with `id_prefix` or created in [created_from, created_to).
        Page with `after`: the (created_at, workflow_id) of the last row of the page before
        (a keyset, so a page costs the same at any depth). `top_level`: only workflows no
        other workflow started; `search`: only those whose stored inputs or output contain
        this text (case-insensitive; a scan of the rows in list order until the page fills).
        `filter`: a durable.RunFilter (attributes, ranges, several statuses, version,
        parent), with the other arguments.

        `sort` ("created", "updated", "status" or "name"; ties newest first) in
        `descending` order, paged by `offset` rather than `after`: another order than the
        default (created, descending) is read by a sort of every match, not a walk of an
        index.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise ConfigurationError(f"limit={limit!r}: give a whole number from 1 to 100,000")
        if sort not in SORTS:
            raise ConfigurationError(f"sort={sort!r}: use one of {', '.join(SORTS)}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigurationError(f"offset={offset!r}: give a whole number, 0 or more")
        default_order = sort == "created" and descending and not offset
        if after is not None and not default_order:
            raise ConfigurationError(
                "after= pages the default order (created, newest first); page another sort "
                "or an offset with offset="
            )
        after_at, after_id = after if after is not None else (None, None)
        check_name("after", after_id, optional=True)
        params = self._list_filters(
            status, name, id_prefix, created_from, created_to, top_level, search, filter
        ) | {
            "after_at": after_at,
            "after_id": after_id,
            "limit": limit,
            "stale_seconds": self.config.live_seconds,
        }
        if default_order:
            rows = self.db.fetch_all("list_workflows", params)
        else:
            order = {"sort": sort, "descending": descending, "offset": offset}
            rows = self.db.fetch_all("list_workflows_sorted", params | order)
        return [WorkflowInfo.from_row(r) for r in rows]

    def running_steps(self, workflow_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Where each of these workflows that is RUNNING is: {id: {step_seq, previous_step,
        since, heartbeat_at, attempt}}. step_seq is the position of the call under way (one
        past the last journaled), previous_step the last journaled call's name (None before
        the first), since when the run has been at it (that call's end, else the workflow's
        creation); heartbeat_at and attempt are a watched step's (a heartbeat_timeout),
        else None. A plain step records nothing before it is journaled, so the name of the
        one under way is not known."""
        for workflow_id in workflow_ids:
            check_name("workflow_id", workflow_id)
        if not workflow_ids:
            return {}
        rows = self.db.fetch_all("running_steps", {"workflow_ids": workflow_ids})
        return {row.pop("workflow_id"): row for row in rows}

    def count_workflows(
        self,
        status: WorkflowStatus | str | None = None,
        *,
        name: str | None = None,
        id_prefix: str | None = None,
        created_from: dt.datetime | None = None,
        created_to: dt.datetime | None = None,
        top_level: bool = False,
        search: str | None = None,
        cap: int = 10_000,
        filter: RunFilter | None = None,
    ) -> int:
        """How many workflows list_workflows' filters match, counting no further than `cap`
        (so at most `cap` rows are read: a result equal to `cap` means "at least")."""
        filters = self._list_filters(
            status, name, id_prefix, created_from, created_to, top_level, search, filter
        )
        row = self.db.fetch_one("count_workflows", filters | {"cap": cap})
        return 0 if row is None else int(row["n"])

    def list_children(
        self, parent_ids: list[str], limit: int = 1000
    ) -> dict[str, list[dict[str, Any]]]:
        """The workflows each of these started (one level), oldest first: {parent: rows}."""
        for parent_id in parent_ids:
            check_name("workflow_id", parent_id)
        rows = self.db.fetch_all("list_children", {"parent_ids": parent_ids, "limit": limit})
        children: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            row["status"] = WorkflowStatus(row["status"])
            children.setdefault(row["parent_id"], []).append(row)
        return children

    def _list_filters(
        self,
        status: WorkflowStatus | str | None,
        name: str | None,
        id_prefix: str | None,
        created_from: dt.datetime | None,
        created_to: dt.datetime | None,
        top_level: bool,
        search: str | None,
        filter: RunFilter | None = None,
    ) -> dict[str, Any]:
        """The bind parameters of list_workflows' and count_workflows' filters, checked."""
        if filter is not None and not isinstance(filter, RunFilter):
            raise ConfigurationError(f"filter={filter!r}: give a durable.RunFilter")
        chosen = filter or RunFilter()
        check_name("name", name, optional=True)
        check_name("id_prefix", id_prefix, optional=True)
        if status is not None:
            try:
                status = WorkflowStatus(status)
            except ValueError:
                raise ConfigurationError(
                    f"status={status!r}: use one of {', '.join(s.value for s in WorkflowStatus)}"
                ) from None
        if search is not None:
            check_text("search", search)
        return (
            {
                "status": None if status is None else str(status),
                "name": name,
                "id_from": id_prefix or chosen.id_prefix,
                "id_to": None
                if (id_prefix or chosen.id_prefix) is None
                else _prefix_end(id_prefix or chosen.id_prefix or ""),
                "created_from": _later(created_from, chosen.created_from),
                "created_to": _later(created_to, chosen.created_to, earlier=True),
                "top_level": bool(top_level or chosen.top_level),
                "search": search.lower() if search else None,
            }
            | chosen.params()
            | ({"name": name} if name else {"name": chosen.name})
        )

    def finished(self, workflow_id: str) -> tuple[bool, Any]:
        """(True, its value) if the workflow finished (raising what it finished with, as
        outcome does), else (False, None): one look, for the handles' waits."""
        row = self.db.fetch_one("get_workflow_status", {"workflow_id": workflow_id})
        if row is None:
            raise WorkflowNotFoundError(workflow_id)
        status = WorkflowStatus(row["status"])
        if not status.is_terminal:
            return False, None
        return True, self.outcome(workflow_id, status, row["output"], row["error"])

    def published(self, workflow_id: str, key: str) -> tuple[bool, Any]:
        """(True, the value) a workflow published last under `key`, else (False, None):
        one look, for get_event's wait."""
        row = self.db.fetch_one("get_event", {"workflow_id": workflow_id, "key": key})
        return (False, None) if row is None else (True, self.serializer.loads(row["value"]))

    def outcome(
        self, workflow_id: str, status: WorkflowStatus, output: str | None, error: str | None
    ) -> Any:
        """The value of a finished workflow, or the error it finished with."""
        if status is WorkflowStatus.SUCCESS:
            return None if output is None else self.serializer.loads(output)
        if status is WorkflowStatus.CANCELLED:
            row = self.db.fetch_one("get_cancel_request", {"workflow_id": workflow_id}) or {}
            if error is not None and decode_error(error)[0].endswith("WorkflowTimeoutError"):
                raise WorkflowTimeoutError(workflow_id, row.get("timeout_seconds"))
            raise WorkflowCancelledError(workflow_id, row.get("cancel_reason"))
        if error is not None:
            error_type, message, trace = decode_error(error)
            raise WorkflowFailedError(workflow_id, error_type, message, trace)
        raise WorkflowFailedError(workflow_id, status.value, f"ended as {status.value}")

    # -- journals and ledgers ----------------------------------------------------------

    def steps(self, workflow_id: str) -> list[StepRecord]:
        """The journal of one workflow, in call order."""
        check_name("workflow_id", workflow_id)
        return [
            StepRecord.from_row(r)
            for r in self.db.fetch_all("load_journal", {"workflow_id": workflow_id})
        ]

    def effects(self, workflow_id: str) -> list[dict[str, Any]]:
        """The effect ledger of one workflow: key, status, result or error, in order, and
        `undone_by`: the workflow whose compensation undid the effect (this one, or a fork
        sharing it), or None."""
        check_name("workflow_id", workflow_id)
        return self.db.fetch_all("list_effects", {"workflow_id": workflow_id})

    def events(self, workflow_id: str) -> dict[str, Any]:
        """Every event the workflow published (durable.set_event), by key: latest values."""
        check_name("workflow_id", workflow_id)
        rows = self.db.fetch_all("list_events", {"workflow_id": workflow_id})
        return {r["key"]: self.serializer.loads(r["value"]) for r in rows}

    def tool_calls(self, workflow_id: str) -> list[dict[str, Any]]:
        """An agent's tool calls in order: name, arguments, result (or error), latency, cost."""
        check_name("workflow_id", workflow_id)
        rows = self.db.fetch_all("list_tool_calls", {"workflow_id": workflow_id})
        loads = self.serializer.loads
        return [
            {
                "step_seq": r["step_seq"],
                "tool": r["tool_name"],
                "arguments": loads(r["arguments"]),
                "result": None if r["output"] is None else loads(r["output"]),
                "error": None if r["error"] is None else decode_error(r["error"])[1],
                "latency_ms": r["latency_ms"],
                "dollars": float(r["dollars"]),
                "tokens": int(r["tokens"]),
            }
            for r in rows
        ]

    def get_state(self, workflow_id: str, at_step: int | None = None) -> Any:
        """The workflow's durable.state: the latest, or as it was when the workflow reached
        step position `at_step` (what a fork from that step starts with)."""
        check_name("workflow_id", workflow_id)
        before = 2**31 - 1 if at_step is None else at_step
        row = self.db.fetch_one("latest_state", {"workflow_id": workflow_id, "before_seq": before})
        return None if row is None else self.serializer.loads(row["output"])

    def state_text(self, workflow_id: str) -> str | None:
        """The latest durable.state as stored (serialized), or None."""
        check_name("workflow_id", workflow_id)
        row = self.db.fetch_one(
            "latest_state", {"workflow_id": workflow_id, "before_seq": 2**31 - 1}
        )
        return None if row is None else str(row["output"])

    def conversation(self, workflow_id: str) -> list[dict[str, Any]]:
        """The turns the workflow appended with durable.append_turn, oldest first."""
        check_name("workflow_id", workflow_id)
        rows = self.db.fetch_all("list_turns", {"workflow_id": workflow_id})
        return [self.serializer.loads(r["output"]) for r in rows]

    def budget(self, workflow_id: str) -> dict[str, Any] | None:
        """The budget ledger workflow `workflow_id` draws from: limits, spent, and every
        charge in order (None if it has no budget)."""
        check_name("workflow_id", workflow_id)
        row = self.db.fetch_one("budget_of", {"workflow_id": workflow_id})
        if row is None:
            raise WorkflowNotFoundError(workflow_id)
        if row["budget_id"] is None:
            return None
        ledger_row = self.db.fetch_one("get_budget", {"budget_id": row["budget_id"]})
        if ledger_row is None:
            return None
        ledger = Ledger.from_row(ledger_row)
        charges = self.db.fetch_all("list_charges", {"budget_id": ledger.budget_id})
        return {
            "budget_id": ledger.budget_id,
            **ledger.as_dict(),
            "exhausted": ledger.exhausted(),
            "charges": [
                {
                    "workflow_id": c["workflow_id"],
                    "step_seq": c["step_seq"],
                    "step_name": c["step_name"],
                    "dollars": float(c["dollars"]),
                    "tokens": int(c["tokens"]),
                }
                for c in charges
            ],
        }

    # -- what waits, and who runs it ---------------------------------------------------

    def list_approvals(
        self, workflow_id: str | None = None, *, waiting_only: bool = True, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Approval gates (waiting ones by default), as dicts of their stored columns."""
        return self.db.fetch_all(
            "list_approvals",
            {"workflow_id": workflow_id, "waiting_only": waiting_only, "limit": limit},
        )

    def approval_inbox(
        self, *, waiting_only: bool = True, limit: int = 100, last_steps: int = 3
    ) -> list[dict[str, Any]]:
        """Gates with what an approver needs to decide: list_approvals' columns, the
        workflow's `workflow_name`, `workflow_version` and `workflow_status`, its latest
        durable.state as stored (`state`, or None) and its last journal rows (`last_steps`,
        oldest first, without state updates). Two statements, whatever the number of gates."""
        gates = self.db.fetch_all("approval_inbox", {"waiting_only": waiting_only, "limit": limit})
        ids = sorted({g["workflow_id"] for g in gates})
        rows = self.db.fetch_all("inbox_context", {"workflow_ids": ids, "last": last_steps})
        states: dict[str, str] = {}
        recent: dict[str, list[StepRecord]] = {}
        for row in rows:
            if row["kind"] == "state":
                states[row["workflow_id"]] = row["output"]
            else:
                recent.setdefault(row["workflow_id"], []).append(StepRecord.from_row(row))
        for gate in gates:
            gate["state"] = states.get(gate["workflow_id"])
            gate["last_steps"] = recent.get(gate["workflow_id"], [])
        return gates

    def list_schedules(self) -> list[dict[str, Any]]:
        """Stored schedules, as dicts of their columns."""
        return self.db.fetch_all("list_schedules", {})

    def executors(self) -> list[dict[str, Any]]:
        """Executors (engines and workers) with their last heartbeat."""
        return self.db.fetch_all("list_executors", {})

    def queues(self) -> list[dict[str, Any]]:
        """Every queue with entries: how many wait for a slot, hold one, have finished."""
        return self.db.fetch_all("queue_depths", {})

    def queue_partitions(self, queue_name: str) -> list[dict[str, Any]]:
        """The partitions of a queue with unfinished entries: per `partition_key`, how many
        wait for a slot (`queued`) and hold one (`active`, at most the queue's
        partition_concurrency)."""
        check_name("queue_name", queue_name)
        return self.db.fetch_all("queue_partitions", {"queue_name": queue_name})

    def waiting_for_worker(
        self, stale_seconds: float = 120, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Runnable workflows no live executor can run (its code is nowhere registered)."""
        return self.db.fetch_all(
            "waiting_for_worker", {"stale_seconds": stale_seconds, "limit": limit}
        )

    def worker_wait(self, workflow_id: str) -> dict[str, Any]:
        """Whether one workflow waits for a worker that has its code, and where it could go:
        `waiting` (it is runnable, or interrupted, and no live executor has its name and
        version), its `name`, `version` and `status`, and `live_versions`, the versions of
        its name that live executors have (None for no version), so that an operator can
        move it with `resume(id, version=...)`. One statement."""
        check_name("workflow_id", workflow_id)
        row = self.db.fetch_one(
            "worker_wait",
            {"workflow_id": workflow_id, "stale_seconds": self.config.live_seconds},
        )
        if row is None:
            raise WorkflowNotFoundError(workflow_id)
        return {
            "workflow_id": row["workflow_id"],
            "name": row["name"],
            "version": row["version"],
            "status": WorkflowStatus(row["status"]),
            "waiting": bool(row["waiting"]),
            "live_versions": [v or None for v in row["live_versions"]],
        }

    def audit_log(
        self,
        workflow_id: str | None = None,
        *,
        action: str | None = None,
        before: tuple[dt.datetime, Any] | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """The operator actions recorded (who cancelled, resumed, moved, forked, imported,
        decided, raised a budget, paused or deleted a schedule: see _client/audit.py), newest
        first, as dicts: workflow_id ('' for a schedule's), audit_id, at, actor, action,
        subject, detail. Of one workflow, or ('') the schedules', or (None) all; `action`
        keeps one kind; `before`, the last row's (at, audit_id), gives the next page."""
        from durable._client import audit as _audit

        if workflow_id:
            check_name("workflow_id", workflow_id)
        check_text("action", action)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigurationError(f"limit={limit!r}: give a number of rows >= 1")
        return _audit.read(self, workflow_id, action=action, before=before, limit=limit)


def _prefix_end(prefix: str) -> str:
    """The least string above every string starting with `prefix`, in byte (code point)
    order: the prefix with its last character incremented (surrogates are not text)."""
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if code == 0xD800:
            code = 0xE000
        if code <= 0x10FFFF:
            return prefix[:i] + chr(code)
    return prefix + "\U0010ffff"  # only U+10FFFF characters: nothing sorts above; unreachable


def _later(
    a: dt.datetime | None, b: dt.datetime | None, *, earlier: bool = False
) -> dt.datetime | None:
    """The narrower of two bounds (the later start, or with `earlier` the earlier end)."""
    if a is None or b is None:
        return a if b is None else b
    return min(a, b) if earlier else max(a, b)
