"""Every command says which database it uses (on stderr, so --json stays clean on stdout),
and a read of a database without durable's schema names that database."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pytest

from durable import errors
from durable._base.urls import redact


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_read_of_an_empty_database_names_it(bare_database_url: str) -> None:
    # A password the server ignores (trust auth), which must never be printed.
    url = psycopg.conninfo.make_conninfo(bare_database_url, password="s3cret-pw")
    assert "s3cret-pw" in url
    listed = cli("workflows", "list", "--json", "--database-url", url)
    assert listed.returncode == 1, listed.stderr
    assert listed.stdout == ""  # nothing half-printed where a script reads JSON
    lines = listed.stderr.splitlines()
    assert lines[0] == f"using the database at {redact(url)}"
    assert "Traceback" not in listed.stderr
    assert f"has no durable tables in the database at {redact(url)}" in listed.stderr
    assert "durable migrate" in listed.stderr
    assert "s3cret-pw" not in listed.stderr
    with psycopg.connect(bare_database_url) as conn:  # a read made nothing
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'durable'").fetchone()
    assert found is None


def test_json_output_stays_clean_and_the_database_is_named(database_url: str) -> None:
    listed = cli("workflows", "list", "--json", "--database-url", database_url)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    assert listed.stderr.splitlines() == [f"using the database at {redact(database_url)}"]
    from_env = cli(
        "workflows",
        "list",
        "--json",
        env={**os.environ, "DURABLE_DATABASE_URL": database_url},
    )
    assert from_env.returncode == 0, from_env.stderr
    assert f"using the database at {redact(database_url)}" in from_env.stderr


def test_a_migration_error_names_the_database(bare_database_url: str) -> None:
    import durable

    engine = durable.Engine(bare_database_url, registry=durable.Registry(), migrate=False)
    with pytest.raises(errors.MigrationError) as raised, engine:
        pass  # pragma: no cover
    assert redact(bare_database_url) in str(raised.value)
