"""The crash matrices, in one process (tests/integration/inprocess.py says how a process
dies here). Each cell dies at one crash point, a second engine claims the run once the
dead one's lease has run out on the movable clock, and the cell checks the world: the
counter app's `world` table (every step body that really ran), the `refunds` rows a
transaction wrote, the vendor's `vendor_moved` rows (every payment that really moved), and
the journal. The same points SIGKILL real worker processes once each in tests/acceptance
(test_crash_resume.py, test_effects.py, test_durability_crash.py, ...)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest

import durable
from durable import errors, llm
from tests.acceptance.workers import wait_for
from tests.apps import children_app, counter_app, methods_app, vendor, waits_app
from tests.apps.model_stub import ModelStub, usage_of
from tests.integration.inprocess import T0, crash_then_recover, process

# The tests' own reads, at READ COMMITTED whatever the default (under
# DURABLE_TEST_ISOLATION=serializable even a read can be refused with 40001).
READ_COMMITTED = "-c default_transaction_isolation=read\\ committed"

REG = counter_app.registry


@pytest.fixture
def url(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DURABLE_DATABASE_URL", database_url)  # the vendor's own connections
    counter_app.setup(database_url)
    return database_url


def world(url: str, workflow_id: str) -> list[str]:
    with psycopg.connect(url, options=READ_COMMITTED) as conn:
        rows = conn.execute(
            "SELECT what FROM world WHERE workflow_id = %s ORDER BY id", [workflow_id]
        ).fetchall()
    return [r[0] for r in rows]


def rows(url: str, query: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, options=READ_COMMITTED) as conn:
        return [tuple(r) for r in conn.execute(query, list(params)).fetchall()]


def journal_kinds(url: str, workflow_id: str) -> list[str]:
    return [
        k
        for (k,) in rows(
            url,
            "SELECT kind FROM durable.steps WHERE workflow_id = %s ORDER BY step_seq",
            workflow_id,
        )
    ]


def recover(url: str, clock: durable.FakeClock, workflow_id: str, **options: object) -> Any:
    """A second process claims the run (its lease ran out) and finishes it."""
    with process(url, REG, clock, **options):
        client = durable.Client(url, clock=clock)
        with client:
            return client.retrieve(workflow_id).result(timeout=60)


# -- steps, the finish, @transaction (tests/acceptance/test_crash_resume.py and
# test_worker_recovery.py::test_crash_matrix) --------------------------------------------------

DRIVERS = ["sync", "async"]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("crash", "before", "after"),
    [
        # Dies before step 2 begins: nothing of it ran, it runs once.
        ("before_step:2", ["s1"], ["s1", "s2", "s3"]),
        ("after_step_record:2", ["s1", "s2"], ["s1", "s2", "s3"]),
        # At-least-once: step 2's record never committed, so its body runs again.
        ("before_step_record:2", ["s1", "s2"], ["s1", "s2", "s2", "s3"]),
        ("before_workflow_finish:1", ["s1", "s2", "s3"], ["s1", "s2", "s3"]),
    ],
)
def test_a_step_crash_resumes_after_the_last_record(
    url: str, driver: str, crash: str, before: list[str], after: list[str]
) -> None:
    wf = counter_app.pick(counter_app.three_steps, driver)
    client, clock = crash_then_recover(
        url, REG, crash, lambda c: c.submit(wf, "w", workflow_id="w")
    )
    with client:
        assert world(url, "w") == before
        assert client.get_workflow("w").status == "RUNNING"
        if crash.startswith("before_step_record"):
            assert journal_kinds(url, "w") == ["step"]
        assert recover(url, clock, "w") == ["S1", "S2", "S3"]
        assert client.get_workflow("w").status == "SUCCESS"
    assert world(url, "w") == after


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("when", ["before_transaction_commit", "after_transaction_commit"])
def test_a_transaction_row_and_its_journal_row_commit_together(
    url: str, driver: str, when: str
) -> None:
    wf = counter_app.pick(counter_app.refunds, driver)
    orders = [["o1", 10], ["o2", 25], ["o3", 40]]
    client, clock = crash_then_recover(
        url, REG, f"{when}:2", lambda c: c.submit(wf, "t", orders, workflow_id="t")
    )
    refunds = "SELECT order_id, cents FROM refunds ORDER BY id"
    with client:
        if when == "before_transaction_commit":
            assert rows(url, refunds) == [("o1", 10)]
            assert journal_kinds(url, "t") == ["transaction", "step"]
        else:
            assert rows(url, refunds) == [("o1", 10), ("o2", 25)]
            assert journal_kinds(url, "t") == ["transaction", "step", "transaction"]
        assert recover(url, clock, "t") == 75
        assert client.get_workflow("t").status == "SUCCESS"
    assert rows(url, refunds) == [("o1", 10), ("o2", 25), ("o3", 40)]  # none twice


# -- durability modes (tests/acceptance/test_durability_crash.py) ----------------------------

FIFTY = {
    "sync": counter_app.fifty_sync,
    "async": counter_app.fifty_async,
    "exit": counter_app.fifty_exit,
}
PURE = [i for i in range(50) if i not in counter_app.EFFECTS_AT]


# kill_after: the n-th pure step to complete (19: between the first and second effects).
@pytest.mark.parametrize(
    ("driver", "kill_after"), [("sync", 7), ("sync", 19), ("sync", 33), ("async", 7), ("async", 19)]
)
@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_a_crash_costs_only_what_the_durability_mode_promises(
    url: str, mode: str, kill_after: int, driver: str
) -> None:
    wf = counter_app.pick(FIFTY[mode], driver)
    client, clock = crash_then_recover(
        url, REG, f"after_step_record:{kill_after}", lambda c: c.submit(wf, "w", workflow_id="w")
    )
    with client:
        assert recover(url, clock, "w") == sum(range(50))
        assert client.get_workflow("w").durability == mode
    # Effects: exactly once each, whatever the mode.
    assert vendor.moved(url) == list(counter_app.EFFECTS_AT)
    runs = Counter(world(url, "w"))
    assert set(runs) == {f"p{i}" for i in PURE}
    assert all(n <= 2 for n in runs.values())
    rerun = sorted(int(w[1:]) for w, n in runs.items() if n > 1)
    crashed_at = PURE[kill_after - 1]
    last_barrier = max((e for e in counter_app.EFFECTS_AT if e < crashed_at), default=-1)
    if mode == "sync":
        assert rerun == []
    else:
        window = [i for i in PURE if last_barrier < i <= crashed_at]
        assert set(rerun) <= set(window)
        if mode == "exit":
            assert rerun == window  # exit keeps nothing between barriers


# -- the effect ledger (tests/acceptance/test_effects.py) --------------------------------------

AMOUNTS = [10, 25, 40, 5]
EFFECT_POINTS = [
    "effect_after_intent",
    "effect_after_pending",
    "effect_after_call",
    "effect_after_applied",
]


def ledger(url: str) -> list[tuple[Any, ...]]:
    return rows(
        url, "SELECT idempotency_key, status, reconciled FROM durable.effects ORDER BY step_seq"
    )


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("mode", ["reconcile", "idempotent"])
@pytest.mark.parametrize("point", EFFECT_POINTS)
def test_refunds_move_exactly_once(url: str, mode: str, point: str, driver: str) -> None:
    pay = counter_app.pick(counter_app.pay, driver)
    client, clock = crash_then_recover(
        url, REG, f"{point}:3", lambda c: c.submit(pay, mode, AMOUNTS, workflow_id="run-4711")
    )
    with client:
        # Died at the third refund (40), at this edge of the write-ahead sequence.
        moved = vendor.moved(url)
        assert moved == ([10, 25] if point in EFFECT_POINTS[:2] else [10, 25, 40])
        assert recover(url, clock, "run-4711") == 80
    assert vendor.moved(url) == AMOUNTS  # nothing twice
    got = ledger(url)
    assert [k for k, _, _ in got] == [f"run-4711:{i}" for i in range(4)]
    assert all(status == "applied" for _, status, _ in got)
    # Only a crash after the vendor took the money, with a reconcile function, adopts the
    # vendor's receipt instead of calling again.
    reconciled = [k for k, _, r in got if r]
    assert reconciled == (
        ["run-4711:2"] if (mode, point) == ("reconcile", "effect_after_call") else []
    )


def _saga_checks(url: str, client: durable.Client) -> None:
    assert client.get_workflow("trip-1").status == "COMPENSATED"
    # Booked flight and hotel; the card failed; hotel then flight undone, each exactly once.
    assert vendor.moved(url) == [10, 25, -25, -10]
    assert [s for _, s, _ in ledger(url)] == ["applied", "applied", "failed", "applied", "applied"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_saga_compensates_each_applied_effect_once(url: str, driver: str) -> None:
    trip = counter_app.pick(counter_app.trip, driver)
    clock = durable.FakeClock(T0)
    with process(url, REG, clock), durable.Client(url, clock=clock) as client:
        handle = client.submit(trip, workflow_id="trip-1")
        with pytest.raises(errors.WorkflowFailedError, match="card declined"):
            handle.result(timeout=60)
        _saga_checks(url, client)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_saga_killed_after_an_undo_undoes_each_effect_once(url: str, driver: str) -> None:
    trip = counter_app.pick(counter_app.trip, driver)
    # Dies right after the vendor undid the hotel, before that undo was recorded.
    client, clock = crash_then_recover(
        url, REG, "effect_after_call:3", lambda c: c.submit(trip, workflow_id="trip-1")
    )
    with client:
        assert vendor.moved(url) == [10, 25, -25]
        with pytest.raises(errors.WorkflowFailedError, match="card declined"):
            recover(url, clock, "trip-1")
        _saga_checks(url, client)


# -- a method workflow (tests/acceptance/test_method_crash.py) ---------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_killed_method_workflow_recovers_on_the_instance_of_its_name(
    url: str, driver: str
) -> None:
    west = methods_app.west
    workflow = west.post if driver == "sync" else west.post_async
    client, clock = crash_then_recover(
        url,
        methods_app.registry,
        "after_step_record:2",
        lambda c: c.submit(workflow, "w", 3, workflow_id="w"),
        max_workers=1,
    )
    assert world(url, "w") == ["W0", "W1"]  # two steps done, nothing after them
    with client, process(url, methods_app.registry, clock):
        assert client.retrieve("w").result(timeout=60) == ["W0", "W1", "W2", "W4"]
    # Each step and the transaction ran once, all with west's prefix.
    assert world(url, "w") == ["W0", "W1", "W2", "Wmark3", "W4"]
    assert rows(url, "SELECT count(*) FROM marks WHERE workflow_id = 'w'") == [(1,)]


# -- starts from workflow code (tests/acceptance/test_start_child_crash.py) ------------------


@pytest.mark.parametrize("how", ["start_child", "submit", "enqueue"])
def test_a_start_cut_off_before_its_journal_row_keeps_one_child(url: str, how: str) -> None:
    children_app._clients.clear()  # the app's own Client, for this test's database
    reg = children_app.registry
    client, clock = crash_then_recover(
        url,
        reg,
        "after_child_start:1",
        lambda c: c.submit(children_app.parent, how, workflow_id="parent"),
    )
    try:
        # The child's row is there, the parent's journal row of the start is not.
        count = "SELECT count(*) FROM durable.{} WHERE {} = 'parent'"
        assert rows(url, count.format("workflows", "parent_id")) == [(1,)]
        assert rows(url, count.format("steps", "workflow_id")) == [(0,)]
        with client, process(url, reg, clock):
            child_id = client.retrieve("parent").result(timeout=60)
            assert client.retrieve(child_id).result(timeout=60) == 1
    finally:
        for c in children_app._clients:
            c.close()
        children_app._clients.clear()
    children = "SELECT workflow_id, parent_id, parent_step_seq FROM durable.workflows"
    assert rows(url, children + " WHERE name = 'children.kid'") == [("parent:child:0", "parent", 0)]
    assert rows(
        url,
        "SELECT step_seq, child_workflow_id FROM durable.steps"
        " WHERE workflow_id = 'parent' AND kind = 'child'",
    ) == [(0, "parent:child:0")]
    kid_runs = rows(url, "SELECT workflow_id FROM world WHERE what = 'kid ran'")
    assert kid_runs and set(kid_runs) == {("parent:child:0",)}
    assert world(url, "parent") == ["started parent:child:0"]


# -- durable.wait_first (tests/acceptance/test_wait_first_crash.py) ----------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_win_cut_off_by_a_crash_is_the_same_win_after_recovery(url: str, driver: str) -> None:
    reg = waits_app.registry
    fn = waits_app.agent_async if driver == "async" else waits_app.agent
    clock = durable.FakeClock(T0)
    with durable.Client(url, clock=clock) as client:
        handle = client.submit(fn, "agent", workflow_id="agent")
        with process(url, reg, clock) as first:
            wait_for(lambda: handle.status() == durable.WorkflowStatus.SUSPENDED)
            first.proc.kill()  # killed while the agent waits
        assert world(url, "agent") == ["before"]
        client.send("agent", "hello", topic="chat")  # nobody alive: it only wakes it
        with process(url, reg, clock, crash="after_wait_first:1") as second:
            second.wait_dead()  # right after the win's journal row
        # Decided before the replay: listed first, it would win a wait that looked again.
        client.decide("agent", "refund", True, decided_by="ops")
        client.send("agent", "later", topic="chat")
        with process(url, reg, clock):
            assert handle.result(timeout=60) == {
                "first": [1, "hello"],
                "second": [0, True],
                "later": "later",
            }
    assert world(url, "agent") == ["before", "won 1 hello", "won 0 True", "later later"]
    messages = rows(
        url,
        "SELECT payload, consumed_seq FROM durable.messages WHERE workflow_id = 'agent'"
        " ORDER BY created_at",
    )
    assert [m[0] for m in messages] == ['"hello"', '"later"']
    assert all(m[1] is not None for m in messages)  # each consumed, once, at one position
    assert len({m[1] for m in messages}) == 2
    steps = rows(
        url,
        "SELECT step_name FROM durable.steps WHERE workflow_id = 'agent'"
        " AND step_name LIKE 'wait-first%%' ORDER BY step_seq",
    )
    assert [name for (name,) in steps] == [
        "wait-first-timer",
        "wait-first#1 message:chat",
        "wait-first#0 approval:refund",
    ]
    assert rows(url, "SELECT status FROM durable.approvals") == [("approved",)]


# -- model calls through durable.llm (tests/acceptance/test_llm_wrappers.py) ------------------

LLM_PRICES = {"openai": (0.15, 0.60), "anthropic": (3.00, 15.00)}


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelStub]:
    """The model stub, and llm_app's wrapped clients pointed at it."""
    # The SDKs are imported here, not with the module: every test process collects the
    # module, and importing them costs seconds of CPU.
    import anthropic
    import openai

    from tests.apps import llm_app

    server = ModelStub().start()
    site = server.url.removesuffix("/v1")
    clients = {
        "oa": openai.OpenAI(base_url=server.url, api_key="test", max_retries=0),
        "oa_async": openai.AsyncOpenAI(base_url=server.url, api_key="test", max_retries=0),
        "an": anthropic.Anthropic(base_url=site, api_key="test", max_retries=0),
        "an_async": anthropic.AsyncAnthropic(base_url=site, api_key="test", max_retries=0),
    }
    for name, sdk in clients.items():
        monkeypatch.setattr(llm_app, name, llm.wrap(sdk, prices=llm_app.PRICES))
    yield server
    server.stop()


@pytest.mark.parametrize(
    "kind", ["openai", "openai-async", "responses", "anthropic", "anthropic-async"]
)
def test_a_crash_after_two_of_four_model_calls_costs_no_request_and_no_charge_twice(
    url: str, stub: ModelStub, kind: str
) -> None:
    from tests.apps import llm_app

    agent = llm_app.AGENTS[kind]
    client, clock = crash_then_recover(
        url,
        llm_app.registry,
        "after_step_record:2",
        lambda c: c.submit(agent, "a", workflow_id="a"),
    )
    assert stub.count() == 2
    with client:
        with process(url, llm_app.registry, clock):
            answers = client.retrieve("a").result(timeout=60)
        ledger = client.budget("a")
    prompts = llm_app.prompts("a")
    assert stub.count() == 4  # not 6: the two journaled calls replayed
    assert answers == [f"answer to {p}" for p in prompts]
    assert ledger is not None
    price_in, price_out = LLM_PRICES[kind.split("-")[0] if kind != "responses" else "openai"]
    dollars = sum(
        Decimal(str(price_in)) * usage_of(p)[0] + Decimal(str(price_out)) * usage_of(p)[1]
        for p in prompts
    ) / Decimal(1_000_000)
    assert ledger["spent"]["tokens"] == sum(sum(usage_of(p)) for p in prompts)
    assert ledger["spent"]["steps"] == 4
    assert ledger["spent"]["dollars"] == pytest.approx(float(dollars), abs=1e-9)
