"""What a fork holds before its run: a reader of the fork sees what a reader of the original
saw up to the fork point (stream values at their offsets, the events' values as they were
there, the gates decided and the messages consumed there), and what lies at or after the
fork point is written by the fork's own run, once.

Each scenario runs with a sync and with an async workflow: the two drivers replay the
copied journal and write what follows it. Values carry an "edition" that the test changes
between the original's run and the fork's, so that a value copied from the original tells
itself apart from the same value written again by the fork.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import durable
from durable import errors

KINDS = ["sync", "async"]


@dataclass
class Writer:
    """A workflow `writer` that journals, at positions 0 to 5: stream value a, event
    progress=one, stream value b, event progress=two, stream value c, the stream's close.
    Every value ends with the current edition."""

    registry: durable.Registry
    workflow: Callable[..., Any]
    edition: list[str] = field(default_factory=lambda: ["1"])


def make_writer(kind: str) -> Writer:
    reg = durable.Registry()
    app = Writer(reg, workflow=lambda: None)
    if kind == "sync":

        @durable.workflow(registry=reg, name="writer")
        def writer() -> str:
            e = app.edition[0]
            durable.write_stream("s", "a" + e)
            durable.set_event("progress", "one" + e)
            durable.write_stream("s", "b" + e)
            durable.set_event("progress", "two" + e)
            durable.write_stream("s", "c" + e)
            durable.close_stream("s")
            return e

        app.workflow = writer
    else:

        @durable.workflow(registry=reg, name="writer")
        async def writer_async() -> str:
            e = app.edition[0]
            await durable.write_stream_async("s", "a" + e)
            await durable.set_event_async("progress", "one" + e)
            await durable.write_stream_async("s", "b" + e)
            await durable.set_event_async("progress", "two" + e)
            await durable.write_stream_async("s", "c" + e)
            await durable.close_stream_async("s")
            return e

        app.workflow = writer_async
    return app


def stream(client: durable.Client, workflow_id: str, offset: int = 0) -> list[Any]:
    """The stream `s` of a finished workflow (a reader stops at its close or its end)."""
    return list(client.read_stream(workflow_id, "s", offset))


@pytest.mark.parametrize("kind", KINDS)
def test_a_fork_reads_the_stream_and_events_written_before_its_fork_point(
    database_url: str, kind: str
) -> None:
    reg = durable.Registry()
    if kind == "sync":

        @durable.workflow(registry=reg, name="progress")
        def progress() -> None:
            durable.write_stream("tokens", "a")
            durable.write_stream("tokens", "b")
            durable.set_event("progress", {"done": 2})
            durable.write_stream("tokens", "c")
            durable.close_stream("tokens")

        workflow: Callable[..., Any] = progress
    else:

        @durable.workflow(registry=reg, name="progress")
        async def progress_async() -> None:
            await durable.write_stream_async("tokens", "a")
            await durable.write_stream_async("tokens", "b")
            await durable.set_event_async("progress", {"done": 2})
            await durable.write_stream_async("tokens", "c")
            await durable.close_stream_async("tokens")

        workflow = progress_async

    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(workflow, workflow_id="orig").result(timeout=10)
        fork = engine.fork("orig", from_step=3, new_id="forked")
        fork.result(timeout=10)
        for wid in ("orig", "forked"):
            assert list(engine.read_stream(wid, "tokens")) == ["a", "b", "c"]
            assert list(engine.read_stream(wid, "tokens", offset=1)) == ["b", "c"]
            assert engine.client.events(wid) == {"progress": {"done": 2}}
            assert engine.get_event(wid, "progress") == {"done": 2}
        # The fork wrote c and the close itself, once each.
        assert [(s.step_seq, s.kind) for s in engine.steps("forked")] == [
            (0, "stream"),
            (1, "stream"),
            (2, "event"),
            (3, "stream"),
            (4, "stream"),
        ]


@pytest.mark.parametrize("kind", KINDS)
def test_a_fork_at_each_point_holds_the_original_up_to_that_point(
    database_url: str, kind: str
) -> None:
    app = make_writer(kind)
    # What a reader of the original saw before each position (stream, events).
    seen: list[tuple[list[str], dict[str, str]]] = [
        ([], {}),
        (["a1"], {}),
        (["a1"], {"progress": "one1"}),
        (["a1", "b1"], {"progress": "one1"}),
        (["a1", "b1"], {"progress": "two1"}),
        (["a1", "b1", "c1"], {"progress": "two1"}),
        (["a1", "b1", "c1"], {"progress": "two1"}),  # and closed
    ]
    with durable.Engine(database_url, registry=app.registry) as engine:
        assert engine.start(app.workflow, workflow_id="orig").result(timeout=10) == "1"
        with durable.Client(database_url) as client:
            for n in range(len(seen)):
                client.fork("orig", from_step=n, new_id=f"at-{n}")
                client.cancel(f"at-{n}")
        # A fork cancelled before it ran stops at its fork point (a replay writes nothing;
        # the first new call sees the cancel; a fork with no call left, at its finish):
        # readers see only what it was made with.
        engine.recover()
        for n, (values, events) in enumerate(seen):
            with pytest.raises(errors.WorkflowCancelledError):
                engine.retrieve(f"at-{n}").result(timeout=10)
            assert stream(engine, f"at-{n}") == values, n
            assert engine.client.events(f"at-{n}") == events, n

        # Run each fork with new code: the positions before n keep the original's values,
        # the fork writes the rest at the offsets that follow them.
        app.edition[0] = "2"
        full = ["a", "b", "c"]
        for n, (values, _) in enumerate(seen[:6]):
            engine.resume(f"at-{n}").result(timeout=10)
            expected = values + [f"{x}2" for x in full[len(values) :]]
            assert stream(engine, f"at-{n}") == expected, n
            assert stream(engine, f"at-{n}", offset=1) == expected[1:], n
            assert engine.client.events(f"at-{n}") == {"progress": "two2" if n <= 3 else "two1"}, n
        assert stream(engine, "orig") == ["a1", "b1", "c1"]
        assert engine.client.events("orig") == {"progress": "two1"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_fork_of_a_fork_holds_what_its_parent_fork_held(database_url: str, kind: str) -> None:
    app = make_writer(kind)
    with durable.Engine(database_url, registry=app.registry) as engine:
        engine.start(app.workflow, workflow_id="orig").result(timeout=10)
        app.edition[0] = "2"
        engine.fork("orig", from_step=3, new_id="first").result(timeout=10)
        assert stream(engine, "first") == ["a1", "b1", "c2"]
        assert engine.client.events("first") == {"progress": "two2"}

        app.edition[0] = "3"
        # After every write but the close: all of it is the first fork's, copied.
        engine.fork("first", from_step=5, new_id="second").result(timeout=10)
        assert stream(engine, "second") == ["a1", "b1", "c2"]
        assert engine.client.events("second") == {"progress": "two2"}
        # Before the event the first fork wrote itself: it and c are written again.
        engine.fork("first", from_step=3, new_id="third").result(timeout=10)
        assert stream(engine, "third") == ["a1", "b1", "c3"]
        assert engine.client.events("third") == {"progress": "two3"}
        # A fork of a fork of a fork, from where the first one's own writes begin.
        engine.fork("third", from_step=4, new_id="fourth").result(timeout=10)
        assert stream(engine, "fourth") == ["a1", "b1", "c3"]
        assert engine.client.events("fourth") == {"progress": "two3"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_fork_keeps_the_decisions_and_messages_before_its_fork_point(
    database_url: str, kind: str
) -> None:
    reg = durable.Registry()
    if kind == "sync":

        @durable.workflow(registry=reg, name="mailbox")
        def mailbox() -> list[Any]:
            first = durable.recv("go")  # 0
            decision = durable.approval("ship")  # 1
            again = durable.recv("go", timeout=0)  # 2: nothing more has come
            return [first, decision.approved, again]

        workflow: Callable[..., Any] = mailbox
    else:

        @durable.workflow(registry=reg, name="mailbox")
        async def mailbox_async() -> list[Any]:
            first = await durable.recv_async("go")
            decision = await durable.approval_async("ship")
            again = await durable.recv_async("go", timeout=0)
            return [first, decision.approved, again]

        workflow = mailbox_async

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(workflow, workflow_id="orig")
        engine.send("orig", "parcel", topic="go", idempotency_key="go-1")
        wait_for_gate(engine, "orig", "ship")
        engine.decide("orig", "ship", True, comment="fine", decided_by="ops")
        assert handle.result(timeout=10) == ["parcel", True, None]

        fork = engine.fork("orig", from_step=2, new_id="forked")
        assert fork.result(timeout=10) == ["parcel", True, None]
        gates = engine.list_approvals("forked", waiting_only=False)
        assert [(g["name"], g["status"], g["comment"], g["decided_by"]) for g in gates] == [
            ("ship", "approved", "fine", "ops")
        ]
        # The first decision wins in the fork as in the original.
        with pytest.raises(errors.ApprovalConflictError):
            engine.decide("forked", "ship", False)

        with durable.Client(database_url) as client:
            client.fork("orig", from_step=2, new_id="retried")
            client.fork("orig", from_step=2, new_id="sent-anew")
            # The message consumed before the fork point is the fork's too: a sender that
            # retries it (same key) delivers nothing new, as it would to the original; a
            # new message is the fork's to receive after its fork point.
            client.send("retried", "parcel", topic="go", idempotency_key="go-1")
            client.send("sent-anew", "box", topic="go", idempotency_key="go-2")
        assert sorted(h.workflow_id for h in engine.recover()) == ["retried", "sent-anew"]
        assert engine.retrieve("retried").result(timeout=10) == ["parcel", True, None]
        assert engine.retrieve("sent-anew").result(timeout=10) == ["parcel", True, "box"]


def wait_for_gate(engine: durable.Engine, workflow_id: str, name: str) -> None:
    """Wait until the workflow asks at gate `name`."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if any(g["name"] == name for g in engine.list_approvals(workflow_id)):
            return
        time.sleep(0.01)
    raise AssertionError(f"{workflow_id} never asked at gate {name!r}")


@pytest.mark.parametrize("ending", ["compensated", "cancelled"])
def test_a_fork_after_an_undone_effect_is_refused_and_one_before_it_books_anew(
    database_url: str, ending: str
) -> None:
    """The original's compensations undid its booking: a fork that would inherit the
    booking (and go on as if it stood, or undo it again under the fork's key) is refused;
    a fork from before it books again under the fork's own key."""
    reg = durable.Registry()
    booked: list[tuple[str, int]] = []
    go = {"fail": True}

    @durable.effect(registry=reg, name="book", idempotent=True)
    def book(cents: int, *, idempotency_key: str) -> str:
        booked.append((idempotency_key, cents))
        return idempotency_key

    @durable.effect(registry=reg, name="unbook", idempotent=True)
    def unbook(cents: int, *, idempotency_key: str) -> str:
        booked.append((idempotency_key, -cents))
        return idempotency_key

    book.compensation(unbook)  # type: ignore[attr-defined]

    @durable.workflow(registry=reg, name="trip")
    def trip() -> str:
        book(10)
        if ending == "cancelled":
            durable.recv("go", timeout=3600)
        elif go["fail"]:
            raise ValueError("no hotel")
        return "done"

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(trip, workflow_id="t")
        if ending == "cancelled":
            deadline = time.monotonic() + 20
            while handle.status() != "SUSPENDED":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            engine.cancel("t")
        with pytest.raises((errors.WorkflowFailedError, errors.WorkflowCancelledError)):
            handle.result(timeout=20)
        assert [cents for _, cents in booked] == [10, -10]
        with pytest.raises(errors.ForkAfterUndoError, match="from_step=0") as refused:
            engine.fork("t", from_step=1, new_id="t-late")
        assert refused.value.first_effect == 0
        with pytest.raises(errors.WorkflowNotFoundError):
            engine.get_workflow("t-late")
        go["fail"] = False
        fork = engine.fork("t", from_step=0, new_id="t-again")
        if ending == "cancelled":
            engine.send("t-again", "go", topic="go")
        assert fork.result(timeout=20) == "done"
        assert [cents for _, cents in booked] == [10, -10, 10]
        assert booked[-1][0].startswith("t-again:")
