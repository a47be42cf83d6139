"""Statements that are variants of another must not drift apart when one changes: the
compare-and-set claims (for a distributed schema) are the locking claims without their row
lock and with the claimability checked again in the UPDATE; a @transaction step's record
is record_step made to raise when its fence refuses."""

from __future__ import annotations

import re

from durable._io.systemdb import load_queries


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _between(text: str, start: str, end: str) -> str:
    return _norm(text.split(start, 1)[1].split(end, 1)[0])


def test_claim_batch_cas_is_claim_batch_without_the_lock() -> None:
    q = load_queries()
    locked, cas = q["claim_batch"], q["claim_batch_cas"]
    candidates = _between(locked, "FROM (", ") AS c")
    assert candidates.endswith("FOR UPDATE SKIP LOCKED")
    assert _between(cas, "WITH c AS (", ")\nUPDATE") == _norm(
        candidates.removesuffix("FOR UPDATE SKIP LOCKED")
    )
    assert _between(locked, "SET", "FROM (") == _between(cas, "SET", "FROM c")
    assert _norm(locked.split("RETURNING", 1)[1]) == _norm(cas.split("RETURNING", 1)[1])
    assert "FOR UPDATE" not in cas


def test_dequeue_cas_is_dequeue_without_the_lock() -> None:
    """dequeue_cas is dequeue without its row lock, taking what queue_allowance (dequeue's
    `allowed`, a statement of its own) counted."""
    q = load_queries()
    locked, cas = _norm(q["dequeue"]), _norm(q["dequeue_cas"])
    assert "FOR UPDATE" not in cas
    allowed = _between(q["dequeue"], "WITH allowed AS (", "), picked AS (")
    assert _norm(q["queue_allowance"]) == allowed
    without_allowed = "WITH picked AS (" + locked.split("), picked AS (", 1)[1]
    assert cas == without_allowed.replace(" FOR UPDATE SKIP LOCKED", "").replace(
        "LIMIT (SELECT n FROM allowed)", "LIMIT %(allowed)s"
    ).replace(
        "WHERE w.workflow_id = picked.workflow_id",
        # Without the lock, the row may have changed since it was picked: the update checks
        # again that it is still queued and of a version this worker has.
        "WHERE w.workflow_id = picked.workflow_id AND w.status = 'ENQUEUED'"
        # Given ids (on Citus, read from a few shards), the update names them again, so
        # that Citus sends it to their shards only.
        " AND (%(workflow_ids)s::text[] IS NULL OR w.workflow_id = ANY(%(workflow_ids)s::text[]))"
        " AND (w.name, coalesce(w.version, '')) IN ("
        " SELECT n, v FROM unnest(%(names)s::text[], %(versions)s::text[]) AS t (n, v))",
    )


def test_record_step_in_app_is_record_step_that_raises_instead_of_writing_nothing() -> None:
    """The record a @transaction step sends with its COMMIT is the fenced record_step,
    wrapped so that a refused fence raises (fence_lost) instead of inserting no row."""
    q = load_queries()
    plain = _norm(q["record_step"])
    wrapped = _between(q["record_step_in_app"], "WITH rec AS (", ")\nSELECT CASE")
    assert wrapped == plain
    tail = _norm(q["record_step_in_app"].split(")\nSELECT CASE", 1)[1])
    assert "fence_lost(%(workflow_id)s, %(epoch)s::bigint)" in tail


def test_dequeue_partitioned_takes_what_dequeue_cas_would_within_each_partition() -> None:
    """dequeue_partitioned is dequeue_cas with each partition's entries ranked: the same
    candidates (queue, availability, ids, versions, journal, this incarnation), the same
    order, the same compare-and-set update; what it adds is the partition's room."""
    q = load_queries()
    cas, parted = q["dequeue_cas"], q["dequeue_partitioned"]
    candidates = _between(cas, "WHERE status = 'ENQUEUED'", "ORDER BY")
    assert _between(parted, "WHERE status = 'ENQUEUED'", "), picked AS (") == candidates
    order = "CASE WHEN %(by_priority)s THEN priority ELSE 0 END, created_at, workflow_id"
    assert f"ORDER BY {order} LIMIT %(allowed)s" in _norm(cas)
    assert f"OVER (PARTITION BY partition_key ORDER BY {order}) AS place" in _norm(parted)
    assert _norm(cas.split("\nUPDATE", 1)[1]) == _norm(parted.split("\nUPDATE", 1)[1])
    assert "FOR UPDATE" not in parted
