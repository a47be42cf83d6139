"""One Citus worker node down (its postmaster SIGKILLed) is not the system database lost.

The coordinator still answers: a statement over every shard is refused (Citus cannot reach
the dead node's shards), but a workflow's statements on the other node's shards run. The
engine must not take that refusal for an outage of the whole database (dropping every
pooled connection and interrupting every run in flight), only fail the one statement as
unavailable, so that its caller retries it later.
"""

from __future__ import annotations

import contextlib

import psycopg
import pytest

import durable
from durable.errors import DatabaseUnavailableError
from tests import citus

pytestmark = pytest.mark.citus


def test_a_worker_node_down_fails_only_the_statements_that_need_it(
    citus_cluster: citus.CitusCluster, citus_url: str
) -> None:
    killed = 0
    with psycopg.connect(citus_url) as conn:
        rows = conn.execute(
            "SELECT w, p.nodeport FROM unnest(%s::text[]) AS w JOIN pg_dist_shard_placement p"
            " ON p.shardid = get_shard_id_for_distribution_column('durable.workflows', w)",
            [[f"w{i}" for i in range(40)]],
        ).fetchall()
    alive = next(w for w, port in rows if port != citus_cluster.workers[killed].port)
    dead = next(w for w, port in rows if port == citus_cluster.workers[killed].port)
    with durable.Client(citus_url) as client:
        db = client.db
        assert db.fetch_one("get_workflow_status", {"workflow_id": alive}) is None
        citus_cluster.kill_worker(killed)
        try:
            # Over several shards, the dead node's among them: refused, as unavailable
            # (retried later, not failed).
            with pytest.raises(DatabaseUnavailableError, match="worker node"):
                db.fetch_all("finished_among", {"workflow_ids": [alive, dead]})
            # On the dead node's shard: the same.
            with pytest.raises(DatabaseUnavailableError):
                db.fetch_one("get_workflow_status", {"workflow_id": dead})
            # Not an outage of the system database: nothing reported lost...
            assert db.outage.down_since is None
            # ...and the other node's shards answer, on the same pool.
            for _ in range(3):
                assert db.fetch_one("get_workflow_status", {"workflow_id": alive}) is None
            assert db.outage.down_since is None
        finally:
            with contextlib.suppress(Exception):
                citus_cluster.start_worker(killed)
        assert db.fetch_one("get_workflow_status", {"workflow_id": dead}) is None
