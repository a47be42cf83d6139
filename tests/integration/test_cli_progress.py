"""Long CLI operations say how far they are: `durable prune` per batch, `durable migrate`
per migration (on stderr, so stdout stays the command's result for scripts)."""

from __future__ import annotations

import subprocess
import sys

import psycopg

from durable._base.urls import redact
from durable._io import migrate as _migrate


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args], capture_output=True, text=True, timeout=120
    )


def _using(url: str) -> str:
    return f"using the database at {redact(url)}"


def test_prune_reports_each_batch(database_url: str) -> None:
    assert cli("migrate", "--database-url", database_url).returncode == 0
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs, finished_at)"
            " SELECT 'old-' || i, 'old', 'SUCCESS', '[]', now() - interval '30 days'"
            " FROM generate_series(1, 1200) AS i"
        )
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs, finished_at)"
            " VALUES ('recent', 'new', 'SUCCESS', '[]', now())"
        )
        # Two journal rows each: prune deletes them with their workflows (a journal row is
        # fenced by its workflow's row, not tied to it by a foreign key that would cascade).
        conn.execute(
            "INSERT INTO durable.steps (workflow_id, step_seq, step_name, kind, output)"
            " SELECT w.workflow_id, s, 'a', 'step', '1' FROM durable.workflows AS w,"
            " generate_series(0, 1) AS s"
        )
    pruned = cli(
        "prune",
        "--finished-after",
        "7d",
        "--batch-size",
        "500",
        "--progress",
        "--database-url",
        database_url,
    )
    assert pruned.returncode == 0, pruned.stderr
    lines = [line for line in pruned.stderr.splitlines() if line.startswith("workflows:")]
    assert lines == ["workflows: 500/1200", "workflows: 1000/1200", "workflows: 1200/1200"]
    assert "deleted 1200 finished workflows (2400 journal rows)" in pruned.stdout
    with psycopg.connect(database_url) as conn:
        left = conn.execute("SELECT workflow_id, count(*) FROM durable.steps GROUP BY 1").fetchall()
    assert left == [("recent", 2)]
    quiet = cli("prune", "--finished-after", "7d", "--database-url", database_url)
    # Not a terminal, not asked: no progress, only which database it used.
    assert quiet.returncode == 0 and quiet.stderr.splitlines() == [_using(database_url)]


def test_migrate_reports_each_migration(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS durable CASCADE")
    migrated = cli("migrate", "--progress", "--database-url", database_url)
    assert migrated.returncode == 0, migrated.stderr
    using, *lines = migrated.stderr.splitlines()
    assert using == _using(database_url)
    version, name, _ = _migrate.available()[-1]
    n = len(_migrate.available())
    assert lines[0] == f"migrations: 0/{n} (applying migration 0001_initial)"
    assert lines[1].startswith(f"migrations: 1/{n} (migration 0001_initial took ")
    assert lines[-1].startswith(f"migrations: {n}/{n} (migration {version:04d}_{name} took ")
    assert len(lines) == 2 * n
    again = cli("migrate", "--progress", "--database-url", database_url)
    assert again.returncode == 0 and again.stderr.splitlines() == [_using(database_url)]
    assert again.stdout.strip() == "schema is up to date"
