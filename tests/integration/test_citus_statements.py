"""Every statement durable sends runs on a Citus-distributed schema, and a run's own
statements each stay on one shard.

One database on the cluster (tests/citus.py), migrated and distributed as
`durable migrate --citus` does, holds for each test a workflow of its own in every state a
statement needs (running with a journal, an effect, a gate, a message, an event, a stream,
a budget; a queue entry; finished, failed and suspended ones), so that each statement runs
with the parameters durable gives it, against rows it acts on. Citus refuses at planning
what it cannot distribute (a function that is not IMMUTABLE where it must be, a
multi-shard row lock, ...): each named statement of queries.sql must run without error.

The hot statements of one run (step records, fences, claims of one workflow, finishes,
waits) must each be routed to a single shard: their plans are checked, not timed, as
test_fence_plans does on one server, and so are the commands Citus sends when it runs them.
The statements that fan out over every shard are the others; docs/scaling.md lists them
with what each costs.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterator
from decimal import Decimal
from importlib import resources
from typing import Any

import psycopg
import pytest
from psycopg import sql

import durable
from durable._io.systemdb import load_queries
from tests.citus import CitusCluster

pytestmark = pytest.mark.citus

NOW = dt.datetime.now(dt.UTC)
LONG_AGO = NOW - dt.timedelta(days=30)


@pytest.fixture(scope="module")
def cluster_db(citus_cluster: CitusCluster) -> Iterator[str]:
    """One database for the module: migrated, distributed, and the application database's
    `transaction_outputs` (a @transaction step's journal when the app database is another)."""
    url = citus_cluster.create_database()
    with durable.Client(url, migrate=True) as client:
        client.distribute_citus()
        text = resources.files("durable._io.sql").joinpath("app_migrations.sql").read_text()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL(text).format(schema=sql.Identifier("durable")))
    yield url
    citus_cluster.drop_database(url)


@pytest.fixture(scope="module")
def statements(cluster_db: str) -> dict[str, str]:
    """The statements as the engine renders them."""
    with durable.Client(cluster_db) as client:
        return {name: client.db.statement(name) for name in load_queries()}


def seed(conn: psycopg.Connection[Any], w: str) -> None:
    """Rows for workflow `w` and its neighbours, in every state some statement needs."""
    running = (
        "INSERT INTO durable.workflows (workflow_id, name, status, inputs, owner, epoch,"
        " lease_expires_at, budget_id, timeout_seconds, deadline_at)"
        " VALUES (%s, 'wf', 'RUNNING', '[]', 'me', 1, now() + interval '30 s', %s, 60,"
        " now() + interval '60 s')"
    )
    conn.execute(running, [w, w])
    conn.execute(running, [f"{w}-child", w])
    conn.execute(
        "UPDATE durable.workflows SET parent_id = %s, parent_step_seq = 7 WHERE workflow_id = %s",
        [w, f"{w}-child"],
    )
    for suffix, status, finished in (
        ("done", "SUCCESS", LONG_AGO),
        ("failed", "ERROR", LONG_AGO),
        ("asleep", "SUSPENDED", None),
        ("pending", "PENDING", None),
        ("expired", "RUNNING", None),
    ):
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs, finished_at,"
            " error, owner, epoch, lease_expires_at, wake_at)"
            " VALUES (%s, 'wf', %s, '[]', %s, %s, %s, 1, %s, %s)",
            [
                f"{w}-{suffix}",
                status,
                finished,
                '{"type": "ValueError"}' if status == "ERROR" else None,
                "gone" if status == "RUNNING" else None,
                LONG_AGO if status == "RUNNING" else None,
                LONG_AGO if status == "SUSPENDED" else None,
            ],
        )
    conn.execute(
        "INSERT INTO durable.workflows (workflow_id, name, status, inputs, queue_name,"
        " dedup_key) VALUES (%s, 'wf', 'ENQUEUED', '[]', %s, 'k')",
        [f"{w}-queued", f"q-{w}"],
    )
    conn.execute(
        "INSERT INTO durable.queue_dedup (queue_name, dedup_key, workflow_id) VALUES (%s, 'k', %s)",
        [f"q-{w}", f"{w}-queued"],
    )
    # A partition of the queue with one entry holding a slot and one waiting.
    conn.execute(
        "INSERT INTO durable.workflows (workflow_id, name, status, inputs, queue_name,"
        " partition_key, dequeued_at, owner, epoch, lease_expires_at)"
        " VALUES (%s, 'wf', 'RUNNING', '[]', %s, 'p1', now(), 'me', 1, now() + interval '30 s'),"
        " (%s, 'wf', 'ENQUEUED', '[]', %s, 'p1', NULL, NULL, 0, NULL)",
        [f"{w}-held-p1", f"q-{w}", f"{w}-queued-p1", f"q-{w}"],
    )
    conn.execute(
        "INSERT INTO durable.steps (workflow_id, step_seq, step_name, kind, output, error)"
        " VALUES (%(w)s, 0, 's', 'step', '1', NULL), (%(w)s, 1, 'state', 'state', '{}', NULL),"
        " (%(w)s, 2, 'turn', 'turn', '\"hi\"', NULL),"
        " (%(w)s || '-failed', 0, 's', 'step', NULL, '{}'),"
        " (%(w)s || '-done', 0, 's', 'step', '1', NULL)",
        {"w": w},
    )
    conn.execute(
        "INSERT INTO durable.effects (workflow_id, step_seq, effect_name, idempotency_key,"
        " status, params_fingerprint, updated_at) VALUES (%s, 3, 'pay', 'k', 'intent', 'f', %s),"
        " (%s, 0, 'pay', 'k', 'applied', 'f', %s)",
        [w, NOW, f"{w}-done", LONG_AGO],
    )
    conn.execute(
        "INSERT INTO durable.approvals (workflow_id, name, step_seq, status, payload,"
        " expires_at) VALUES (%s, 'gate', 4, 'waiting', '{}', now() + interval '1 h'),"
        " (%s, 'gate', 0, 'waiting', '{}', %s), (%s, 'budget@5', 5, 'denied', NULL, NULL)",
        [w, f"{w}-asleep", LONG_AGO, w],
    )
    conn.execute(
        "INSERT INTO durable.early_messages (workflow_id, message_id, topic, payload, created_at)"
        " VALUES (%s, 'm-0', 'topic', '0', %s), (%s, 'm-0', 'topic', '0', %s)",
        [f"{w}-asleep", NOW, f"{w}-unborn", LONG_AGO],
    )
    conn.execute(
        "INSERT INTO durable.messages (workflow_id, message_id, topic, payload)"
        " VALUES (%s, 'm-1', 'topic', '1'), (%s, 'm-1', 'topic', '1')",
        [w, f"{w}-asleep"],
    )
    conn.execute(
        "INSERT INTO durable.events (workflow_id, key, value, step_seq) VALUES (%s, 'ev', '1', 5)",
        [w],
    )
    conn.execute(
        'INSERT INTO durable.streams (workflow_id, key, "offset", value, step_seq)'
        " VALUES (%s, 'st', 0, '1', 6)",
        [w],
    )
    conn.execute(
        "INSERT INTO durable.budgets (budget_id, limit_dollars, limit_tokens, limit_steps)"
        " VALUES (%s, 10, 1000, 100)",
        [w],
    )
    conn.execute(
        "INSERT INTO durable.charges (workflow_id, step_seq, budget_id, dollars, tokens, steps)"
        " VALUES (%s, 0, %s, 0.5, 10, 1)",
        [w, w],
    )
    conn.execute(
        "INSERT INTO durable.tool_calls (workflow_id, step_seq, tool_name, arguments,"
        " latency_ms) VALUES (%s, 0, 's', '{}', 1.5)",
        [w],
    )
    conn.execute(
        "INSERT INTO durable.executors (executor_id, hostname, pid, started_at, heartbeat_at,"
        " capabilities) VALUES (%s, 'h', 1, %s, %s, '[[\"wf\", null]]')"
        " ON CONFLICT DO NOTHING",
        [f"exec-{w}", NOW, LONG_AGO],
    )
    conn.execute(
        "INSERT INTO durable.schedules (schedule_name, workflow_name, cron)"
        " VALUES (%s, 'wf', '* * * * *')",
        [f"sched-{w}"],
    )
    conn.execute(
        "INSERT INTO durable.callbacks (token_hash, workflow_id, kind, target, expires_at)"
        " VALUES (%s, %s, 'message', 'topic', now() + interval '1 h')",
        [f"h-{w}", w],
    )


def params(name: str, w: str) -> dict[str, Any]:
    """The parameters durable gives statement `name`, about workflow `w`'s rows."""
    workflow = {
        "workflow_id": w,
        "name": "wf",
        "version": None,
        "inputs": "[]",
        "serializer": "json",
        "durability": "sync",
        "parent_id": None,
        "parent_step_seq": None,
        "timeout_seconds": None,
        "budget_id": None,
        "trace_context": None,
        "journal_version": 1,
        "max_recovery_attempts": None,
        "attributes": '{"customer": "c-1"}',
    }
    step = {
        "workflow_id": w,
        "epoch": 1,
        "step_seq": 10,
        "step_name": "s",
        "kind": "step",
        "output": "1",
        "error": None,
        "attempts": 1,
        "child_workflow_id": None,
        "started_at": NOW,
    }
    arrays = {
        "seqs": [10, 11],
        "names": ["s", "s"],
        "kinds": ["step", "step"],
        "outputs": ["1", "2"],
        "errors": [None, None],
        "attempts": [1, 1],
        "started": [NOW, NOW],
    }
    claim = {
        "owner": f"exec-{w}",
        "incarnation": "i1",
        "lease_seconds": 30.0,
        "max_attempts": 10,
        "workflow_ids": None,
        "names": ["wf"],
        "versions": [""],
        "journal_version": 1,
        "limit": 10,
        # Routed: entries of its queue, and work from no queue.
        "queues": [f"q-{w}"],
    }
    queue = {
        **claim,
        "queue_name": f"q-{w}",
        "concurrency": 5,
        "worker_concurrency": None,
        "rate_count": None,
        "rate_period": 1.0,
        "by_priority": False,
        "partition_concurrency": None,
        "partition_rate_count": None,
        "partition_rate_period": 0.0,
    }
    fenced = {"workflow_id": w, "epoch": 1}
    fork = {
        "workflow_id": w,
        "new_id": f"{w}-fork",
        "before_seq": 3,
        "copied": [0, 1, 2],
        "event_prefix": "event:",
        "journal_version": 1,
    }
    held = {"owner": "me", "incarnation": "i1", "held": [w, f"{w}-child"], "epochs": [1, 1]}
    exported = {"workflow_ids": [w, f"{w}-child"]}
    imported = imported_rows(f"{w}-imp")
    table: dict[str, dict[str, Any]] = {
        "insert_workflow": {
            **workflow,
            "workflow_id": f"{w}-new",
            "owner": "me",
            "lease_seconds": 30.0,
            "timeout_seconds": 60.0,
            "budget_id": f"{w}-new",
        },
        "insert_workflow_pending": {**workflow, "workflow_id": f"{w}-new"},
        "get_workflow": {"workflow_id": w},
        "get_workflow_status": {"workflow_id": w},
        "list_workflows": {
            "status": None,
            "name": None,
            "id_from": None,
            "id_to": None,
            "created_from": None,
            "created_to": None,
            "top_level": True,
            "search": "[",
            "statuses": ["PENDING", "RUNNING"],
            "version": "",
            "parent_id": None,
            "attr_eq": '{"customer": "c-1"}',
            "attr_path": '$."amount" >= $v0 && $."due".datetime() < $v1.datetime()',
            "attr_vars": '{"v0": 100, "v1": "2026-01-01T00:00:00+00:00"}',
            "after_at": None,
            "after_id": None,
            "limit": 50,
            "stale_seconds": 120.0,
        },
        "count_workflows": {
            "status": None,
            "name": "wf",
            "id_from": None,
            "id_to": None,
            "created_from": None,
            "created_to": None,
            "top_level": True,
            "search": "[",
            "statuses": ["PENDING", "RUNNING"],
            "version": "",
            "parent_id": None,
            "attr_eq": '{"customer": "c-1"}',
            "attr_path": '$."amount" >= $v0 && $."due".datetime() < $v1.datetime()',
            "attr_vars": '{"v0": 100, "v1": "2026-01-01T00:00:00+00:00"}',
            "cap": 10_000,
        },
        "list_children": {"parent_ids": [w], "limit": 1000},
        "load_journal": {"workflow_id": w},
        "load_journals": {"workflow_ids": [w, f"{w}-done"]},
        "abandon_workflow": fenced,
        "prune_executors": {"stale_seconds": 3600.0},
        "finished_among": {"workflow_ids": [w, f"{w}-done"]},
        "patch_point_started": {"workflow_id": w, "step_seq": 3},
        "child_started_at": {"workflow_id": w, "step_seq": 3},
        "message_sent_at": {"workflow_id": w, "step_seq": 3},
        "abandon_owned": {"owner": f"exec-{w}", "incarnation": "i1", "dead": False},
        "queue_depths": {},
        "release_workflow": fenced,
        "children_of": {"workflow_ids": [w]},
        "cancel_workflows": {
            "workflow_ids": [w, f"{w}-child", f"{w}-pending", f"{w}-asleep"],
            "reason": "stop",
            "error": '{"type": "x"}',
        },
        "get_cancel_request": {"workflow_id": w},
        "owned_cancel_requests": {"owner": "me", "incarnation": "i1", "held": [w, f"{w}-child"]},
        "resume_workflow": {"workflow_id": f"{w}-failed", "version": "2", "journal_version": 1},
        "move_workflow": {"workflow_id": f"{w}-expired", "version": "2", "journal_version": 1},
        "pause_workflow": {"workflow_id": f"{w}-pending"},
        "unpause_workflow": {"workflow_id": f"{w}-pending"},
        "fork_workflow": {
            "workflow_id": w,
            "new_id": f"{w}-fork",
            "trace_context": None,
            "journal_version": 1,
            "version": None,
        },
        "fork_seqs": fork,
        "fork_steps": fork,
        "fork_tool_calls": fork,
        "fork_charges": fork,
        "fork_streams": fork,
        "fork_events": fork,
        "fork_gates": fork,
        "fork_messages": fork,
        "export_snapshot": {},
        "export_workflows": exported,
        "export_steps": exported,
        "export_effects": exported,
        "export_approvals": exported,
        "export_messages": exported,
        "export_events": exported,
        "export_streams": exported,
        "export_budgets": exported,
        "export_charges": exported,
        "export_tool_calls": exported,
        "import_taken": {"workflow_ids": [w, f"{w}-imp"]},
        "import_columns": {},
        **{f"import_{table}": {"rows": json.dumps(rows)} for table, rows in imported.items()},
        "notify_work": {"channel": "durable_work", "payload": w},
        "list_executors": {},
        "waiting_for_worker": {"stale_seconds": 60.0, "limit": 50},
        "worker_wait": {"workflow_id": f"{w}-pending", "stale_seconds": 60.0},
        "record_step": step,
        "record_step_in_app": step,
        "begin_step_attempt": {**fenced, "step_seq": 10, "attempt": 1, "heartbeat_timeout": 5.0},
        "heartbeat_step": {
            **fenced,
            "step_seq": 10,
            "attempt": 1,
            "heartbeat_timeout": 5.0,
            "details": "3",
        },
        "last_step_heartbeat": {"workflow_id": w, "step_seq": 10},
        "end_step_attempt": {**fenced, "step_seq": 10, "attempt": 1},
        "expire_stuck_steps": {"slack": 1.5},
        "export_step_attempts": exported,
        "export_late_charges": exported,
        "add_late_charge": {
            "workflow_id": w,
            "charge_key": "3:10:1",
            "step_seq": 10,
            "budget_id": w,
            "dollars": Decimal("0.25"),
            "tokens": 5,
        },
        "finish_workflow": {**fenced, "status": "SUCCESS", "output": "1", "error": None},
        "finish_refused": fenced,
        "get_incarnation": {"workflow_id": w},
        "finish_workflows": {
            "workflow_ids": [w, f"{w}-child"],
            "epochs": [1, 1],
            "statuses": ["SUCCESS", "SUCCESS"],
            "outputs": ["1", "2"],
            "errors": [None, None],
        },
        "finish_with_steps": {
            **fenced,
            "status": "SUCCESS",
            "output": "1",
            "error": None,
            **arrays,
        },
        "claim_batch": claim,
        "claim_batch_cas": claim,
        "claim_candidates_on_shards": claim,
        "claim_candidates_on_nodes": {**claim, "hung": []},
        "citus_probe_session": {"ms": 2000},
        "citus_probe_nodes": {},
        "citus_set_local": {},
        "claim_lock_wait": {},
        "citus_session": {},
        "nodes_of": held,
        "renew_claim": {**fenced, "lease_seconds": 30.0},
        "renew_leases": {**held, "lease_seconds": 30.0},
        "release_owned": held,
        "get_executor": {"executor_id": f"exec-{w}"},
        "metrics_workflows": {},
        "metrics_executors": {},
        "metrics_registered": {"executor_id": f"exec-{w}", "incarnation": "inc"},
        "wake_if_message": {"workflow_id": f"{w}-asleep", "topic": "topic"},
        "join_suspension": {"workflow_id": f"{w}-asleep", "epoch": 1, "wake_at": NOW},
        "wake_if_decided": {"workflow_id": f"{w}-asleep", "name": "gate"},
        "upsert_executor": {
            "executor_id": f"exec-{w}",
            "hostname": "h",
            "pid": 2,
            "capabilities": json.dumps([["wf", None]]),
            "incarnation": "i1",
            "host_key": "h/boot/pid:[1]",
            "pid_start": 12345,
        },
        "heartbeat_executor": {
            "executor_id": f"exec-{w}",
            "hostname": "h",
            "pid": 2,
            "capabilities": json.dumps([["wf", None]]),
            "incarnation": "i1",
            "host_key": "h/boot/pid:[1]",
            "pid_start": 12345,
        },
        "delete_executor": {"executor_id": f"exec-{w}", "incarnation": "i1"},
        "holder_of": {"workflow_id": w},
        "executors_on_host": {"host_key": "h/boot/pid:[1]", "executor_id": f"exec-{w}"},
        "abandon_dead_executor": {"owner": f"exec-{w}-dead", "incarnation": "i0"},
        "forget_dead_executor": {"owner": f"exec-{w}-dead", "incarnation": "i0"},
        "app_migration_lock": {"key": 42},
        "app_record_transaction": {
            "workflow_id": w,
            "step_seq": 10,
            "step_name": "t",
            "output": "1",
            "error": None,
        },
        "app_get_transaction": {"workflow_id": w, "step_seq": 10},
        "app_refuses_writes": {},
        "database_identity": {},
        "app_outbox_put": {
            "outbox_id": f"workflow:{w}",
            "statement": "insert_workflow_pending",
            "params": "{}",
        },
        "app_outbox_take": {"limit": 10},
        "app_outbox_done": {"outbox_ids": [f"workflow:{w}"]},
        "effect_intent": {
            **fenced,
            "idempotency_key": "k2",
            "step_seq": 10,
            "effect_name": "pay",
            "params_fingerprint": "f",
        },
        "get_effect": {"workflow_id": w, "idempotency_key": "k"},
        "effect_pending": {**fenced, "idempotency_key": "k"},
        "settle_effect": {
            **fenced,
            "idempotency_key": "k",
            "status": "applied",
            "result": "1",
            "error": None,
            "reconciled": False,
            "step_seq": 3,
            "step_name": "pay",
            "started_at": NOW,
        },
        "list_effects": {"workflow_id": w},
        # A fork claiming the undo of an effect its original applied (another shard).
        "claim_undo": {**fenced, "applied_in": f"{w}-done", "step_seq": 0},
        "approval_request": {
            **fenced,
            "name": "gate2",
            "step_seq": 10,
            "payload": "{}",
            "default_approved": False,
            "timeout_seconds": 3600.0,
        },
        "get_approval": {"workflow_id": w, "name": "gate"},
        "suspend_for_approval": {**fenced, "name": "gate"},
        "decide_approval": {
            "workflow_id": w,
            "name": "gate",
            "status": "approved",
            "comment": "ok",
            "decided_by": "me",
        },
        "expire_approvals": {},
        "expire_approval": {"workflow_id": w, "name": "gate"},
        "list_approvals": {"workflow_id": None, "waiting_only": True, "limit": 50},
        "approval_inbox": {"waiting_only": False, "limit": 50},
        "inbox_context": {"workflow_ids": [w, f"{w}-done"], "last": 3},
        "record_steps": {
            **arrays,
            "workflow_ids": [w, f"{w}-child"],
            "epochs": [1, 1],
        },
        "record_run_steps": {**fenced, **arrays},
        "suspend_until": {**fenced, "wake_at": NOW, "topic": "other"},
        "suspend_for_any": {**fenced, "wake_at": NOW, "topics": ["other"], "gates": ["g"]},
        "wake_if_any": {"workflow_id": f"{w}-asleep", "topics": ["topic"], "gates": ["gate"]},
        "wake_workflow": {"workflow_id": f"{w}-asleep"},
        "wake_due": {"workflow_ids": None},
        "due_on_shards": {},
        "shard_keys": {},
        "make_queue_lock": {"queue_name": f"q-{w}"},
        "lock_queue_row": {"queue_name": f"q-{w}"},
        "runnable_on_shard": {**claim, "shard_key": w, "at_time": None},
        "enqueued_on_shard": {**queue, "shard_key": w, "at_time": NOW},
        "insert_callback": {
            "token_hash": f"h-{w}-new",
            "workflow_id": w,
            "kind": "message",
            "target": "topic",
            "expires_at": NOW + dt.timedelta(hours=1),
        },
        "use_callback": {"token_hash": f"h-{w}", "outcome": '{"status": "delivered"}'},
        "find_callback": {"token_hash": f"h-{w}"},
        "prune_callbacks": {"older_than": 0.0, "batch": 10},
        "send_message": {
            "workflow_id": f"{w}-asleep",
            "message_id": "m-2",
            "topic": "topic",
            "payload": "2",
            "sender_id": w,
            "sender_seq": 4,
        },
        "consume_message": {**fenced, "topic": "topic", "step_seq": 10, "step_name": "recv"},
        "set_event": {**fenced, "step_seq": 10, "step_name": "ev", "key": "ev", "value": "2"},
        "set_attributes": {
            **fenced,
            "step_seq": 10,
            "step_name": "durable.attributes",
            "attributes": '{"stage": "paid"}',
            "output": '{"stage": "paid"}',
        },
        "set_step_event": {**fenced, "step_seq": 1, "key": "ev-step", "value": "3"},
        "write_stream": {
            **fenced,
            "step_seq": 10,
            "step_name": "st",
            "key": "st",
            "offset": 1,
            "value": "2",
            "closed": False,
            "channel": "durable_stream",
        },
        "read_stream": {"workflow_id": w, "key": "st", "offset": 0, "limit": 100},
        "list_events": {"workflow_id": w},
        "get_event": {"workflow_id": w, "key": "ev"},
        "upsert_schedule": {
            "schedule_name": f"sched-{w}",
            "workflow_name": "wf",
            "workflow_version": None,
            "cron": "*/5 * * * *",
            "timezone": "UTC",
            "catch_up": 0,
        },
        "due_schedules": {"names": ["wf"], "versions": [""]},
        "lock_schedule": {"schedule_name": f"sched-{w}"},
        "set_schedule_mark": {"schedule_name": f"sched-{w}", "last_tick": NOW},
        "list_schedules": {},
        "set_schedule_paused": {"schedule_name": f"sched-{w}", "paused": True},
        "delete_schedule": {"schedule_name": f"sched-{w}"},
        "insert_audit": {
            "actor": "ana@ops via cli",
            "workflow_ids": [w, ""],
            "audit_ids": [uuid.uuid4(), uuid.uuid4()],
            "actions": ["cancel", "delete schedule"],
            "subjects": [None, f"sched-{w}"],
            "details": ["why", None],
        },
        "audit_of_workflow": {
            "workflow_id": w,
            "action": None,
            "before_at": NOW,
            "before_id": uuid.uuid4(),
            "limit": 10,
        },
        "list_audit": {"action": "cancel", "before_at": None, "before_id": None, "limit": 10},
        "enqueue_workflow": {
            **workflow,
            "workflow_id": f"{w}-queued2",
            "queue_name": f"q-{w}",
            "priority": 0,
            "dedup_key": None,
            "delay_seconds": 0.0,
            "partition_key": "p1",
        },
        "take_dedup": {"queue_name": f"q-{w}", "dedup_key": "k", "workflow_id": f"{w}-queued2"},
        "dedup_holder_active": {"holder": f"{w}-queued"},
        "pass_dedup": {"queue_name": f"q-{w}", "dedup_key": "k", "workflow_id": f"{w}-queued2"},
        "push_debounced": {
            "workflow_id": f"{w}-queued",
            "name": "wf",
            "inputs": '{"args": [2], "kwargs": {}}',
            "serializer": "json",
            "period": 60.0,
            "max_wait": 120.0,
        },
        "lock_queue": {"lock_key": f"durable.queue:q-{w}"},
        "dequeue": queue,
        "queue_allowance": queue,
        "queue_partitions": {"queue_name": f"q-{w}"},
        "dequeue_cas": {**queue, "allowed": 5},
        "dequeue_partitioned": {
            **queue,
            "allowed": 5,
            "partition_concurrency": 2,
            "partition_rate_count": 3,
            "partition_rate_period": 60.0,
        },
        "ensure_budget": {
            "budget_id": f"{w}-child",
            "limit_dollars": Decimal("10"),
            "limit_tokens": 1000,
            "limit_steps": 100,
            "limit_seconds": None,
        },
        "get_budget": {"budget_id": w},
        "raise_budget": {
            "budget_id": w,
            "dollars": Decimal("5"),
            "tokens": None,
            "steps": None,
            "seconds": None,
        },
        "denied_budget_gate": {"workflow_id": w, "name": "budget@5"},
        "budget_of": {"workflow_id": w},
        "waiting_budget_gates": {"budget_id": w},
        "record_charged_step": {
            **step,
            "kind": "tool",
            "budget_id": w,
            "dollars": Decimal("0.25"),
            "tokens": 5,
            "steps": 1,
            "arguments": "{}",
            "latency_ms": 2.5,
        },
        "list_charges": {"budget_id": w},
        "list_tool_calls": {"workflow_id": w},
        "latest_state": {"workflow_id": w, "before_seq": 10},
        "list_turns": {"workflow_id": w},
        "prune_finished": {"older_than": 3600.0, "batch": 100},
        "prune_effects": {"older_than": 3600.0, "batch": 100},
        "count_prunable": {"finished_after": 3600.0, "effects_after": 3600.0},
        "keep_early_message": {
            "workflow_id": f"{w}-unborn",
            "message_id": "m-3",
            "topic": "topic",
            "payload": "3",
            "sender_id": None,
            "sender_seq": None,
        },
        "adopt_early_messages": {"workflow_id": f"{w}-asleep", "wake": True},
        "prune_early_messages": {"older_than": 3600.0, "batch": 100},
        "count_early_messages": {"older_than": 3600.0},
        "outbox_write": {
            "topic": f"t-{w}",
            "message_id": f"m-{w}",
            "body": '{"a": 1}',
            "headers": "{}",
        },
        "outbox_notify": {"channel": "durable_outbox", "topic": f"t-{w}"},
        "outbox_take": {"topic": f"t-{w}", "lease_seconds": 30.0, "limit": 10},
        "outbox_ack": {"topic": f"t-{w}", "message_id": f"m-{w}"},
        "outbox_retry": {"topic": f"t-{w}", "message_id": f"m-{w}", "delay_seconds": 1.0},
        "outbox_reject": {"topic": f"t-{w}", "message_id": f"m-{w}", "reason": "bad"},
        # The console's.
        "terminate_workflows": {
            "workflow_ids": [w, f"{w}-child", f"{w}-pending", f"{w}-asleep"],
            "reason": "stop",
            "error": '{"type": "x"}',
        },
        "running_steps": {"workflow_ids": [w, f"{w}-done"]},
    }
    listed = {k: v for k, v in table["list_workflows"].items() if not k.startswith("after_")}
    table["list_workflows_sorted"] = listed | {"sort": "name", "descending": False, "offset": 9}
    return table[name]


def imported_rows(w: str) -> dict[str, list[dict[str, Any]]]:
    """A row of each table for an import of workflow `w` (every column an export holds
    that is NOT NULL)."""
    at = NOW.isoformat()
    return {
        "workflows": [
            {
                "workflow_id": w,
                "name": "wf",
                "status": "PENDING",
                "inputs": "[]",
                "serializer": "json",
                "durability": "sync",
                "epoch": 3,
                "recovery_attempts": 0,
                "priority": 0,
                "created_at": at,
                "updated_at": at,
                "budget_id": w,
                "journal_version": 1,
                "attributes": {"customer": "c-1"},
            }
        ],
        "budgets": [
            {
                "budget_id": w,
                "limit_dollars": "1.25",
                "spent_dollars": "0.5",
                "spent_tokens": 10,
                "spent_steps": 1,
                "created_at": at,
                "updated_at": at,
            }
        ],
        "steps": [
            {
                "workflow_id": w,
                "step_seq": 0,
                "step_name": "s",
                "kind": "step",
                "output": "1",
                "attempts": 1,
                "finished_at": at,
            }
        ],
        "charges": [
            {
                "workflow_id": w,
                "step_seq": 0,
                "budget_id": w,
                "dollars": "0.5",
                "tokens": 10,
                "steps": 1,
                "created_at": at,
            }
        ],
        "tool_calls": [
            {
                "workflow_id": w,
                "step_seq": 0,
                "tool_name": "s",
                "arguments": "{}",
                "latency_ms": 1.5,
                "created_at": at,
            }
        ],
        "effects": [
            {
                "workflow_id": w,
                "step_seq": 1,
                "effect_name": "pay",
                "idempotency_key": f"{w}:1",
                "status": "applied",
                "params_fingerprint": "f",
                "result": "1",
                "attempts": 1,
                "reconciled": False,
                "created_at": at,
                "updated_at": at,
            }
        ],
        "approvals": [
            {
                "workflow_id": w,
                "name": "gate",
                "step_seq": 2,
                "status": "waiting",
                "default_approved": False,
                "requested_at": at,
            }
        ],
        "messages": [
            {
                "workflow_id": w,
                "message_id": "m-1",
                "topic": "topic",
                "payload": "1",
                "created_at": at,
            }
        ],
        "events": [{"workflow_id": w, "key": "ev", "value": "1", "step_seq": 3, "updated_at": at}],
        "streams": [
            {
                "workflow_id": w,
                "key": "st",
                "offset": 0,
                "value": "1",
                "closed": False,
                "step_seq": 4,
                "created_at": at,
            }
        ],
        "step_attempts": [
            {"workflow_id": w, "step_seq": 5, "epoch": 3, "attempt": 1, "heartbeat_at": at}
        ],
        "late_charges": [
            {
                "workflow_id": w,
                "charge_key": "3:5:1",
                "step_seq": 5,
                "dollars": "0.5",
                "tokens": 10,
                "created_at": at,
            }
        ],
    }


def test_every_statement_has_parameters_here() -> None:
    """A new statement in queries.sql is run on the cluster by this file: give it its
    parameters in params()."""
    missing = []
    for name in load_queries():
        try:
            params(name, "w")
        except KeyError:
            missing.append(name)
    assert missing == []


# Statements of one server that the engine does not send to a distributed schema, and what
# it sends there instead: FOR UPDATE SKIP LOCKED and a join to unnested arrays lock rows of
# many shards in one statement, which Citus cannot do; a LIMIT by subquery is refused.
REPLACED: dict[str, tuple[str, ...]] = {
    "claim_batch": ("claim_batch_cas",),
    "dequeue": ("queue_allowance", "dequeue_cas"),
    "record_steps": ("record_run_steps",),  # one per run
}


def test_the_engine_sends_the_distributed_variants(cluster_db: str) -> None:
    """On a distributed schema the engine claims, dequeues and journals batches with the
    variants (which the test below runs there)."""
    with durable.Client(cluster_db) as client:
        assert client.db.distributed and client.db.cas_claims
    named = load_queries()
    assert all(n in named and set(v) <= set(named) for n, v in REPLACED.items())


# Statements run before the one tested, as durable runs them (in one transaction).
BEFORE: dict[str, list[str]] = {
    "export_workflows": ["export_snapshot"],
    # A budget, gate, message, event and stream references its workflows row; a charge
    # and a tool call their journal row.
    **{
        f"import_{table}": ["import_workflows"]
        for table in (
            "budgets",
            "approvals",
            "messages",
            "events",
            "streams",
            "step_attempts",
            "late_charges",
        )
    },
    "import_charges": ["import_steps"],
    "import_tool_calls": ["import_steps"],
    "fork_steps": ["fork_workflow"],
    **{
        name: ["fork_workflow", "fork_steps"]
        for name in (
            "fork_tool_calls",
            "fork_charges",
            "fork_streams",
            "fork_events",
            "fork_gates",
            "fork_messages",
        )
    },
}


@pytest.mark.parametrize("name", sorted(set(load_queries()) - set(REPLACED)))
def test_the_statement_runs_on_the_distributed_schema(
    cluster_db: str, statements: dict[str, str], name: str
) -> None:
    w = f"w-{name}"
    with psycopg.connect(cluster_db, autocommit=True) as conn:
        seed(conn, w)
        if name not in BEFORE:
            conn.execute(statements[name].encode(), params(name, w))
            return
        with conn.transaction():
            for first in BEFORE[name]:
                conn.execute(statements[first].encode(), params(first, w))
            conn.execute(statements[name].encode(), params(name, w))


# A run's own statements: each must be routed to its workflow's shard (with the shards of
# colocated tables, on one node: one commit, no two-phase commit), not sent to every shard.
HOT = [
    "abandon_workflow",
    "adopt_early_messages",
    "approval_request",
    "begin_step_attempt",
    "budget_of",
    "claim_batch_cas",  # with workflow_ids = [one]: claiming one workflow
    "consume_message",
    "decide_approval",
    "denied_budget_gate",
    "effect_intent",
    "end_step_attempt",
    "effect_pending",
    "ensure_budget",
    "expire_approval",
    "finish_refused",
    "finish_with_steps",
    "finish_workflow",
    "get_approval",
    "get_budget",
    "get_cancel_request",
    "get_incarnation",
    "get_effect",
    "get_event",
    "get_workflow",
    "get_workflow_status",
    "heartbeat_step",
    "patch_point_started",
    "push_debounced",  # debouncing a key again: one queued entry's inputs and start
    "insert_workflow",
    "insert_workflow_pending",
    "join_suspension",
    "keep_early_message",
    "last_step_heartbeat",
    "latest_state",
    "list_turns",
    "load_journal",
    "move_workflow",  # an operator's move of one workflow to another version
    "pause_workflow",  # an operator's pause of one workflow
    "unpause_workflow",  # an operator's unpause of one workflow
    "read_stream",
    "record_charged_step",
    "record_run_steps",
    "record_step",
    "record_step_in_app",
    "release_workflow",
    "renew_claim",
    "resume_workflow",  # an operator's resume (or move) of one workflow
    "send_message",
    "set_attributes",
    "set_event",
    "set_step_event",
    "settle_effect",
    "suspend_for_approval",
    "suspend_for_any",
    "suspend_until",
    "wake_if_any",
    "wake_if_decided",
    "wake_if_message",
    "wake_workflow",
    "worker_wait",  # `durable workflows show`, the console's page of one workflow
    "write_stream",
    # A callback URL's: routed by its token's hash (a shard of callbacks' own group).
    "find_callback",
    "insert_callback",
    "use_callback",
]


def distribution(plan: Any) -> tuple[list[int], set[str], int]:
    """(task count of each distributed step, nodes its tasks run on, subplans) of a plan."""
    counts: list[int] = []
    nodes: set[str] = set()
    subplans = 0
    if isinstance(plan, dict):
        if "Task Count" in plan:
            counts.append(int(plan["Task Count"]))
        if "Node" in plan and isinstance(plan["Node"], str):
            nodes.add(plan["Node"].split(" dbname=")[0])
        subplans += len(plan.get("Subplans", []))
        for value in plan.values():
            c, n, s = distribution(value)
            counts, nodes, subplans = counts + c, nodes | n, subplans + s
    elif isinstance(plan, list):
        for value in plan:
            c, n, s = distribution(value)
            counts, nodes, subplans = counts + c, nodes | n, subplans + s
    return counts, nodes, subplans


def explain(conn: psycopg.Connection[Any], text: str, values: dict[str, Any]) -> Any:
    """The distributed plan of a statement with these values (bound by the client: Citus
    plans a statement's parts with the values in them, as it does when it runs it)."""
    cur = psycopg.ClientCursor(conn)
    text = re.sub(r"%\((\w+)\)b", r"%(\1)s", text)
    row = cur.execute("EXPLAIN (FORMAT JSON) " + text, values).fetchone()
    assert row is not None
    return row[0] if not isinstance(row[0], str) else json.loads(row[0])


@pytest.mark.parametrize("name", HOT)
def test_a_runs_statement_goes_to_its_workflows_shard(
    cluster_db: str, statements: dict[str, str], name: str
) -> None:
    w = f"p-{name}"
    values = params(name, w)
    if name == "claim_batch_cas":
        values = {**values, "workflow_ids": [f"{w}-pending"]}
    with psycopg.connect(cluster_db, autocommit=True) as conn:
        seed(conn, w)
        plan = explain(conn, statements[name], values)
        coordinator = f"port={conn.info.port}"
        sent = run_logged(conn, statements[name], values)
        ranges = shard_ranges(conn, sent)
    counts, nodes, _ = distribution(plan)
    assert counts and set(counts) == {1}, (counts, plan)
    # What the coordinator runs itself (reading what it fetched) is not a shard's.
    workers = {node for node in nodes if not node.endswith(coordinator)}
    assert len(workers) == 1, (nodes, plan)
    # And run as the engine runs it (values bound by the server): the commands sent to the
    # workers name shards of one hash range only, the workflow's.
    assert len(ranges) == 1, (ranges, sent)


def run_logged(conn: psycopg.Connection[Any], text: str, values: dict[str, Any]) -> list[str]:
    """Run a statement; the commands Citus sent to the workers for it."""
    sent: list[str] = []
    conn.add_notice_handler(lambda d: sent.append(d.message_primary or ""))
    conn.execute("SET citus.log_remote_commands = on")
    try:
        conn.execute(text.encode(), values)
    finally:
        conn.execute("SET citus.log_remote_commands = off")
    return [m for m in sent if m.startswith("issuing ")]


def shard_ranges(conn: psycopg.Connection[Any], sent: list[str]) -> set[str]:
    """The hash ranges of the distributed tables' shards named in `sent` (the shards of
    colocated tables that hold one workflow's rows share a range)."""
    ids = {int(i) for m in sent for i in re.findall(r"durable\.[a-z_]+_(\d+)", m)}
    rows = conn.execute(
        "SELECT DISTINCT shardminvalue FROM pg_dist_shard"
        " WHERE shardid = ANY(%s) AND shardminvalue IS NOT NULL",
        [list(ids)],
    ).fetchall()
    return {str(r[0]) for r in rows}
