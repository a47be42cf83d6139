"""The settings are resolved in one place (durable/_io/config.py): arguments, then the
environment, then defaults, with a bad value refused by name before anything connects."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import durable
from durable._base.clock import FakeClock, SystemClock
from durable._io.config import Config, crash_points
from durable.errors import ConfigurationError

ROOT = Path(durable.__file__).parent


def test_arguments_win_over_the_environment_which_wins_over_defaults(tmp_path: Path) -> None:
    env = {
        "DURABLE_DATABASE_URL": "postgresql://env/db",
        "DURABLE_LISTEN": "0",
        "DURABLE_CLAIMS": "cas",
        "DURABLE_FAKE_CLOCK": str(tmp_path / "clock"),
        "DURABLE_CRASH_POINTS": "after_step:2, before_finish",
    }
    config = Config.resolve(environ=env)
    assert config.database_url == "postgresql://env/db"
    assert config.listen is False and config.claims == "cas"
    assert isinstance(config.clock, FakeClock)
    assert config.crash_points == {"after_step": 2, "before_finish": 1}
    given = Config.resolve(environ=env, database_url="postgresql://arg/db", listen=True)
    assert given.database_url == "postgresql://arg/db" and given.listen is True
    bare = Config.resolve(environ={})
    assert bare.database_url is None and bare.listen is True and bare.claims == "auto"
    assert isinstance(bare.clock, SystemClock) and bare.crash_points == {}
    assert not bare.explicit_id and bare.executor_id
    assert Config.resolve(environ={}, executor_id="w1").explicit_id


def test_the_config_is_frozen() -> None:
    config = Config.resolve(environ={})
    with pytest.raises(AttributeError):
        config.lease_seconds = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("arguments", "environ", "named"),
    [
        ({"lease_seconds": 0}, {}, "lease_seconds"),
        ({"max_workers": 0}, {}, "max_workers"),
        ({"max_async": 0}, {}, "max_async"),
        ({"max_payload_bytes": 0}, {}, "max_payload_bytes"),
        ({"durability": "eventually"}, {}, "durability"),
        ({"retention": 30}, {}, "retention"),
        ({"schema": ""}, {}, "schema"),
        ({"schema": "x" * 59}, {}, "schema"),
        ({}, {"DURABLE_CLAIMS": "optimistic"}, "DURABLE_CLAIMS"),
        ({}, {"DURABLE_CRASH_POINTS": "a:b"}, "DURABLE_CRASH_POINTS"),
        ({"response_timeout": -1}, {}, "response_timeout"),
        ({}, {"DURABLE_RESPONSE_TIMEOUT": "soon"}, "DURABLE_RESPONSE_TIMEOUT"),
    ],
)
def test_a_bad_setting_is_refused_by_name(
    arguments: dict[str, object], environ: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Config.resolve(environ=environ, **arguments)  # type: ignore[arg-type]


def test_engine_and_client_take_their_settings_from_one_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DURABLE_LISTEN", "0")
    engine = durable.Engine("postgresql://h/db", lease_seconds=6, max_workers=3)
    assert engine.config.lease_seconds == 6.0
    assert engine.config.max_workers == 3
    assert engine.config.listen is False and engine.client.listen is False
    heartbeat = engine._services.heartbeat
    assert heartbeat.cancel_poll_interval == engine.config.cancel_poll_interval == 0.5
    client = durable.Client("postgresql://h/db", schema="s1")
    assert client.config.schema == client.schema == "s1"


def test_crash_points_parse() -> None:
    assert crash_points("") == {}
    assert crash_points("a, b:3,") == {"a": 1, "b": 3}


# Modules that still read the environment themselves, and why they may.
READS_ENVIRONMENT = {
    "_io/config.py": "the one place the library's settings are resolved",
    "cli": "the command line's options have environment fallbacks (click's envvar)",
    "testing.py": "the test fixtures' own variables (DURABLE_TEST_*)",
    "_embedded": "the embedded server's data directory and the environment it is started with",
    "ui/__init__.py": "the console's token when it is served as an ASGI app by name",
}


def test_nothing_else_reads_the_environment() -> None:
    readers = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if any(
            rel == k or rel.startswith(k.rstrip("/") + "/") or rel == k + ".py"
            for k in READS_ENVIRONMENT
        ):
            continue
        if re.search(r"os\.environ|os\.getenv", path.read_text("utf-8")):
            readers.append(rel)
    assert readers == [], f"read settings in durable/_io/config.py, not in {readers}"


def test_the_response_timeout_is_given_or_five_seconds() -> None:
    """None (not given) is the SystemDB's default, 5 s; 0 is no bound."""
    from durable._io.systemdb import SystemDB

    assert Config.resolve(environ={}).response_timeout is None
    assert Config.resolve(environ={"DURABLE_RESPONSE_TIMEOUT": "2.5"}).response_timeout == 2.5
    given_both = Config.resolve(environ={"DURABLE_RESPONSE_TIMEOUT": "9"}, response_timeout=1)
    assert given_both.response_timeout == 1.0
    assert Config.resolve(environ={}, response_timeout=0).response_timeout == 0.0
    url = "postgresql://h/db"
    assert SystemDB(url, "durable").response_timeout == 5.0
    assert SystemDB(url, "durable", response_timeout=0).response_timeout is None


# An engine applies migrations at launch; a client (Config's default) leaves them to it.
ENGINE_DEFAULTS = {"migrate": True}


@pytest.mark.parametrize(
    "signature_of", [Config.resolve, durable.Engine.__init__, durable.Client.__init__]
)
def test_each_default_is_the_configs(signature_of: object) -> None:
    """The defaults are Config's fields': an argument of Config.resolve, Engine or Client
    that defaults otherwise (None resolving to something else) is caught here."""
    fields = {f.name: f for f in dataclasses.fields(Config)}
    checked = 0
    for name, param in inspect.signature(signature_of).parameters.items():  # type: ignore[arg-type]
        if name not in fields or param.default is inspect.Parameter.empty:
            continue
        field = fields[name]
        expected = (
            field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
        )
        if signature_of is durable.Engine.__init__ and name in ENGINE_DEFAULTS:
            assert param.default == ENGINE_DEFAULTS[name], name
            continue
        resolved = getattr(Config.resolve(environ={}, **{name: param.default}), name)
        if name == "executor_id":  # None: a new id each time, in place of Config's ""
            assert param.default is None and resolved
        elif field.default is dataclasses.MISSING:  # a new object each time
            assert type(resolved) is type(expected), name
        else:
            assert resolved == expected, f"{signature_of}: {name}={param.default!r}"
        checked += 1
    assert checked >= 8


# Besides _io/config.py, the one module that reads DURABLE_* variables: the test helper, which
# finds a test database the way a test suite's conftest would.
READS_ITS_OWN = {"testing.py"}


def _environment_reads(tree: ast.Module) -> list[int]:
    """Lines that read a DURABLE_* variable (or one named by a variable) from os.environ.
    A process's own variables (PATH, HOME, USER, ...) and a copy of the whole environment
    for a child process are not settings, and pass."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Attribute)
            and node.attr in {"environ", "getenv"}
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            continue
        parent = parents.get(node)
        key: ast.AST | None = None
        if isinstance(parent, ast.Dict) and None in parent.keys:
            continue  # {**os.environ, ...}: the environment handed to a child
        if isinstance(parent, ast.Call) and parent.func is node:  # os.getenv(KEY)
            key = parent.args[0] if parent.args else None
        elif isinstance(parent, ast.Attribute) and parent.attr == "get":  # os.environ.get
            call = parents.get(parent)
            key = call.args[0] if isinstance(call, ast.Call) and call.args else None
        elif isinstance(parent, ast.Subscript):  # os.environ[KEY]
            key = parent.slice
        elif isinstance(parent, ast.Compare):  # KEY in os.environ
            key = parent.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            if not key.value.startswith("DURABLE_"):
                continue
        found.append(node.lineno)
    return found


def test_only_config_reads_durable_variables() -> None:
    """Every DURABLE_* setting is read by Config.resolve and passed down (the CLI reads its
    own through click's envvar=), so the one list in _io/config.py's docstring is complete."""
    offenders = {
        str(path.relative_to(ROOT)): lines
        for path in ROOT.rglob("*.py")
        if path.relative_to(ROOT).as_posix() != "_io/config.py"
        and str(path.relative_to(ROOT)) not in READS_ITS_OWN
        and (lines := _environment_reads(ast.parse(path.read_text("utf-8"))))
    }
    assert offenders == {}


def test_the_environment_check_sees_a_read() -> None:
    source = (
        'import os\nos.environ.get("DURABLE_X")\nos.environ.get("HOME")\nos.getenv(NAME)\n'
        'env = {**os.environ}\n"DURABLE_Y" in os.environ\nos.environ["TZ"]\n'
    )
    assert sorted(_environment_reads(ast.parse(source))) == [2, 4, 6]


def test_the_queues_an_engine_runs_are_given_or_read_from_the_environment() -> None:
    """queues= wins over DURABLE_QUEUES; neither: every queue (None); [] runs no queue."""
    env = {"DURABLE_QUEUES": " emails, reports ,emails"}
    assert Config.resolve(environ=env).queues == ("emails", "reports")
    assert Config.resolve(environ=env, queues=["gpu"]).queues == ("gpu",)
    assert Config.resolve(environ=env, queues=[]).queues == ()
    assert Config.resolve(environ={}).queues is None
    assert Config.resolve(environ={"DURABLE_QUEUES": " "}).queues is None
    assert durable.Engine("postgresql://h/db", queues=("a", "b")).config.queues == ("a", "b")


@pytest.mark.parametrize(
    ("arguments", "environ", "named"),
    [
        ({"queues": "emails"}, {}, "list of queue names"),
        ({"queues": 3}, {}, "list of queue names"),
        ({"queues": ["a", ""]}, {}, "queue name"),
        ({}, {"DURABLE_QUEUES": "a,,b"}, "DURABLE_QUEUES"),
    ],
)
def test_bad_queues_are_refused(
    arguments: dict[str, object], environ: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Config.resolve(environ=environ, **arguments)  # type: ignore[arg-type]


def test_the_database_in_use_is_described_for_a_person(tmp_path: Path) -> None:
    from durable._io.config import describe_database

    url = "postgresql://ana:hunter2@db.example:5432/app"
    assert describe_database(url) == "the database at postgresql://ana:***@db.example:5432/app"
    assert describe_database(environ={"DURABLE_DATABASE_URL": url}) == describe_database(url)
    pinned = {"DURABLE_PROJECT_DIR": str(tmp_path / "shop")}
    assert Config.resolve(environ=pinned).embedded_project().pinned
    assert describe_database(environ=pinned) == (
        f"the embedded database of project {tmp_path / 'shop'}"
    )


def test_a_project_is_found_by_its_marker_or_said_to_be_a_guess(tmp_path: Path) -> None:
    from durable._embedded.projects import find_project

    (tmp_path / "shop" / "src").mkdir(parents=True)
    (tmp_path / "shop" / "pyproject.toml").write_text("")
    (tmp_path / "loose" / "sub").mkdir(parents=True)
    found = find_project(tmp_path / "shop" / "src")
    assert found.root == tmp_path / "shop" and found.marker == "pyproject.toml"
    assert not found.guessed and found.how_chosen() is None
    guess = find_project(tmp_path / "loose" / "sub")
    assert guess.root == tmp_path / "loose" / "sub" and guess.guessed
    assert "DURABLE_PROJECT_DIR" in (guess.how_chosen() or "")
    pinned = find_project(tmp_path / "loose" / "sub", pinned=tmp_path / "loose")
    assert pinned.root == tmp_path / "loose" and not pinned.guessed
