"""The schema stays ready for distributed PostgreSQL (Citus, and the sharded engines that
key rows by one column): checked against durable._io.citus's map of tables on a migrated
database. Each rule below names what would break when the tables are sharded."""

from __future__ import annotations

import psycopg

from durable._io import citus as _citus

SHARDED = {**_citus.BY_WORKFLOW, **_citus.BY_OWN_KEY}


def rows(url: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(query).fetchall()]


def test_every_table_is_placed(database_url: str) -> None:
    tables = {
        str(r[0])
        for r in rows(
            database_url,
            "SELECT relname FROM pg_class WHERE relnamespace = 'durable'::regnamespace"
            " AND relkind IN ('r', 'p')",
        )
    }
    placed = set(SHARDED) | set(_citus.REFERENCE) | set(_citus.LOCAL)
    # A new table must say how it is distributed (durable/_io/citus.py).
    assert tables == placed


def test_keys_of_sharded_tables_lead_with_the_distribution_column(database_url: str) -> None:
    # A unique index is enforced per shard: unique across shards only if it holds the
    # distribution column (we require it first, so lookups by key stay on one shard).
    unique = rows(
        database_url,
        "SELECT c.relname, i.indexrelid::regclass::text, a.attname"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]"
        " WHERE c.relnamespace = 'durable'::regnamespace AND i.indisunique",
    )
    bad = [(t, idx, col) for t, idx, col in unique if t in SHARDED and col != SHARDED[str(t)]]
    assert bad == []
    # and every sharded table has one (its primary key)
    assert {str(t) for t, _, _ in unique} >= set(SHARDED)


def test_no_key_points_from_one_workflow_to_another(database_url: str) -> None:
    # A foreign key between rows of different workflows crosses shards.
    fks = rows(
        database_url,
        "SELECT conrelid::regclass::text, confrelid::regclass::text,"
        " (SELECT attname FROM pg_attribute WHERE attrelid = conrelid AND attnum = conkey[1]),"
        " (SELECT attname FROM pg_attribute WHERE attrelid = confrelid AND attnum = confkey[1])"
        " FROM pg_constraint WHERE contype = 'f' AND connamespace = 'durable'::regnamespace",
    )
    bad = []
    for table, target, column, target_column in fks:
        t, r = str(table).split(".")[-1], str(target).split(".")[-1]
        same_workflow = (
            t in _citus.BY_WORKFLOW
            and r in _citus.BY_WORKFLOW
            and column == _citus.BY_WORKFLOW[t]
            and target_column == _citus.BY_WORKFLOW[r]
        )
        if not same_workflow:
            bad.append((table, column, target, target_column))
    assert bad == []


def test_no_sequences_and_no_triggers(database_url: str) -> None:
    # Sequences are per node (ids would collide or need a round trip to the coordinator);
    # triggers do not run on shards the way they run on one server.
    sequences = rows(
        database_url,
        "SELECT relname FROM pg_class WHERE relnamespace = 'durable'::regnamespace"
        " AND relkind = 'S'",
    )
    identity = rows(
        database_url,
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = 'durable' AND (is_identity = 'YES'"
        " OR column_default LIKE 'nextval(%')",
    )
    triggers = rows(
        database_url,
        "SELECT tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
        " WHERE c.relnamespace = 'durable'::regnamespace AND NOT t.tgisinternal",
    )
    assert (sequences, identity, triggers) == ([], [], [])


def test_citus_statements_distribute_every_sharded_table_colocated() -> None:
    stmts = _citus.statements("durable")
    assert stmts[0] == "CREATE EXTENSION IF NOT EXISTS citus"
    assert "SELECT create_distributed_table('\"durable\".\"workflows\"', 'workflow_id')" in stmts
    for name, column in _citus.BY_WORKFLOW.items():
        if name != "workflows":
            assert (
                f"SELECT create_distributed_table('\"durable\".\"{name}\"', '{column}', "
                'colocate_with => \'"durable"."workflows"\')'
            ) in stmts
    for name in _citus.REFERENCE:
        assert f'SELECT create_reference_table(\'"durable"."{name}"\')' in stmts
    assert 'SELECT create_distributed_function(\'"durable"."fence_lost"(text, bigint)\')' in stmts
    # Functions, then reference tables (a distributed table may point at them), the anchor
    # before the tables colocated with it; last, the functions colocated with `workflows`.
    delegated = len(_citus.DELEGATED)
    assert all("'shard_key', colocate_with" in s for s in stmts[-delegated:])
    order = ["SELECT create_distributed_function", "SELECT create_reference_table"]
    kinds = [s.split("(")[0] for s in stmts[1:-delegated]]
    assert kinds == sorted(kinds, key=lambda k: order.index(k) if k in order else len(order))


def test_every_function_of_the_schema_is_created_on_every_node(database_url: str) -> None:
    """A function a statement calls on a shard must exist on the worker holding it."""
    found = {
        (r[0], r[1])
        for r in rows(
            database_url,
            "SELECT proname, oidvectortypes(proargtypes) FROM pg_proc"
            " WHERE pronamespace = 'durable'::regnamespace",
        )
    }
    assert found == set(_citus.FUNCTIONS.items()) | set(_citus.DELEGATED.items())
