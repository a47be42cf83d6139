"""`durable init`: write a starter project (a workflow with a step, an effect and an
approval, its tests on the test kit, docker-compose, a systemd unit and a Kubernetes
Deployment), optionally with a pydantic-ai or OpenAI Agents agent.

The files are templates kept as package data (templates/init/); `{{placeholders}}` in them
are filled here. Nothing that exists is overwritten unless --force says so.
"""

from __future__ import annotations

import keyword
import re
from importlib import resources
from pathlib import Path

import click

from durable.cli._common import _handle_errors
from durable.errors import ConfigurationError

AGENTS = ("pydantic-ai", "openai-agents")

# Template (under templates/init/) -> the file written, `{package}` filled in.
_FILES = [
    ("pyproject.toml.tmpl", "pyproject.toml"),
    ("README.md.tmpl", "README.md"),
    ("gitignore.tmpl", ".gitignore"),
    ("app/__init__.py.tmpl", "{package}/__init__.py"),
    ("app/workflows.py.tmpl", "{package}/workflows.py"),
    ("app/__main__.py.tmpl", "{package}/__main__.py"),
    ("tests/conftest.py.tmpl", "tests/conftest.py"),
    ("tests/test_workflows.py.tmpl", "tests/test_workflows.py"),
    ("docker-compose.yml.tmpl", "docker-compose.yml"),
    ("deploy/durable-worker@.service.tmpl", "deploy/systemd/durable-worker@.service"),
    ("deploy/worker.yaml.tmpl", "deploy/kubernetes/worker.yaml"),
]
_AGENT_FILES = {
    agent: [
        (f"app/agent_{agent.replace('-', '_')}.py.tmpl", "{package}/agent.py"),
        (f"tests/test_agent_{agent.replace('-', '_')}.py.tmpl", "tests/test_agent.py"),
    ]
    for agent in AGENTS
}
_AGENT_IMPORT = (
    "\n\n\n# The agent's workflow, so that `durable worker --app {{package}}.workflows` runs it.\n"
    "from {{package}} import agent  # noqa: E402, F401"
)
_AGENT_README = {
    "pydantic-ai": "- `{{package}}/agent.py`: a pydantic-ai agent (TestModel, offline) run as "
    "a workflow:\n  each model request and tool call is a journaled step.\n",
    "openai-agents": "- `{{package}}/agent.py`: an OpenAI Agents SDK agent run as a "
    "workflow: each model\n  response and tool call is a journaled step.\n",
}
# PEP 508's project names.
_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
_TAKEN = {"durable", "tests", "test", "deploy", "agents", "pydantic_ai"}


def project_names(directory: Path, name: str | None) -> tuple[str, str]:
    """The project's name (pyproject.toml's) and its package's (the import name)."""
    name = name if name is not None else directory.resolve().name
    package = re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower()
    if not _NAME.match(name) or not package.isidentifier() or keyword.iskeyword(package):
        raise ConfigurationError(
            f"{name!r} cannot name a Python project: give --name with letters, digits, '-' "
            "or '_', starting with a letter (e.g. --name shop)"
        )
    if package in _TAKEN:
        raise ConfigurationError(
            f"a package named {package!r} would hide another module of that name: give "
            "--name another name (e.g. --name shop)"
        )
    return name, package


def durable_requirement(spec: str | None, agent: str | None) -> str:
    """The requirement on durable for pyproject.toml: `durable-pg` (with the agent's
    extra), from where `spec` says (a path to a clone or a wheel, or a URL) if given."""
    wanted = f"durable-pg[{agent}]" if agent else "durable-pg"
    if spec is None:
        return wanted
    if re.match(r"^durable-pg\b", spec):
        return spec
    if "://" in spec:
        return f"{wanted} @ {spec}"
    path = Path(spec).expanduser()
    if not path.exists():
        raise ConfigurationError(
            f"--durable-spec {spec}: no such file or directory; give a path to a durable "
            "clone or wheel, a URL (git+https://...), or a requirement (durable-pg==0.1.0)"
        )
    return f"{wanted} @ {path.resolve().as_uri()}"


def _template(relative: str) -> str:
    return (resources.files("durable.cli") / "templates" / "init" / relative).read_text("utf-8")


def render(name: str, package: str, requirement: str, agent: str | None) -> dict[str, str]:
    """The project's files: relative path -> text."""
    if agent is not None and agent not in AGENTS:
        raise ConfigurationError(f"--agent {agent}: choose one of {', '.join(AGENTS)}")
    values = {
        "agent_import": _AGENT_IMPORT if agent else "",
        "agent_readme": _AGENT_README[agent] if agent else "",
        "durable_requirement": requirement,
        "name": name,
        "package": package,
    }
    files: dict[str, str] = {}
    for template, target in _FILES + (_AGENT_FILES[agent] if agent else []):
        text = _template(template)
        # Twice: the agent's lines hold placeholders of their own.
        for _ in range(2):
            for key, value in values.items():
                text = text.replace("{{" + key + "}}", value)
        files[target.format(package=package)] = text
    return files


def write(directory: Path, files: dict[str, str], *, force: bool = False) -> list[Path]:
    """Write the files under `directory`; without `force`, refuse (and write nothing) when
    any of them exists."""
    paths = [directory / relative for relative in files]
    existing = [p for p in paths if p.exists()]
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise ConfigurationError(
            f"{existing[0]} exists{more}: durable init writes only new files; give --force "
            "to overwrite them, or another directory"
        )
    for path, text in zip(paths, files.values(), strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")
    return paths


@click.command("init")
@click.argument(
    "directory", default=".", type=click.Path(file_okay=False, path_type=Path), required=False
)
@click.option("--name", default=None, help="The project's name (default: the directory's).")
@click.option(
    "--agent", type=click.Choice(AGENTS), default=None, help="Add an agent run as a workflow."
)
@click.option(
    "--durable-spec",
    default=None,
    metavar="PATH_OR_URL",
    help="Where pip gets durable-pg: a clone or wheel path, a URL, or a requirement.",
)
@click.option("--force", is_flag=True, help="Overwrite files that exist.")
@_handle_errors
def init(
    directory: Path, name: str | None, agent: str | None, durable_spec: str | None, force: bool
) -> None:
    """Write a starter project in DIRECTORY (default: here): a workflow with a step, an
    effect and an approval, its tests, docker-compose.yml, and systemd and Kubernetes files
    for workers."""
    name, package = project_names(directory, name)
    files = render(name, package, durable_requirement(durable_spec, agent), agent)
    for path in write(directory, files, force=force):
        click.echo(f"wrote {path}")
    steps = [] if directory == Path(".") else [f"cd {directory}"]
    steps += [
        "python -m pytest  # the tests, each on a fresh database",
        f"python -m {package}  # one checkout, end to end",
        f"durable worker --app {package}.workflows  # runs and resumes workflows",
    ]
    click.echo("\nnext:\n" + "\n".join(f"  {step}" for step in steps))
