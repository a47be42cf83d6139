"""The suite runs in several processes with `--dist loadgroup` (pyproject.toml): the tests
that share an `xdist_group` run in one process, the Citus tests on one cluster
(tests/conftest.py), a module's one build or type check once (test_package.py,
tests/unit/strict_mypy.py). pytest-xdist marks a test's group in its node id; when it
cannot (pytest-xdist#1386: pytest 9.2's node ids), grouping silently stops, and this test
fails instead."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("grouping-check")
def test_a_grouped_test_carries_its_group_to_the_scheduler(
    request: pytest.FixtureRequest, worker_id: str
) -> None:
    if worker_id == "master":
        pytest.skip("runs in one process (-n 0): nothing to group")
    if not getattr(request.config.option, "loadgroup", False):  # xdist's, in each process
        pytest.skip("not run with --dist loadgroup")
    assert request.node.nodeid.endswith("@grouping-check"), (
        f"pytest-xdist did not mark the test's group in its node id ({request.node.nodeid}):"
        " --dist loadgroup runs grouped tests in any process (pytest-xdist#1386 with pytest"
        " 9.2; pyproject.toml's dev extra keeps pytest below it)"
    )
