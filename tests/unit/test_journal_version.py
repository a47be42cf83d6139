"""The journal version is written wherever a workflow is created and checked wherever one
is claimed: a statement added later that does either without it fails here (the
behaviour itself: tests/integration/test_journal_version.py)."""

from __future__ import annotations

import re

from durable._io.systemdb import load_queries

# The statements that make a workflow RUNNING under a claim: each passes by journals of a
# newer version than the code gives (%(journal_version)s).
CLAIMS = {"claim_batch", "claim_batch_cas", "dequeue", "dequeue_cas", "dequeue_partitioned"}


def test_every_claim_passes_by_a_newer_journal() -> None:
    queries = load_queries()
    claiming = {
        name
        for name, text in queries.items()
        if re.search(r"ELSE 'RUNNING' END|SET status = 'RUNNING'", text)
    }
    assert claiming == CLAIMS
    candidates = ["claim_candidates_on_shards", "claim_candidates_on_nodes"]
    for name in [*CLAIMS, *candidates, "resume_workflow", "fork_workflow"]:
        assert re.search(r"journal_version <= (%\(journal_version\)s|\$cmd\$)", queries[name]), name


def test_every_new_workflow_is_written_with_its_journal_version() -> None:
    queries = load_queries()
    creating = {n for n, text in queries.items() if "INSERT INTO {schema}.workflows" in text}
    assert creating == {
        "insert_workflow",
        "insert_workflow_pending",
        "enqueue_workflow",
        "fork_workflow",
        "import_workflows",  # rows as exported, each with its own (durable/_client/transfer.py)
    }
    for name in creating - {"import_workflows"}:
        assert "%(journal_version)s" in queries[name], name
