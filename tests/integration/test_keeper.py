"""An engine that is not a worker keeps watching the workflows it started: one it is about
to create (remembered just before its row is written) is not let go as gone, and one that
is really gone (pruned) is let go after a while."""

from __future__ import annotations

import time

import pytest

import durable
from durable import _recovery


def test_a_workflow_remembered_before_its_row_exists_is_still_watched(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_recovery, "_KEEP_GONE", 1.0)
    with durable.Engine(database_url, registry=durable.Registry()) as engine:
        # What lifecycle.start does first: its row comes a moment later (under load, after
        # a keeper round or several).
        engine.runner.remember("being-created")
        time.sleep(0.5)  # several rounds of the keeper (every 50 ms while it watches)
        assert "being-created" in engine.runner.own()
        deadline = time.monotonic() + 10
        while "being-created" in engine.runner.own():  # never written: let go at last
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_workflow_started_while_the_keeper_looks_is_resumed_after_its_sleep(
    database_url: str,
) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="keeper.naps")
    def naps() -> str:
        durable.sleep(1.2)  # suspends: only the keeper brings it back
        return "awake"

    with durable.Engine(database_url, registry=reg) as engine:
        engine.runner.remember("nap")
        time.sleep(0.3)  # the keeper looks while its row is not there yet
        assert engine.start(naps, workflow_id="nap").result(timeout=30) == "awake"
