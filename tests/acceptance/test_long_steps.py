"""A long step on a frozen worker is taken over by another worker at its heartbeat_timeout,
not at the frozen worker's (much longer) lease: the new attempt resumes from the last
heartbeat's details, and the frozen worker, resumed, has its late result refused."""

from __future__ import annotations

import signal

import durable
from tests.acceptance.workers import scalar, start_worker, stop_worker, wait_for
from tests.apps import long_steps_app

APP = "tests.apps.long_steps_app"


def _rows(url: str, pid: int, what: str) -> list[int]:
    pages = scalar(
        url,
        "SELECT coalesce(array_agg(page ORDER BY id), '{}') FROM crawl"
        " WHERE pid = %s AND what = %s",
        pid,
        what,
    )
    assert isinstance(pages, list)
    return [int(p) for p in pages]


def test_a_stuck_step_on_a_frozen_worker_resumes_elsewhere_from_its_last_heartbeat(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    long_steps_app.setup(database_url)
    with durable.Engine(database_url, registry=long_steps_app.registry, max_workers=1) as engine:
        # A 60 s step (60 pages of 1 s), on workers whose lease (120 s) outlasts the test.
        handle = engine.submit(long_steps_app.crawl_job, "c", 60, 1.0, workflow_id="c")
        frozen = start_worker(subprocess_env, database_url, lease=120.0, app=APP)
        rescuer = None
        try:
            wait_for(
                lambda: len(_rows(database_url, frozen.pid, "page")) >= 3,
                what="three pages heartbeat on the first worker",
            )
            frozen.send_signal(signal.SIGSTOP)
            done_before = _rows(database_url, frozen.pid, "page")
            rescuer = start_worker(subprocess_env, database_url, lease=120.0, app=APP)
            result = handle.result(timeout=60)
            # The second worker ran the step again, from the page after the last heartbeat
            # (written just before each page's row: the last may lack its row, frozen
            # between the two), and did none of the pages before it again.
            assert result["pid"] == rescuer.pid
            (first,) = _rows(database_url, rescuer.pid, "start")
            assert first in (done_before[-1] + 1, done_before[-1] + 2)
            assert _rows(database_url, rescuer.pid, "page") == list(range(first, 60))
            before = (
                scalar(database_url, "SELECT count(*) FROM durable.steps"),
                scalar(database_url, "SELECT epoch FROM durable.workflows"),
                scalar(database_url, "SELECT output FROM durable.steps WHERE step_seq = 0"),
            )
        finally:
            frozen.send_signal(signal.SIGCONT)
        try:
            # Resumed, the first worker's attempt heartbeats: refused, it returns anyway.
            wait_for(
                lambda: _rows(database_url, frozen.pid, "refused") != [],
                what="the first worker's late heartbeat",
            )
        finally:
            stop_worker(frozen)  # after its run tried to record the step and gave up
            if rescuer is not None:
                stop_worker(rescuer)
        after = (
            scalar(database_url, "SELECT count(*) FROM durable.steps"),
            scalar(database_url, "SELECT epoch FROM durable.workflows"),
            scalar(database_url, "SELECT output FROM durable.steps WHERE step_seq = 0"),
        )
        # Its late result was never recorded: the journal holds the second attempt's output,
        # and the step after the crawl kept one result, the second worker's.
        assert after == before
        assert scalar(database_url, "SELECT count(*) FROM results") == 1
        assert scalar(database_url, "SELECT pid FROM results") == rescuer.pid
        assert engine.retrieve("c").status() == "SUCCESS"
        # Nothing of the frozen worker's attempt ran after its refusal.
        assert _rows(database_url, frozen.pid, "start") == [0]
