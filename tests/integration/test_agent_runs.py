"""Budgets, working state, tool records and conversations, in one process."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import psycopg
import pytest

import durable
from durable import errors


def _wait_status(
    engine: durable.Engine, workflow_id: str, status: str, timeout: float = 20
) -> None:
    import time

    deadline = time.monotonic() + timeout
    while engine.get_workflow(workflow_id).status != status:
        assert time.monotonic() < deadline, engine.get_workflow(workflow_id)
        time.sleep(0.05)


def budget_app() -> tuple[durable.Registry, dict[str, int], object, object]:
    reg = durable.Registry()
    calls: dict[str, int] = {}

    @durable.step(registry=reg)
    def think(i: int) -> int:
        calls[f"think{i}"] = calls.get(f"think{i}", 0) + 1
        durable.charge(dollars=0.4, tokens=100)
        return i

    @durable.workflow(registry=reg)
    def helper(i: int) -> int:
        return think(i)

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=1.0))
    def agent(n: int) -> list[int]:
        out = []
        for i in range(n):
            out.append(think(i))
        out.append(helper(100))  # a child: draws from this workflow's budget
        return out

    return reg, calls, agent, helper


def test_budget_gate_pauses_and_a_raise_lets_it_continue(database_url: str) -> None:
    reg, calls, agent, _helper = budget_app()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        engine.start(agent, 4, workflow_id="a1")
        # 0.4 + 0.4 = 0.8; the third step's 0.4 would pass 1.0: its charge is refused (the
        # hard cap), nothing of it is recorded, and the workflow waits at the cap's gate.
        _wait_status(engine, "a1", "SUSPENDED")
        gates = engine.list_approvals()
        assert [(g["workflow_id"], g["name"]) for g in gates] == [("a1", "budget@2:cap0")]
        assert calls.get("think2") == 1 and "think3" not in calls
        ledger = engine.budget("a1")
        assert ledger is not None
        assert ledger["spent"] == {"dollars": 0.8, "tokens": 200, "steps": 2}
        engine.raise_budget("a1", dollars=1.0)
        assert engine.retrieve("a1").result(timeout=20) == [0, 1, 2, 3, 100]
        ledger = engine.budget("a1")
        assert ledger is not None
        # The child's step was charged to the parent's ledger; nothing twice.
        assert ledger["spent"] == {"dollars": 2.0, "tokens": 500, "steps": 5}
        assert ledger["limits"]["dollars"] == 2.0
        assert len(ledger["charges"]) == 5
        assert {c["workflow_id"] for c in ledger["charges"]} == {"a1", "a1:child:4"}
        # Every step ran once, but the refused one, which ran again after the raise.
        assert calls == {"think0": 1, "think1": 1, "think2": 2, "think3": 1, "think100": 1}


def test_a_denied_budget_gate_raises_budget_exceeded(database_url: str) -> None:
    reg, calls, agent, _helper = budget_app()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(agent, 5, workflow_id="a2")
        _wait_status(engine, "a2", "SUSPENDED")
        engine.decide("a2", "budget@2:cap0", False, comment="enough")
        with pytest.raises(errors.WorkflowFailedError) as info:
            handle.result(timeout=20)
        assert info.value.error_type.endswith("BudgetExceededError")
        assert "raise_budget" in str(info.value)
        assert calls.get("think2") == 1 and "think3" not in calls  # not run again


def test_state_turns_and_tools_are_rebuilt_by_replay(database_url: str) -> None:
    reg = durable.Registry()
    tool_runs: list[str] = []

    @durable.tool(registry=reg)
    def search(query: str, limit: int = 3) -> list[str]:
        tool_runs.append(query)
        durable.charge(dollars=0.01, tokens=7)
        return [f"{query}-{i}" for i in range(limit)]

    @durable.workflow(registry=reg)
    def researcher(topic: str) -> dict[str, object]:
        durable.state.set({"plan": ["search", "write"], "done": []})
        durable.append_turn("user", f"research {topic}")
        hits = search(topic, limit=2)
        durable.state.update(done=["search"])
        durable.append_turn("assistant", hits)
        durable.recv("go", timeout=60)  # suspends: the body replays from the top after
        seen = durable.state.get()
        return {"state": seen, "turns": durable.conversation(), "hits": hits}

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(researcher, "tides", workflow_id="r1")
        _wait_status(engine, "r1", "SUSPENDED")
        engine.send("r1", "ok", topic="go")
        result = handle.result(timeout=20)
        assert result["state"] == {"plan": ["search", "write"], "done": ["search"]}
        assert result["turns"] == [
            {"role": "user", "content": "research tides"},
            {"role": "assistant", "content": ["tides-0", "tides-1"]},
        ]
        assert tool_runs == ["tides"]  # frozen: the replay got the journaled result
        calls = engine.client.tool_calls("r1")
        assert len(calls) == 1
        call = calls[0]
        assert call["tool"].endswith("search")
        assert call["arguments"] == {"args": ["tides"], "kwargs": {"limit": 2}}
        assert call["result"] == ["tides-0", "tides-1"]
        assert call["dollars"] == 0.01 and call["tokens"] == 7
        assert call["latency_ms"] >= 0
        # Versions by position (set 0, turn 1, search 2, update 3, turn 4): a fork from
        # step 3 starts before the update.
        assert engine.get_state("r1") == result["state"]
        assert engine.get_state("r1", at_step=3) == {"plan": ["search", "write"], "done": []}
        assert engine.get_state("r1", at_step=4) == result["state"]
        assert engine.get_state("r1", at_step=0) is None
        assert engine.client.conversation("r1") == result["turns"]


def test_conversation_storage_grows_linearly(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, durability="exit")
    def chat(n: int) -> int:
        for i in range(n):
            durable.append_turn("user" if i % 2 == 0 else "assistant", f"message number {i} " * 4)
        return len(durable.conversation())

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(chat, 100, workflow_id="c100").result(timeout=60) == 100
        assert engine.start(chat, 1000, workflow_id="c1000").result(timeout=60) == 1000

    def size(workflow_id: str) -> int:
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                "SELECT sum(pg_column_size(s.*)) FROM durable.steps AS s WHERE workflow_id = %s",
                (workflow_id,),
            ).fetchone()
        assert row is not None
        return int(row[0])

    ratio = size("c1000") / size("c100")
    # One row per turn: ten times the turns, about ten times the bytes (not a hundred,
    # which storing the whole transcript at every turn would give).
    assert 8.0 < ratio < 12.5, ratio


def test_bad_input_is_refused_with_typed_errors_and_nothing_is_stored(database_url: str) -> None:
    with pytest.raises(errors.InvalidBudgetError, match="zero or more"):
        durable.Budget(dollars=-1.0)
    with pytest.raises(errors.InvalidBudgetError, match="whole number"):
        durable.Budget(tokens=1.5)  # type: ignore[arg-type]
    with pytest.raises(errors.DefinitionError, match=r"durable\.Budget"):
        durable.workflow(budget={"dollars": 5}, registry=durable.Registry())  # type: ignore[arg-type]
    with pytest.raises(errors.NotInWorkflowError, match=r"@durable\.step"):
        durable.charge(dollars=1.0)
    with pytest.raises(errors.NotInWorkflowError, match="inside a workflow"):
        durable.budget_left()
    with pytest.raises(errors.NotInWorkflowError, match="workflow function"):
        durable.state.set({"plan": []})
    with pytest.raises(errors.ConfigurationError, match="zero or more"):
        durable.RetentionPolicy(finished_after=-5)  # type: ignore[arg-type]

    reg = durable.Registry()

    @durable.step(registry=reg)
    def spend(amount: float) -> str:
        durable.charge(dollars=amount)
        return "spent"

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=5.0))
    def bad_charge() -> str:
        return spend(-2.0)

    @durable.workflow(registry=reg)
    def bad_state() -> None:
        durable.state.set({"plan": ["a"]})
        durable.state.set({"when": object()})

    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(errors.WorkflowFailedError, match="zero or more"):
            engine.start(bad_charge, workflow_id="b1").result(timeout=20)
        ledger = engine.budget("b1")
        assert ledger is not None and ledger["spent"]["dollars"] == 0.0
        with pytest.raises(errors.WorkflowFailedError, match=r"SerializationError|JSON"):
            engine.start(bad_state, workflow_id="b2").result(timeout=20)
        # The bad value was not stored; the state is the last good one.
        assert engine.get_state("b2") == {"plan": ["a"]}
        with pytest.raises(errors.InvalidBudgetError, match="zero or more"):
            engine.raise_budget("b1", dollars=-1.0)
        with pytest.raises(errors.InvalidBudgetError, match="no budget"):
            engine.raise_budget("b2", dollars=1.0)
        ledger = engine.budget("b1")
        assert ledger is not None and ledger["limits"]["dollars"] == 5.0


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args], capture_output=True, text=True, timeout=60
    )


def stateful_app() -> tuple[durable.Registry, list[object], object]:
    reg = durable.Registry()
    seen: list[object] = []

    @durable.step(registry=reg, name="tick")
    def tick(i: int, state: object) -> object:
        seen.append(state)
        durable.charge(dollars=0.5)
        return state

    @durable.workflow(registry=reg, name="stateful", budget=durable.Budget(dollars=10.0))
    def stateful(n: int) -> list[object]:
        durable.state.set({"i": 0})  # position 0
        out = []
        for i in range(1, n + 1):
            out.append(tick(i, durable.state.get()))  # positions 1, 3, 5
            durable.state.set({"i": i})  # positions 2, 4, 6
        return out

    return reg, seen, stateful


def test_show_prints_state_and_budget_and_a_fork_sees_the_state_as_it_was(
    database_url: str,
) -> None:
    reg, seen, stateful = stateful_app()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        expected = [{"i": 0}, {"i": 1}, {"i": 2}]
        assert engine.start(stateful, 3, workflow_id="st").result(timeout=20) == expected
        url = ["--database-url", database_url]

        shown = cli("workflows", "show", "st", *url)
        assert shown.returncode == 0, shown.stderr
        assert 'state: {"i": 3}' in shown.stdout
        assert "budget st" in shown.stdout and "1.5" in shown.stdout
        data = json.loads(cli("workflows", "show", "st", "--json", *url).stdout)
        assert data["state"] == {"i": 3}
        assert data["budget"]["spent"] == {"dollars": 1.5, "tokens": 0, "steps": 3}

        seen.clear()
        forked = cli("workflows", "fork", "st", "--from-step", "3", "--new-id", "st-fork", *url)
        assert forked.returncode == 0, forked.stderr
        assert engine.retrieve("st-fork").result(timeout=20) == expected
        # Only the steps from position 3 ran again, and the first saw the state as it
        # was at position 3, rebuilt from the copied journal.
        assert seen == [{"i": 1}, {"i": 2}]
        assert engine.get_state("st-fork", at_step=3) == {"i": 1}
        fork_ledger = engine.budget("st-fork")
        assert fork_ledger is not None
        # Its own ledger, starting from the copied step's charge (0.5), not from zero.
        assert fork_ledger["budget_id"] == "st-fork"
        assert fork_ledger["spent"]["dollars"] == 1.5

        bad = cli("workflows", "raise-budget", "st", "--dollars", "-1", *url)
        assert bad.returncode == 2
        raised = cli("workflows", "raise-budget", "st", "--dollars", "2.5", *url)
        assert raised.returncode == 0, raised.stderr
        assert json.loads(raised.stdout)["limits"]["dollars"] == 12.5


def test_prune_dry_run_counts_and_prune_deletes_only_finished_work(database_url: str) -> None:
    reg, _seen, stateful = stateful_app()
    clock = durable.FakeClock()
    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.05, clock=clock
    ) as engine:
        engine.start(stateful, 2, workflow_id="old").result(timeout=20)
        url = ["--database-url", database_url]
        dry = cli("prune", "--finished-after", "0s", "--dry-run", "--json", *url)
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout) == {
            "workflows": 1,
            "steps": 5,
            "effects": 0,
            "dry_run": True,
            "early_messages": 0,
        }
        assert engine.get_workflow("old").status == "SUCCESS"  # dry run deleted nothing
        assert cli("prune", "--finished-after", "7d", *url).stdout.startswith("deleted 0")
        report = engine.client.prune(durable.RetentionPolicy(finished_after=dt.timedelta(0)))
        assert (report.workflows, report.steps) == (1, 5)
        with pytest.raises(errors.WorkflowNotFoundError):
            engine.get_workflow("old")
        # The ledger went with it (cascade): no orphan rows.
        with psycopg.connect(database_url) as conn:
            assert conn.execute("SELECT count(*) FROM durable.budgets").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM durable.charges").fetchone() == (0,)
        with pytest.raises(errors.ConfigurationError, match="needs a policy"):
            engine.client.prune()


@pytest.mark.parametrize("mode", ["async", "exit"])
def test_tool_records_stay_in_order_in_lazy_durability_modes(database_url: str, mode: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg, name="plain")
    def plain(i: int) -> int:
        return i

    @durable.tool(registry=reg, name="lookup")
    def lookup(i: int) -> int:
        durable.charge(tokens=i)
        return 10 * i

    @durable.workflow(registry=reg, name="mixed", durability=mode)  # type: ignore[arg-type]
    def mixed(n: int) -> int:
        total = 0
        for i in range(n):
            total += plain(i) + lookup(i)
            durable.append_turn("tool", i)
        return total

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(mixed, 5, workflow_id="m").result(timeout=20) == 110
        kinds = [s.kind.value for s in engine.steps("m")]
        assert kinds == ["step", "tool", "turn"] * 5
        calls = engine.client.tool_calls("m")
        assert [c["step_seq"] for c in calls] == [1, 4, 7, 10, 13]
        assert [c["tokens"] for c in calls] == [0, 1, 2, 3, 4]
        assert engine.budget("m") is None  # no budget declared: costs are recorded per call


def test_a_failed_attempt_that_charged_still_counts_after_the_retry(database_url: str) -> None:
    reg = durable.Registry()
    attempts: list[int] = []

    @durable.step(registry=reg, retries=2, initial_delay=0, jitter=0)
    def call_llm() -> str:
        attempts.append(1)
        durable.charge(dollars=0.25, tokens=10)  # the vendor billed this call either way
        if len(attempts) == 1:
            raise TimeoutError("the response was lost")
        return "ok"

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=5.0))
    def agent() -> str:
        return call_llm()

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(agent, workflow_id="r1").result(timeout=20) == "ok"
        ledger = engine.budget("r1")
        assert ledger is not None
        assert len(attempts) == 2
        assert ledger["spent"]["dollars"] == pytest.approx(0.5)
        assert ledger["spent"]["tokens"] == 20
        assert [c["dollars"] for c in ledger["charges"]] == [pytest.approx(0.5)]
        # Replaying the finished workflow charges nothing more.
        assert engine.start(agent, workflow_id="r1").result(timeout=20) == "ok"
        again = engine.budget("r1")
        assert again is not None and again["spent"]["dollars"] == pytest.approx(0.5)
        assert len(attempts) == 2
