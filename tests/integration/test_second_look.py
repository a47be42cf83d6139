"""What a second hostile look found: a twin executor id, an engine running others' queue
entries, a resumed workflow nobody resumes, passwords in a URL's query, keys JSON merges."""

from __future__ import annotations

import time

import pytest

import durable
from durable import errors
from durable._base.urls import redact
from durable.serialization import JSONSerializer, faithful

reg = durable.Registry()
jobs = durable.Queue("second-look", registry=reg)


@durable.workflow(registry=reg, name="second.job")
def job(n: int) -> int:
    return n


@durable.workflow(registry=reg, name="second.sleeper")
def sleeper() -> str:
    durable.sleep(1.5)
    return "woke"


def test_an_executor_id_in_use_by_a_live_process_is_refused(database_url: str) -> None:
    with durable.Engine(database_url, registry=reg, executor_id="twin", lease_seconds=30):
        twin = durable.Engine(database_url, registry=reg, executor_id="twin", lease_seconds=30)
        with pytest.raises(errors.ConfigurationError, match="in use by pid"):
            twin.launch()
        assert not twin.running


def test_an_engine_leaves_queue_entries_it_did_not_enqueue_to_the_workers(
    database_url: str,
) -> None:
    with durable.Client(database_url) as client:
        foreign = [client.enqueue(jobs, job, i) for i in range(3)]
    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(sleeper, workflow_id="own")  # gives the keeper something to watch
        time.sleep(1.0)
        statuses = {engine.retrieve(h.workflow_id).status() for h in foreign}
        assert statuses == {durable.WorkflowStatus.ENQUEUED}
        assert engine.retrieve("own").result(timeout=20) == "woke"


def test_a_workflow_resumed_by_an_engine_is_finished_by_it(database_url: str) -> None:
    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(sleeper, workflow_id="resumed")
        engine.cancel("resumed")
        with pytest.raises(errors.WorkflowCancelledError):
            handle.result(timeout=20)
        assert engine.resume("resumed").result(timeout=20) == "woke"  # it slept again here


def test_passwords_in_a_query_string_are_redacted() -> None:
    for url in (
        "postgresql://host/db?password=s3cret",
        "postgresql://bob@h/db?sslpassword=s3cret&x=1",
        "postgresql:///db?host=/tmp&password=s3cret",
        "postgresql://bob:s3cret@h/db",
    ):
        assert "s3cret" not in redact(url)


def test_keys_that_json_would_merge_are_refused() -> None:
    s = JSONSerializer()
    value = {1: "one", "1": "string-one"}
    with pytest.raises(errors.SerializationError, match="one key in JSON"):
        faithful(s, value, s.dumps(value), dict[int, str], "the output of step 'x'")
    nested = [{1: 10, "1": 20}]
    with pytest.raises(errors.SerializationError, match="one key in JSON"):
        faithful(s, nested, s.dumps(nested), list[dict[int, int]], "the output of step 'y'")
