from __future__ import annotations

import subprocess
import sys
import threading

import psycopg
import pytest

from durable._io import migrate as _migrate


def schema_shape(url: str) -> list[tuple[str, ...]]:
    with psycopg.connect(url) as conn:
        cols = conn.execute(
            "SELECT table_name, column_name, data_type, coalesce(column_default, ''),"
            " is_nullable FROM information_schema.columns WHERE table_schema = 'durable'"
            " ORDER BY table_name, column_name"
        ).fetchall()
        cons = conn.execute(
            "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE connamespace = 'durable'::regnamespace ORDER BY 1, 2"
        ).fetchall()
        idx = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'durable' ORDER BY 1"
        ).fetchall()
    return [tuple(map(str, r)) for r in [*cols, *cons, *idx]]


def test_concurrent_migrators_are_safe(bare_database_url: str) -> None:
    errors: list[BaseException] = []
    applied: list[list[int]] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        try:
            with psycopg.connect(bare_database_url, autocommit=True) as conn:
                barrier.wait()
                applied.append(_migrate.migrate(conn, "durable"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Exactly one migrator applied each version; the others found nothing to do.
    assert sorted(applied, key=len) == [[], [], [], [v for v, _, _ in _migrate.available()]]


def test_fresh_equals_template_and_rerun_is_noop(bare_database_url: str, database_url: str) -> None:
    with psycopg.connect(bare_database_url, autocommit=True) as conn:
        assert _migrate.migrate(conn, "durable")
        assert _migrate.migrate(conn, "durable") == []
        _migrate.check(conn, "durable")
    assert schema_shape(bare_database_url) == schema_shape(database_url)


def test_cli_migrate(bare_database_url: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "durable.cli", "migrate", "--database-url", bare_database_url],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "applied migrations" in out.stdout
    with psycopg.connect(bare_database_url, autocommit=True) as conn:
        _migrate.check(conn, "durable")


def test_check_rejects_newer_schema(database_url: str) -> None:
    from durable.errors import MigrationError

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO durable.schema_migrations (version, name) VALUES (9999, 'x')")
        with pytest.raises(MigrationError, match="upgrade durable-pg"):
            _migrate.check(conn, "durable")


def test_migrations_apply_on_a_sql_ascii_database(bare_database_url: str) -> None:
    # initdb without a UTF-8 locale (pg_autoctl's default, for one) makes SQL_ASCII
    # databases, whose client encoding is ASCII: migration text must be plain ASCII.
    ascii_url = psycopg.conninfo.make_conninfo(bare_database_url, dbname="durable_ascii_db")
    admin = bare_database_url
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS durable_ascii_db")
        conn.execute("CREATE DATABASE durable_ascii_db ENCODING 'SQL_ASCII' TEMPLATE template0")
    try:
        with psycopg.connect(ascii_url, autocommit=True) as conn:
            assert _migrate.migrate(conn, "durable")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("DROP DATABASE durable_ascii_db WITH (FORCE)")


def test_a_journal_of_the_previous_release_upgrades_to_checkless_steps(
    bare_database_url: str, database_url: str
) -> None:
    """0041 drops the CHECKs of steps (each cost every record statement): a schema of the
    release before, with a journal row of every kind, upgrades with its rows unchanged to
    the schema a fresh database gets."""
    from durable._base.models import StepKind

    before = [m for m in _migrate.available() if m[0] < 41]
    with psycopg.connect(bare_database_url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("CREATE SCHEMA durable")
            conn.execute(
                "CREATE TABLE durable.schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )
            for version, name, text in before:
                conn.execute(_migrate.render(text, "durable"))
                conn.execute(
                    "INSERT INTO durable.schema_migrations (version, name) VALUES (%s, %s)",
                    [version, name],
                )
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, inputs, status, owner, epoch)"
            " VALUES ('old', 'wf', '[]', 'RUNNING', 'me', 1)"
        )
        for seq, kind in enumerate(StepKind):
            conn.execute(
                "INSERT INTO durable.steps (workflow_id, step_seq, step_name, kind, output,"
                " error, attempts) VALUES ('old', %s, %s, %s, %s, %s, %s)",
                [
                    seq,
                    f"s{seq}",
                    kind.value,
                    None if seq % 2 else "1",
                    "e" if seq % 2 else None,
                    1 + seq % 3,
                ],
            )
        journal = "SELECT * FROM durable.steps ORDER BY step_seq"
        rows = conn.execute(journal).fetchall()
        assert conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE conrelid = 'durable.steps'::regclass"
            " AND contype = 'c'"
        ).fetchone() == (4,)
        assert [v for v, _, _ in _migrate.available() if v >= 41] == _migrate.migrate(
            conn, "durable"
        )
        _migrate.check(conn, "durable")
        assert conn.execute(journal).fetchall() == rows
    assert schema_shape(bare_database_url) == schema_shape(database_url)
    assert not [
        c for c in schema_shape(database_url) if c[0] == "durable.steps" and "CHECK" in c[1]
    ]
