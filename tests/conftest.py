from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import durable
from durable.testing import NoPostgresError, TemplateDatabases, find_postgres
from tests import citus, reads

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[TemplateDatabases]:
    """A PostgreSQL server (see durable.testing.find_postgres for the order)."""
    try:
        source = find_postgres()
    except NoPostgresError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))
    dbs = TemplateDatabases(source.url)
    yield dbs
    dbs.close()
    source.close()


# DURABLE_TEST_ON_CITUS=1: every test that asks for `database_url` gets a database on the
# Citus cluster instead, migrated and distributed (`durable migrate --citus`), so that the
# suites that matter run again on a distributed schema (.ci/run does).
ON_CITUS = os.environ.get("DURABLE_TEST_ON_CITUS") == "1"


@pytest.fixture
def database_url(request: pytest.FixtureRequest, pg_databases: TemplateDatabases) -> Iterator[str]:
    """A fresh, migrated database of its own for each test."""
    if ON_CITUS:
        cluster: citus.CitusCluster = request.getfixturevalue("citus_cluster")
        url = cluster.create_database()
        with durable.Client(url, migrate=True) as client:
            client.distribute_citus()
        yield url
        reads.close(url)
        cluster.drop_database(url)
        return
    url = pg_databases.create()
    yield url
    reads.close(url)  # no session of the test's may be left for the recycling's check
    pg_databases.recycle(url)


@pytest.fixture(autouse=True)
def _close_kept_reads() -> Iterator[None]:
    """The test's kept read connections (tests/reads.py) end with it."""
    yield
    reads.close()


@pytest.fixture
def bare_database_url(pg_databases: TemplateDatabases) -> Iterator[str]:
    """A fresh database with no durable schema."""
    url = pg_databases.create(migrated=False)
    yield url
    pg_databases.drop(url, wait=False)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many processes `-n auto` (the suite's default, pyproject.toml) runs the tests
    in: DURABLE_TEST_WORKERS, else twice the cores, at most 4. The tests mostly wait on
    PostgreSQL and on the processes they start, so more workers than cores pay; beyond 4,
    the servers' connections (each worker holds a few at a time) and memory run short."""
    wanted = os.environ.get("DURABLE_TEST_WORKERS")
    if wanted:
        return int(wanted)
    return max(1, min(4, 2 * (os.cpu_count() or 1)))


# Tests that take a second or more (`--durations` says which), by module and function (every
# parametrization of one), besides the acceptance suites and the Citus tests, which are all
# slow: `-m "not slow"` leaves them out (CONTRIBUTING.md's fast lane).
SLOW = frozenset(
    line.strip()
    for line in (Path(__file__).parent / "slow.txt").read_text("utf-8").splitlines()
    if line.strip() and not line.startswith("#")
)


def _is_slow(item: pytest.Item) -> bool:
    path = item.nodeid.split("::", 1)[0]
    function = item.nodeid.split("[", 1)[0]
    return (
        path.startswith("tests/acceptance/")
        or item.get_closest_marker("citus") is not None
        or path in SLOW
        or function in SLOW
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test on the Citus cluster is marked `citus` (`pytest -m citus` runs them all).
    Under xdist (`--dist loadgroup`) they share one worker, and so one cluster, unless every
    test runs on Citus (DURABLE_TEST_ON_CITUS=1): then each worker starts a cluster of its
    own. The slow tests (SLOW) are marked `slow`. A test marked `long` runs only in the long
    lane (DURABLE_TEST_LONG=1; CONTRIBUTING.md)."""
    long_lane = os.environ.get("DURABLE_TEST_LONG") == "1"
    for item in items:
        if item.get_closest_marker("long") is not None and not long_lane:
            item.add_marker(pytest.mark.skip(reason="the long lane: set DURABLE_TEST_LONG=1"))
        if "citus_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.citus)
            if not ON_CITUS:
                item.add_marker(pytest.mark.xdist_group("citus"))
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
    # The slow first: the processes then share out the quick ones at the end, instead of one
    # process running the last long test while the others wait.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[citus.CitusCluster]:
    """A Citus coordinator and two workers (tests/citus.py), for the whole session. Without
    Citus installed the tests skip and say how to build it; under CI=true they fail."""
    try:
        citus.ensure_installed()
    except citus.Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))
    with citus.citus_cluster() as cluster:
        yield cluster


@pytest.fixture
def citus_bare_url(citus_cluster: citus.CitusCluster) -> Iterator[str]:
    """A database of its own on the Citus cluster (on every node, the workers joined), with
    no durable schema; the coordinator's URL."""
    url = citus_cluster.create_database()
    yield url
    citus_cluster.drop_database(url)


@pytest.fixture
def citus_url(citus_bare_url: str) -> str:
    """A database of its own on the Citus cluster, migrated and distributed
    (`durable migrate --citus`)."""
    with durable.Client(citus_bare_url, migrate=True) as client:
        client.distribute_citus()
    return citus_bare_url


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child processes that import the test apps."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("DURABLE_CRASH_POINTS", None)
    env["PYTHON"] = sys.executable
    return env


# The message brokers of the trigger tests (tests/brokers.py): each skips when its broker is
# not reachable, and fails under CI=true.
from tests.brokers import nats_url, rabbitmq_url  # noqa: E402, F401
