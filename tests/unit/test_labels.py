"""The names the library stores in users' databases (durable/_base/labels.py).

Journals written by one release are replayed, forked and resumed by the next, so each
stored name is pinned here byte for byte: a change to one fails a test before it can
make existing journals unreadable. The parsers are checked to read back what the
builders write, and the source is checked so that the names are not spelled out again
outside `_base/labels.py`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from durable._base import labels
from durable._io.systemdb import load_queries

PACKAGE = Path(__file__).resolve().parents[2] / "durable"

# Fragments of stored names that only _base/labels.py may spell out.
FRAGMENTS = ('"recv-deadline:"', '"stream-close:"', '":child:"', '"budget@"')
BARE_FRAGMENTS = tuple(f.strip('"') for f in FRAGMENTS)


def test_the_contract_version() -> None:
    assert labels.LABELS_VERSION == 1
    # Written on every workflow; a journal of a higher version is refused. Bumped with
    # LABELS_VERSION (never below it). 2: sent message ids name the sender's incarnation.
    # 3: a datetime in an IANA zone is stored with its zone.
    assert labels.JOURNAL_VERSION == 3
    assert labels.JOURNAL_VERSION >= labels.LABELS_VERSION


def test_journal_step_names() -> None:
    assert labels.SLEEP == "sleep"
    assert labels.STATE == "durable.state"
    assert labels.TURN == "durable.turn"
    assert labels.ATTRIBUTES == "durable.attributes"
    assert labels.approval("ship it") == "approval:ship it"
    assert labels.recv("orders") == "recv:orders"
    assert labels.recv("") == "recv:"  # the default topic
    assert labels.recv_deadline("orders") == "recv-deadline:orders"
    assert labels.recv_deadline("") == "recv-deadline:"
    assert labels.event("progress") == "event:progress"
    assert labels.EVENT_PREFIX == "event:"
    assert labels.stream("tokens") == "stream:tokens"
    assert labels.stream("tokens", closing=False) == "stream:tokens"
    assert labels.stream("tokens", closing=True) == "stream-close:tokens"
    assert labels.patch("fix-tax") == "patch:fix-tax"
    assert labels.send("orders") == "send:orders"
    assert labels.send("") == "send:"
    assert labels.sent_message_id("wf-1", 4) == "wf-1:send:4"  # journal version 1
    assert labels.sent_message_id("wf-1", 4, "3f2a9c01bb7e") == "wf-1:send:4@3f2a9c01bb7e"
    assert labels.read_event("progress") == "get-event:progress"
    assert labels.child_result("billing", "b-1") == "child-result:billing@b-1"
    assert labels.wait_first(0, "message:chat") == "wait-first#0 message:chat"
    assert labels.wait_first(12, "timer") == "wait-first#12 timer"
    assert labels.WAIT_FIRST_TIMER == "wait-first-timer"
    assert labels.callback("message", "payment") == "callback-url:message:payment"
    assert labels.callback("message", "") == "callback-url:message:"
    assert labels.callback("approval", "ship") == "callback-url:approval:ship"
    assert labels.callback_message_id("ab12") == "callback-url#ab12"


def test_library_step_names() -> None:
    assert labels.LLM_OPENAI_CHAT == "openai.chat.completions.create"
    assert labels.LLM_OPENAI_RESPONSES == "openai.responses.create"
    assert labels.LLM_ANTHROPIC_MESSAGES == "anthropic.messages.create"
    assert labels.pydantic_ai_step("model_request") == "pydantic_ai.model_request"
    assert labels.openai_agents_step("model") == "openai_agents.model"
    assert labels.openai_agents_step("tool.lookup") == "openai_agents.tool.lookup"


def test_gate_names() -> None:
    assert labels.BUDGET_GATE_PREFIX == "budget@"
    assert labels.budget_gate(0) == "budget@0"
    assert labels.budget_gate(12) == "budget@12"
    assert labels.budget_cap_gate(12, 0) == "budget@12:cap0"
    assert labels.budget_cap_gate(12, 3) == "budget@12:cap3"
    assert labels.effect_approval("charge_card", 0) == "charge_card#0"
    assert labels.effect_approval("charge_card", 2) == "charge_card#2"


def test_derived_ids() -> None:
    assert labels.child_id("order-1", 4) == "order-1:child:4"
    assert labels.child_id("order-1:child:4", 0) == "order-1:child:4:child:0"
    assert labels.effect_key("order-1", 7) == "order-1:7"
    assert labels.effect_key("order-1", 7, None) == "order-1:7"
    assert labels.effect_key("order-1", 7, "invoice-42") == "order-1:invoice-42"
    tick = dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.UTC)
    assert labels.schedule_tick_id("nightly", tick) == "schedule:nightly:2026-01-02T03:04:00+00:00"
    assert labels.retry_id("order-7") == "order-7:retry"
    assert len(labels.retry_id("x" * labels.MAX_ID_BYTES).encode()) <= labels.MAX_ID_BYTES
    # A tick in another zone is stored as the same instant in UTC.
    paris = tick.astimezone(dt.timezone(dt.timedelta(hours=1)))
    assert labels.schedule_tick_id("nightly", paris) == labels.schedule_tick_id("nightly", tick)
    assert labels.schedule_trigger_id("nightly", "u1") == "schedule:nightly:trigger:u1"
    assert labels.debounce_key("sync_user", "user-7") == "debounce:sync_user:user-7"
    assert labels.DEBOUNCE_STEP == "durable.debounce"
    assert labels.trigger_message_id("orders", "m-1") == "trigger:orders:m-1"


def size(text: str) -> int:
    return len(text.encode("utf-8"))


def test_an_id_that_fits_derives_as_it_always_has() -> None:
    """Up to the limit exactly, the derived id is the plain concatenation."""
    parent = "p" * (labels.MAX_ID_BYTES - len(":child:12"))
    assert labels.child_id(parent, 12) == parent + ":child:12"
    assert size(labels.child_id(parent, 12)) == labels.MAX_ID_BYTES
    name = "n" * (labels.MAX_ID_BYTES - len("schedule::trigger:u1"))
    assert labels.schedule_trigger_id(name, "u1") == f"schedule:{name}:trigger:u1"


@pytest.mark.parametrize("parent", ["p" * 510, "é" * 255, "a" * 505 + "é" * 3, "x" * 512])
@pytest.mark.parametrize("seq", [0, 7, 10**12])
def test_a_child_id_that_would_not_fit_is_shortened_alike_each_time(parent: str, seq: int) -> None:
    derived = labels.child_id(parent, seq)
    assert size(derived) <= labels.MAX_ID_BYTES
    assert derived == labels.child_id(parent, seq)  # the same on every replay
    assert derived.endswith(f":child:{seq}")
    assert labels.parse_child_id(derived) is not None
    assert labels.parse_child_id(derived)[1] == seq  # type: ignore[index]
    # Two parents alike but for their last character never share a child id.
    assert derived != labels.child_id(parent[:-1] + "q", seq)
    # Nested children stay within the limit too.
    assert size(labels.child_id(derived, seq + 1)) <= labels.MAX_ID_BYTES


def test_schedule_ids_of_a_long_name_fit() -> None:
    tick = dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.UTC)
    name = "s" * 512
    assert size(labels.schedule_tick_id(name, tick)) <= labels.MAX_ID_BYTES
    assert labels.schedule_tick_id(name, tick).endswith(":2026-01-02T03:04:00+00:00")
    assert labels.schedule_tick_id(name, tick) != labels.schedule_tick_id(name[:-1], tick)
    assert size(labels.schedule_trigger_id(name, "u" * 36)) <= labels.MAX_ID_BYTES


def test_a_trigger_id_of_a_long_key_fits_and_stays_distinct() -> None:
    key = "k" * 600
    assert size(labels.trigger_message_id("orders", key)) <= labels.MAX_ID_BYTES
    assert labels.trigger_message_id("orders", key) == labels.trigger_message_id("orders", key)
    assert labels.trigger_message_id("orders", key) != labels.trigger_message_id("orders", key[1:])
    assert labels.trigger_message_id("orders", key).startswith("trigger:orders:kkk")


def test_keys_that_are_never_taken_back_by_id_are_never_shortened() -> None:
    """A pending effect or a sent message is found by the key it was first written with."""
    long_id = "w" * 512
    assert labels.effect_key(long_id, 3) == long_id + ":3"
    assert labels.effect_key(long_id, 3, "k" * 512) == long_id + ":" + "k" * 512
    assert labels.sent_message_id(long_id, 3) == long_id + ":send:3"


@pytest.mark.parametrize("key", ["", "progress", "a:b", "event:nested", "é ü"])
def test_event_keys_read_back(key: str) -> None:
    assert labels.event_key(labels.event(key)) == key


@pytest.mark.parametrize("label", ["recv:x", "sleep", "events:x", "approval:event:x"])
def test_other_names_are_no_event(label: str) -> None:
    assert labels.event_key(label) is None


@pytest.mark.parametrize("key", ["", "tokens", "close:x", "-close:x", "stream:x"])
@pytest.mark.parametrize("closing", [False, True])
def test_stream_names_read_back(key: str, closing: bool) -> None:
    assert labels.parse_stream(labels.stream(key, closing)) == (key, closing)


@pytest.mark.parametrize("label", ["recv:x", "streams:x", "stream", "event:stream:x"])
def test_other_names_are_no_stream(label: str) -> None:
    assert labels.parse_stream(label) is None


@pytest.mark.parametrize("seq", [0, 1, 12, 10_000])
def test_budget_gates_read_back(seq: int) -> None:
    assert labels.parse_budget_gate(labels.budget_gate(seq)) == (seq, None)
    for nth in (0, 1, 9, 10):
        assert labels.parse_budget_gate(labels.budget_cap_gate(seq, nth)) == (seq, nth)


@pytest.mark.parametrize(
    "name",
    ["budget@", "budget@x", "budget@-1", "budget@1:cap", "budget@1:capx", "budget@1:x", "ok"],
)
def test_other_gates_are_no_budget_gate(name: str) -> None:
    assert labels.parse_budget_gate(name) is None


@pytest.mark.parametrize("parent", ["order-1", "a:b", "x:child:3", "schedule:n:2026-01-02"])
@pytest.mark.parametrize("seq", [0, 5, 123])
def test_child_ids_read_back(parent: str, seq: int) -> None:
    assert labels.parse_child_id(labels.child_id(parent, seq)) == (parent, seq)


@pytest.mark.parametrize("workflow_id", ["order-1", ":child:3", "x:child:", "x:child:three"])
def test_other_ids_are_no_child_id(workflow_id: str) -> None:
    assert labels.parse_child_id(workflow_id) is None


def test_the_sql_matches_budget_gates_as_labels_writes_them() -> None:
    """SQL cannot call _labels: the two statements that find budget gates by name are
    checked against it instead."""
    queries = load_queries()
    assert f"LIKE '{labels.BUDGET_GATE_PREFIX}%%'" in queries["waiting_budget_gates"]
    # A denied gate at a position is the position's gate or one of its cap gates.
    assert "name LIKE %(name)s || ':%%'" in queries["denied_budget_gate"]
    assert labels.budget_cap_gate(3, 1).startswith(labels.budget_gate(3) + ":")
    assert not labels.budget_cap_gate(31, 0).startswith(labels.budget_gate(3) + ":")


def scattered(text: str) -> list[str]:
    """The stored-name fragments spelled out in a module's source."""
    return [f for f in (*FRAGMENTS, *BARE_FRAGMENTS) if f in text]


def test_stored_names_are_spelled_out_only_in_labels() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).as_posix() != "_base/labels.py"
        and (found := scattered(path.read_text("utf-8")))
    }
    assert offenders == {}


def test_the_scatter_check_finds_a_spelled_out_name() -> None:
    assert scattered('label = f"budget@{seq}"') == ["budget@"]
    assert scattered('return parent + ":child:" + str(n)') == ['":child:"', ":child:"]
    assert scattered("label = labels.stream(key, closing)") == []
    labels_source = (PACKAGE / "_base" / "labels.py").read_text("utf-8")
    assert set(scattered(labels_source)) >= set(BARE_FRAGMENTS)
