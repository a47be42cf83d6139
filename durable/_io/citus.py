"""Distributing durable's tables over a Citus cluster: which table is sharded by what.

A durable workflow's rows (its journal, effects, messages, waits, budget) are read and
written together, by one run, keyed by the workflow's id. Sharding every per-workflow
table by `workflow_id`, colocated, keeps each run's statements on one shard: a step's
journal write, fenced by the workflow's row, is a single-shard statement. The few tables
that are not a workflow's (workers, schedules) are small and read by every worker, so
they are copied to every node (reference tables).

The schema test (tests/migration/test_schema_distribution.py) holds the schema to this
map: a table missing from it, a key of a per-workflow table not led by its distribution
column, a foreign key between different workflows' rows, a sequence or a trigger fails
it. `durable migrate --citus --dry-run` prints the statements below; docs/scaling.md
explains them.
"""

from __future__ import annotations

from psycopg import sql

# Per-workflow tables and the column each is sharded by. A budget belongs to the root of
# a workflow tree: its id is that workflow's id.
BY_WORKFLOW: dict[str, str] = {
    "workflows": "workflow_id",
    "steps": "workflow_id",
    "effects": "workflow_id",
    "approvals": "workflow_id",
    "messages": "workflow_id",
    "early_messages": "workflow_id",
    "events": "workflow_id",
    "charges": "workflow_id",
    "tool_calls": "workflow_id",
    "streams": "workflow_id",
    "step_attempts": "workflow_id",
    "late_charges": "workflow_id",
    "budgets": "budget_id",
}

# Tables sharded by a key of their own (not colocated with workflows): a queue's dedup
# keys, by queue. An enqueue with a key writes this shard and the new workflow's shard in
# one (two-phase) transaction. The audit log, by workflow id but in a group of its own:
# no workflow's data (not exported, not pruned), written by rare operator actions. A
# callback URL's token, by its hash: the POST that presents it names no workflow, so a
# table keyed by workflow would be searched on every shard; by hash, the lookup is routed
# to one. Minting one writes this shard and the run's journal in two statements, and the
# POST spends it and delivers to the workflow's shard in one (two-phase) transaction. Not
# a reference table: every mint and every POST would write to every node. The triggers'
# trigger_outbox, by topic: a consumer takes, deletes and retries the messages of one topic, so
# each of its statements is routed to one shard.
BY_OWN_KEY: dict[str, str] = {
    "queue_dedup": "queue_name",
    "audit_log": "workflow_id",
    "callbacks": "token_hash",
    "trigger_outbox": "topic",
    # A queue's lock (one row per queue), taken by its dequeues from any node.
    "queue_locks": "queue_name",
}

# Small tables every worker reads: one copy on every node.
REFERENCE: tuple[str, ...] = ("executors", "schedules")

# Kept on the coordinator only: read when connecting, written by migrations.
LOCAL: tuple[str, ...] = ("schema_migrations",)

ANCHOR = "workflows"  # the table the others are colocated with

# durable's functions, called inside statements that run on the shards: created on every
# node (create_distributed_function), as functions made before the extension are not.
FUNCTIONS: dict[str, str] = {
    "current_time": "",
    "fence_lost": "text, bigint",
    "plus_seconds": "timestamp with time zone, double precision",
}


# durable's functions that read one shard of `workflows` on the node that holds it (claims
# without reading every shard: migration 0040, _io/shards.py): distributed by their first
# argument, a workflow id of that shard, and colocated with `workflows`, so that a call is
# sent whole to that node. Distributed after the tables.
DELEGATED: dict[str, str] = {
    "runnable_on_shard": "text, timestamp with time zone, text[], text[], integer, text[], integer",
    "enqueued_on_shard": (
        "text, timestamp with time zone, text, text[], text[], integer, boolean, integer"
    ),
}


def plan(schema: str = "durable") -> list[tuple[str | None, str]]:
    """(table it distributes or None, statement), in the order they must run: functions,
    reference tables (a distributed table may refer to them), then the anchor, then the tables
    colocated with it, then the functions colocated with them."""

    def table(name: str) -> str:
        return sql.Identifier(schema, name).as_string(None)

    def literal(text: str) -> str:
        return sql.Literal(text).as_string(None)

    out: list[tuple[str | None, str]] = [(None, "CREATE EXTENSION IF NOT EXISTS citus")]
    for name, args in FUNCTIONS.items():
        signature = f"{sql.Identifier(schema, name).as_string(None)}({args})"
        out.append((None, f"SELECT create_distributed_function({literal(signature)})"))
    for name in REFERENCE:
        out.append((table(name), f"SELECT create_reference_table({literal(table(name))})"))
    anchor = table(ANCHOR)
    out.append(
        (
            anchor,
            f"SELECT create_distributed_table({literal(anchor)}, {literal(BY_WORKFLOW[ANCHOR])})",
        )
    )
    for name, column in BY_WORKFLOW.items():
        if name == ANCHOR:
            continue
        out.append(
            (
                table(name),
                f"SELECT create_distributed_table({literal(table(name))}, {literal(column)}, "
                f"colocate_with => {literal(anchor)})",
            )
        )
    for name, column in BY_OWN_KEY.items():
        out.append(
            (
                table(name),
                f"SELECT create_distributed_table({literal(table(name))}, {literal(column)}, "
                "colocate_with => 'none')",
            )
        )
    for name, args in DELEGATED.items():
        signature = f"{sql.Identifier(schema, name).as_string(None)}({args})"
        out.append(
            (
                None,
                f"SELECT create_distributed_function({literal(signature)}, 'shard_key', "
                f"colocate_with => {literal(anchor)})",
            )
        )
    return out


def statements(schema: str = "durable") -> list[str]:
    """The statements that distribute a migrated schema (what `--dry-run` prints)."""
    return [statement for _, statement in plan(schema)]
