"""Debouncing across real processes: several processes debounce one key at once, and each
quiet period gives one run, with the last inputs that reached it."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg

import durable
from tests.acceptance.workers import start_worker, stop_worker
from tests.apps import debounce_app

APP = "tests.apps.debounce_app"


def bursts(
    env: dict[str, str], url: str, which: str, key: str, processes: int, calls: int
) -> list[list[tuple[str, str]]]:
    """Run `processes` debouncing processes that start together; what each was given back:
    [(input, workflow id), ...] in its own call order."""
    go_at = time.time() + 2.0  # every process is connected by then, then all start at once
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", APP, "burst", url, which, key, f"p{i}", str(calls), str(go_at)],
            env={**env, "DURABLE_DATABASE_URL": url},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        out.append([(text, workflow_id) for text, workflow_id in json.loads(stdout)])
    return out


def runs(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT workflow_id, text FROM debounce_runs ORDER BY id").fetchall()
    return [(r[0], r[1]) for r in rows]


def test_four_processes_debouncing_one_key_at_once_make_one_run_with_the_last_input(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    debounce_app.setup(database_url)
    results = bursts(subprocess_env, database_url, "slow", "user-1", processes=4, calls=25)
    ids = {workflow_id for calls in results for _, workflow_id in calls}
    assert len(ids) == 1  # a hundred debounces, from four processes at once: one entry
    (entry,) = ids
    with durable.Client(database_url) as client:
        handle = client.retrieve(entry)
        assert handle.status() == "ENQUEUED"  # the hour-long quiet period has not passed
        stored = client.inputs.decode(client.get_workflow(entry).inputs)[0]
        # Each process debounced in order, so what is stored is one process's last input.
        assert stored[1] in {calls[-1][0] for calls in results}
        # One more debounce, after them all: the run gets exactly this input.
        last = client.debounce(debounce_app.slow, "user-1", "user-1", "the last")
        assert last.workflow_id == entry
        assert handle.status() == "ENQUEUED"
        # An hour (and a minute) later, a worker runs it: once, with the last input.
        clock = durable.FakeClock(dt.datetime.now(dt.UTC), path=tmp_path / "clock")
        clock.advance(dt.timedelta(hours=1, minutes=1))
        worker = start_worker(
            subprocess_env, database_url, app=APP, clock_file=str(tmp_path / "clock")
        )
        try:
            assert handle.result(timeout=60) == "the last"
        finally:
            stop_worker(worker)
    assert runs(database_url) == [(entry, "the last")]


def test_debouncing_while_workers_run_entries_runs_each_once_and_loses_no_last_input(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    """A quiet period of 0.2 s while three processes debounce every 50 ms on average: entries
    start while others debounce them. Each entry runs once, and with an input that none
    of the processes that reached it replaced afterwards."""
    debounce_app.setup(database_url)
    workers = [start_worker(subprocess_env, database_url, app=APP) for _ in range(2)]
    try:
        results = bursts(subprocess_env, database_url, "quick", "user-2", processes=3, calls=40)
        with durable.Client(database_url) as client:
            final = client.debounce(debounce_app.quick, "user-2", "user-2", "final")
            assert final.result(timeout=60) == "final"
            ids = {workflow_id for calls in results for _, workflow_id in calls}
            for workflow_id in ids:
                client.retrieve(workflow_id).result(timeout=60)
    finally:
        for w in workers:
            stop_worker(w)
    ran = runs(database_url)
    assert Counter(workflow_id for workflow_id, _ in ran) == Counter(ids | {final.workflow_id})
    assert (final.workflow_id, "final") in ran
    # What a run got is the input of a debounce that reached its entry, and the last one of
    # that process's calls that did: a later call that reached the entry replaced it.
    for workflow_id, text in ran:
        if workflow_id == final.workflow_id:
            continue
        lasts = set()
        for calls in results:
            mine = [given for given, got in calls if got == workflow_id]
            if mine:
                lasts.add(mine[-1])
        assert text in lasts, (workflow_id, text, lasts)
    assert len(ids) > 1  # the periods did pass while they debounced: several runs
