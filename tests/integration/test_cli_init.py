"""`durable init`: the project it writes, that it overwrites nothing unasked, and that the
project's own tests and example pass as written, in fresh processes with this environment
(no install: the project finds durable on PYTHONPATH, its tests a server through
DURABLE_TEST_DATABASE_URL)."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
import tomllib
from contextlib import chdir
from pathlib import Path

import psycopg
import pytest
import yaml
from click.testing import CliRunner, Result

import durable
from durable.cli import main
from durable.cli._init import durable_requirement, project_names, render, write
from durable.testing import TemplateDatabases
from tests.conftest import ROOT

BASE_FILES = {
    "pyproject.toml",
    "README.md",
    ".gitignore",
    "shop/__init__.py",
    "shop/workflows.py",
    "shop/__main__.py",
    "tests/conftest.py",
    "tests/test_workflows.py",
    "docker-compose.yml",
    "deploy/systemd/durable-worker@.service",
    "deploy/kubernetes/worker.yaml",
}


def durable_cli(*args: str, cwd: Path) -> Result:
    """`durable ARGS` in this process (the slow tests below run the real command), from
    `cwd`."""
    with chdir(cwd):
        return CliRunner().invoke(main, list(args))


def written(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_init_writes_the_project_and_refuses_to_overwrite_a_file(tmp_path: Path) -> None:
    done = durable_cli("init", "shop", cwd=tmp_path)
    assert done.exit_code == 0, done.output
    project = tmp_path / "shop"
    assert written(project) == BASE_FILES
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "shop"
    assert pyproject["project"]["dependencies"] == ["durable-pg"]

    (project / "shop" / "workflows.py").write_text("# mine\n")
    refused = durable_cli("init", "shop", cwd=tmp_path)
    assert refused.exit_code == 1
    assert "pyproject.toml exists" in refused.output and "--force" in refused.output
    assert (project / "shop" / "workflows.py").read_text() == "# mine\n"  # nothing written

    # A file of the project in a directory of other files: only that one is in the way.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("kept")
    (other / "docker-compose.yml").write_text("mine")
    refused = durable_cli("init", "--name", "store", cwd=other)
    assert refused.exit_code == 1
    assert "docker-compose.yml exists" in refused.output
    assert written(other) == {"notes.txt", "docker-compose.yml"}

    forced = durable_cli("init", "shop", "--force", cwd=tmp_path)
    assert forced.exit_code == 0, forced.output
    assert "def checkout(" in (project / "shop" / "workflows.py").read_text()


def test_init_adds_an_agent_and_refuses_a_bad_name(tmp_path: Path) -> None:
    done = durable_cli("init", "shop", "--agent", "openai-agents", cwd=tmp_path)
    assert done.exit_code == 0, done.output
    project = tmp_path / "shop"
    assert written(project) == BASE_FILES | {"shop/agent.py", "tests/test_agent.py"}
    assert "from shop import agent" in (project / "shop" / "workflows.py").read_text()
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["dependencies"] == ["durable-pg[openai-agents]"]

    bad = durable_cli("init", "x", "--name", "9 lives", cwd=tmp_path)
    assert bad.exit_code == 1 and "--name" in bad.output
    assert not (tmp_path / "x").exists()
    shadow = durable_cli("init", "durable", cwd=tmp_path)
    assert shadow.exit_code == 1 and "would hide" in shadow.output
    unknown = durable_cli("init", "y", "--agent", "langchain", cwd=tmp_path)
    assert unknown.exit_code == 2  # a usage error, named by click


def test_names_and_the_durable_requirement(tmp_path: Path) -> None:
    assert project_names(tmp_path / "my-shop", None) == ("my-shop", "my_shop")
    assert project_names(tmp_path, "Order.Desk") == ("Order.Desk", "order_desk")
    assert durable_requirement(None, "pydantic-ai") == "durable-pg[pydantic-ai]"
    wheel = tmp_path / "durable_pg-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert durable_requirement(str(wheel), None) == f"durable-pg @ {wheel.as_uri()}"
    url = "git+https://example.org/durable.git"
    assert durable_requirement(url, "openai-agents") == f"durable-pg[openai-agents] @ {url}"
    assert durable_requirement("durable-pg==0.1.0", None) == "durable-pg==0.1.0"
    with pytest.raises(Exception, match="no such file"):
        durable_requirement(str(tmp_path / "missing"), None)


@pytest.mark.parametrize("agent", [None, "pydantic-ai", "openai-agents"])
def test_every_file_parses_and_the_code_is_lint_clean(agent: str | None, tmp_path: Path) -> None:
    files = render("shop", "shop", "durable-pg", agent)
    for path, text in files.items():
        assert "{{" not in text, path
        if path.endswith(".py"):
            ast.parse(text, path)
        elif path.endswith((".yml", ".yaml")):
            assert yaml.safe_load(text)
        elif path.endswith(".toml"):
            tomllib.loads(text)
    write(tmp_path, files)
    rules = "--select=E,F,W,I,UP,B,RUF"
    for check in (["check", "--no-cache", rules, "."], ["format", "--no-cache", "--check", "."]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *check], cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr


def _docs_block(kind: str) -> str:
    docs = (ROOT / "docs" / "operations.md").read_text("utf-8")
    section = docs.split("## Deploying a worker", 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"```{kind}\n(.*?)```", section, flags=re.S)
    assert match is not None
    return match.group(1)


def test_the_deploy_files_are_those_of_docs_operations() -> None:
    files = render("myapp", "myapp", "durable-pg", None)
    for path, kind in [
        ("deploy/systemd/durable-worker@.service", "ini"),
        ("deploy/kubernetes/worker.yaml", "yaml"),
    ]:
        lines = files[path].splitlines(keepends=True)
        while lines[0].startswith("#"):  # the file's own header: how to install it
            lines.pop(0)
        assert "".join(lines) == _docs_block(kind), path


def _readme_commands() -> list[str]:
    """The commands of the README's `durable init` block, one per `&&` or line."""
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split("## A project of your own", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert match is not None
    commands = []
    for line in match.group(1).splitlines():
        line = line.split("#", 1)[0]
        commands.extend(c.strip() for c in line.split("&&") if c.strip())
    return commands


def _run_as_the_readme_says(
    commands: list[str], cwd: Path, env: dict[str, str]
) -> list[subprocess.CompletedProcess[str]]:
    """Each command in a fresh process of this environment (`durable` and `python` are this
    interpreter), in the directory the `cd`s before it left."""
    runs = []
    for command in commands:
        argv = shlex.split(command)
        if argv[0] == "cd":
            cwd = cwd / argv[1]
            continue
        argv = {"durable": [sys.executable, "-m", "durable.cli"], "python": [sys.executable]}[
            argv[0]
        ] + argv[1:]
        if argv[-2:] == ["-m", "pytest"]:
            argv += ["-q", "-p", "no:cacheprovider"]
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        runs.append(done)
    return runs


def test_the_readme_commands_run_and_the_project_tests_pass(
    tmp_path: Path,
    subprocess_env: dict[str, str],
    pg_databases: TemplateDatabases,
    database_url: str,
) -> None:
    commands = _readme_commands()
    assert commands == ["durable init shop", "cd shop", "python -m pytest", "python -m shop"]
    env = {
        **subprocess_env,
        "DURABLE_TEST_DATABASE_URL": pg_databases.admin_url,  # where the tests make databases
        "DURABLE_DATABASE_URL": database_url,  # the example's
    }
    _, tests, example = _run_as_the_readme_says(commands, tmp_path, env)
    assert re.search(r"\b3 passed\b", tests.stdout), tests.stdout
    assert "'status': 'charged'" in example.stdout, example.stdout
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT w.status, count(s.*) FROM durable.workflows w"
            " JOIN durable.steps s USING (workflow_id) WHERE w.name = 'shop.checkout'"
            " GROUP BY w.status"
        ).fetchall()
    assert rows == [("SUCCESS", 3)]  # priced, approved, charged: one run


@pytest.mark.parametrize("agent", ["pydantic-ai", "openai-agents"])
def test_an_agent_projects_tests_pass(
    agent: str, tmp_path: Path, subprocess_env: dict[str, str], pg_databases: TemplateDatabases
) -> None:
    env = {**subprocess_env, "DURABLE_TEST_DATABASE_URL": pg_databases.admin_url}
    commands = [f"durable init shop --agent {agent}", "cd shop", "python -m pytest"]
    _, tests = _run_as_the_readme_says(commands, tmp_path, env)
    assert re.search(r"\b4 passed\b", tests.stdout), tests.stdout


def test_the_worker_command_of_the_project_runs_its_workflows(
    tmp_path: Path, subprocess_env: dict[str, str], database_url: str
) -> None:
    """`durable worker --app shop.workflows`, as docker-compose, the systemd unit and the
    Deployment run it, runs the checkout and the agent's workflow (which the app module
    registers by importing the agent)."""
    assert durable_cli("init", "shop", "--agent", "pydantic-ai", cwd=tmp_path).exit_code == 0
    project = tmp_path / "shop"
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url}
    submit = (
        "import durable\n"
        "from shop import agent, workflows\n"
        "with durable.Client(migrate=True) as client:\n"
        "    client.submit(workflows.checkout, 'o-1', ['book'], workflow_id='o-1')\n"
        "    client.submit(agent.ask, 'where is o-1?', workflow_id='ask-1')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", submit], cwd=project, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    worker = subprocess.Popen(
        [sys.executable, "-m", "durable.cli", "worker", "--app", "shop.workflows",
         "--poll-interval", "0.1"],
        cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with durable.Client(database_url) as client:
            for workflow_id in ("o-1", "ask-1"):
                client.retrieve(workflow_id).result(timeout=60)
            assert client.retrieve("o-1").result()["status"] == "charged"
    finally:
        worker.terminate()
        worker.wait(timeout=60)
