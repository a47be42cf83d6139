"""A Citus worker node that hangs (SIGSTOPped) is named by one probe of every node at once.

The probe goes through the coordinator on a connection of its own and gives each node a
part of response_timeout to answer (citus.node_connection_timeout), so a frozen node is
told from the others by the probe itself, and a statement left waiting on it is given up
as that node's (not as an outage) with the node already marked. How soon is measured by
tests/acceptance/test_citus_node_hung.py (printed), not asserted here.
"""

from __future__ import annotations

import psycopg
import pytest

import durable
from durable.errors import DatabaseUnavailableError
from tests import citus

pytestmark = pytest.mark.citus

FROZEN = 0


def test_a_hung_node_is_named_by_the_probe_and_its_statement_is_not_an_outage(
    citus_cluster: citus.CitusCluster, citus_url: str
) -> None:
    frozen_port = citus_cluster.workers[FROZEN].port
    with psycopg.connect(citus_url) as conn:
        groups = dict(
            conn.execute("SELECT nodeport, groupid FROM pg_dist_node WHERE groupid <> 0").fetchall()
        )
        rows = conn.execute(
            "SELECT w, p.nodeport FROM unnest(%s::text[]) AS w JOIN pg_dist_shard_placement p"
            " ON p.shardid = get_shard_id_for_distribution_column('durable.workflows', w)",
            [[f"w{i}" for i in range(40)]],
        ).fetchall()
    alive = next(w for w, port in rows if port != frozen_port)
    hung = next(w for w, port in rows if port == frozen_port)
    with durable.Client(citus_url, response_timeout=4.0) as client:
        db = client.db
        assert {a for _, a in db.probe_nodes(2.0, 1.6).values()} == {True}
        pids = citus_cluster.freeze_worker(FROZEN)
        try:
            answers = {group: a for group, (_, a) in db.probe_nodes(2.0, 1.6).items()}
            assert answers == {g: port != frozen_port for port, g in groups.items()}
            # A statement over both nodes' shards: given up as the hung node's, which the
            # probe it started has marked by then.
            with pytest.raises(DatabaseUnavailableError, match="worker node") as caught:
                db.fetch_all("finished_among", {"workflow_ids": [alive, hung]})
            assert getattr(caught.value, "node_hung", False)
            assert set(db.hung.groups) == {groups[frozen_port]}
            assert db.nodes_hung()
            assert db.outage.down_since is None
            assert db.fetch_one("get_workflow_status", {"workflow_id": alive}) is None
        finally:
            citus.CitusCluster.thaw_worker(pids)
        assert {a for _, a in db.probe_nodes(2.0, 1.6).values()} == {True}
