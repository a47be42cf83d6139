from __future__ import annotations

import json
import subprocess
import sys

import durable


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_workflows_list_and_show(database_url: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg, name="double")
    def double(x: int) -> int:
        return 2 * x

    @durable.workflow(registry=reg, name="doubler")
    def doubler(x: int) -> int:
        return double(double(x))

    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(doubler, 3, workflow_id="d-1").result(timeout=10)

    listed = cli("workflows", "list", "--database-url", database_url, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["workflow_id"], r["status"]) for r in rows] == [("d-1", "SUCCESS")]

    shown = cli("workflows", "show", "d-1", "--database-url", database_url, "--json")
    data = json.loads(shown.stdout)
    assert [s["output"] for s in data["steps"]] == [6, 12]  # JSON values, not their text
    assert data["output"] == 12 and data["inputs"] == {"args": [3], "kwargs": {}}

    table = cli("workflows", "show", "d-1", "--database-url", database_url)
    assert "double" in table.stdout and "SUCCESS" in table.stdout

    missing = cli("workflows", "show", "nope", "--database-url", database_url)
    assert missing.returncode == 1
    assert "workflows list" in missing.stderr


def test_migrate_citus_dry_run_prints_the_distribution_and_connects_to_nothing() -> None:
    from durable._io import citus as _citus

    shown = cli("migrate", "--citus", "--dry-run", "--schema", "jobs")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [f"{s};" for s in _citus.statements("jobs")]
    assert "create_distributed_table('\"jobs\".\"steps\"', 'workflow_id'" in shown.stdout
    assert cli("migrate", "--dry-run").returncode != 0  # --dry-run goes with --citus
    # A quote is quoted; a name the real run refuses is refused by the dry run too.
    quoted = cli("migrate", "--citus", "--dry-run", "--schema", 'a"b')
    assert 'create_distributed_table(\'"a""b"."steps"\'' in quoted.stdout
    for bad in ("", "x" * 59):
        refused = cli("migrate", "--citus", "--dry-run", "--schema", bad)
        assert refused.returncode != 0 and "schema=" in refused.stderr, (bad, refused)
        assert "CREATE" not in refused.stdout


def test_migrate_citus_without_citus_says_so_and_leaves_the_schema_usable(
    bare_database_url: str,
) -> None:
    done = cli("migrate", "--citus", "--database-url", bare_database_url)
    assert done.returncode != 0
    assert "no citus extension" in done.stderr and "--dry-run" in done.stderr
    # The migrations ran first; nothing was half-distributed.
    again = cli("migrate", "--database-url", bare_database_url)
    assert again.returncode == 0 and "up to date" in again.stdout
