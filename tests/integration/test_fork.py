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

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
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


# -- forks of a running saga: each booking is undone once, by whichever fails first ----------


@dataclass
class Trip:
    """A saga `trip` that books a hotel (position 0) and a flight (1), each with an undo,
    then waits for a verdict (2): "fail" makes it fail, so its compensations run. The
    vendor is a table in the test's database that records every call, booking or undo,
    with the idempotency key it came with."""

    registry: durable.Registry
    workflow: Callable[..., Any]


def make_trip(database_url: str) -> Trip:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE vendor_calls (n serial PRIMARY KEY, action text NOT NULL, "
            "item text NOT NULL, idempotency_key text NOT NULL)"
        )
    reg = durable.Registry()

    def vendor(action: str, item: str, key: str) -> str:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO vendor_calls (action, item, idempotency_key) VALUES (%s, %s, %s)",
                (action, item, key),
            )
        return key

    @durable.effect(registry=reg, name="book", idempotent=True)
    def book(item: str, *, idempotency_key: str) -> str:
        return vendor("book", item, idempotency_key)

    @durable.effect(registry=reg, name="unbook", idempotent=True)
    def unbook(item: str, *, idempotency_key: str) -> str:
        return vendor("undo", item, idempotency_key)

    book.compensation(unbook)  # type: ignore[attr-defined]

    @durable.workflow(registry=reg, name="trip")
    def trip() -> str:
        book("hotel")
        book("flight")
        if durable.recv("verdict", timeout=3600) == "fail":
            raise ValueError("no visa")
        return "done"

    return Trip(reg, trip)


def vendor_calls(database_url: str) -> list[tuple[str, str, str]]:
    """Every call the vendor received: (action, item, idempotency key), in order."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT action, item, idempotency_key FROM vendor_calls ORDER BY n"
        ).fetchall()
    return [(str(a), str(i), str(k)) for a, i, k in rows]


def undone(database_url: str) -> list[str]:
    """The items the vendor was asked to undo, sorted."""
    return sorted(item for action, item, _ in vendor_calls(database_url) if action == "undo")


def wait_for_status(engine: durable.Engine, workflow_id: str, status: str) -> None:
    deadline = time.monotonic() + 20
    while engine.retrieve(workflow_id).status() != status:
        assert time.monotonic() < deadline, f"{workflow_id} never became {status}"
        time.sleep(0.02)


def fail(engine: durable.Engine, workflow_id: str) -> None:
    """Send the verdict that makes the workflow fail, and wait until its saga ran."""
    engine.send(workflow_id, "fail", topic="verdict")
    with pytest.raises(errors.WorkflowFailedError):
        engine.retrieve(workflow_id).result(timeout=20)
    assert engine.retrieve(workflow_id).status() == "COMPENSATED"


@pytest.mark.parametrize("first", ["original", "fork"])
def test_a_fork_of_a_running_saga_and_its_original_undo_each_booking_once(
    database_url: str, first: str
) -> None:
    """The original is waiting after its two bookings when it is forked from after them:
    the two workflows share those bookings. Whichever fails first undoes them; the other,
    failing later, finds them undone and sends no second undo."""
    app = make_trip(database_url)
    with durable.Engine(
        database_url, registry=app.registry, worker=True, poll_interval=0.05
    ) as engine:
        engine.start(app.workflow, workflow_id="t")
        wait_for_status(engine, "t", "SUSPENDED")
        engine.fork("t", from_step=2, new_id="f")
        wait_for_status(engine, "f", "SUSPENDED")
        order = ["t", "f"] if first == "original" else ["f", "t"]
        fail(engine, order[0])
        assert undone(database_url) == ["flight", "hotel"]
        fail(engine, order[1])
        calls = vendor_calls(database_url)
        assert [(a, i, k) for a, i, k in calls if a == "book"] == [
            ("book", "hotel", "t:0"),
            ("book", "flight", "t:1"),
        ]
        assert undone(database_url) == ["flight", "hotel"]
        # Both undos were sent by the workflow that failed first, under its own keys, and
        # the original's ledger says so.
        assert {k.split(":")[0] for a, _, k in calls if a == "undo"} == {order[0]}
        ledger = engine.client.effects("t")
        assert [(e["step_seq"], e["undone_by"]) for e in ledger[:2]] == [
            (0, order[0]),
            (1, order[0]),
        ]


def test_forks_of_forks_undo_each_booking_once_and_their_own_bookings_too(
    database_url: str,
) -> None:
    """A fork of a fork shares the bookings its parent fork inherited; a fork from between
    the bookings shares the hotel and books its own flight, which it undoes itself."""
    app = make_trip(database_url)
    with durable.Engine(
        database_url, registry=app.registry, worker=True, poll_interval=0.05
    ) as engine:
        engine.start(app.workflow, workflow_id="t")
        wait_for_status(engine, "t", "SUSPENDED")
        engine.fork("t", from_step=2, new_id="f1")
        wait_for_status(engine, "f1", "SUSPENDED")
        engine.fork("f1", from_step=2, new_id="f2")
        engine.fork("t", from_step=1, new_id="f3")
        for wid in ("f2", "f3"):
            wait_for_status(engine, wid, "SUSPENDED")
        for wid in ("f2", "t", "f3", "f1"):
            fail(engine, wid)
        calls = vendor_calls(database_url)
        assert sorted((i, k) for a, i, k in calls if a == "book") == [
            ("flight", "f3:1"),
            ("flight", "t:1"),
            ("hotel", "t:0"),
        ]
        assert undone(database_url) == ["flight", "flight", "hotel"]
        # The fork of the fork came first and undid what the original booked; f3 undid
        # its own flight (and found the hotel undone).
        assert sorted((i, k.split(":")[0]) for a, i, k in calls if a == "undo") == [
            ("flight", "f2"),
            ("flight", "f3"),
            ("hotel", "f2"),
        ]


def test_a_fork_and_its_original_failing_together_undo_each_booking_once(
    database_url: str,
) -> None:
    """Both sagas run at the same time: each undo is claimed on the booking's ledger row
    before it is sent, so only one of them sends it."""
    app = make_trip(database_url)
    with durable.Engine(
        database_url, registry=app.registry, worker=True, poll_interval=0.05, max_workers=4
    ) as engine:
        engine.start(app.workflow, workflow_id="t")
        wait_for_status(engine, "t", "SUSPENDED")
        for n in range(3):
            engine.fork("t", from_step=2, new_id=f"f{n}")
        for n in range(3):
            wait_for_status(engine, f"f{n}", "SUSPENDED")
        ids = ["t", "f0", "f1", "f2"]
        for wid in ids:
            engine.send(wid, "fail", topic="verdict")
        for wid in ids:
            with pytest.raises(errors.WorkflowFailedError):
                engine.retrieve(wid).result(timeout=20)
            assert engine.retrieve(wid).status() == "COMPENSATED"
        assert undone(database_url) == ["flight", "hotel"]


def test_a_booking_two_calls_share_by_key_is_undone_once_after_a_replay(
    database_url: str,
) -> None:
    """Two calls with the same key book once (the second finds the first applied), so one
    undo is owed: also by a run that replays both calls after a suspension, and by a fork
    that copied both."""
    make_trip(database_url)  # the vendor's table
    reg = durable.Registry()

    def vendor(action: str, item: str, key: str) -> str:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO vendor_calls (action, item, idempotency_key) VALUES (%s, %s, %s)",
                (action, item, key),
            )
        return key

    @durable.effect(registry=reg, name="book", idempotent=True, key=lambda item: item)
    def book(item: str, *, idempotency_key: str) -> str:
        return vendor("book", item, idempotency_key)

    @durable.effect(registry=reg, name="unbook", idempotent=True)
    def unbook(item: str, *, idempotency_key: str) -> str:
        return vendor("undo", item, idempotency_key)

    book.compensation(unbook)  # type: ignore[attr-defined]

    @durable.workflow(registry=reg, name="twice")
    def twice() -> None:
        book("hotel")
        book("hotel")  # the same key: finds the first call applied
        durable.recv("verdict", timeout=3600)
        raise ValueError("no visa")

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        engine.start(twice, workflow_id="t")
        wait_for_status(engine, "t", "SUSPENDED")
        engine.fork("t", from_step=2, new_id="f")
        wait_for_status(engine, "f", "SUSPENDED")
        fail(engine, "f")
        fail(engine, "t")
        assert [a for a, _, _ in vendor_calls(database_url)] == ["book", "undo"]


def test_retention_keeps_the_bookings_a_live_fork_shares(database_url: str) -> None:
    """The original finishes and its effect rows pass the retention age while a fork that
    shares them still waits: prune keeps those rows, so the fork's failure undoes the
    bookings (once each) instead of finding their ledger gone."""
    app = make_trip(database_url)
    with durable.Engine(database_url, registry=app.registry, worker=True, poll_interval=0.05) as e:
        e.start(app.workflow, workflow_id="t")
        wait_for_status(e, "t", "SUSPENDED")
        e.fork("t", from_step=2, new_id="f")
        wait_for_status(e, "f", "SUSPENDED")
        e.send("t", "ok", topic="verdict")
        assert e.retrieve("t").result(timeout=20) == "done"
        policy = durable.RetentionPolicy(
            finished_after=dt.timedelta(days=1), effects_after=dt.timedelta(0)
        )
        assert e.client.prune(policy, dry_run=True).effects == 0
        assert e.client.prune(policy).effects == 0  # both rows are the live fork's too
        fail(e, "f")
        assert undone(database_url) == ["flight", "hotel"]
        # Once the fork has ended nothing holds them: the two bookings go, with the
        # fork's two undos.
        assert e.client.prune(policy).effects == 4


def test_a_fork_whose_shared_ledger_is_gone_fails_its_saga_loudly(
    database_url: str, pg_databases: Any
) -> None:
    """The fork alone is exported and imported into another database: the bookings it
    shares are recorded in its original's ledger, which did not come along. Whether they
    were undone cannot be told there: the fork ends COMPENSATION_FAILED naming the lost
    ledger, rather than COMPENSATED with the bookings standing and nothing said."""
    app = make_trip(database_url)
    with durable.Engine(database_url, registry=app.registry, worker=True, poll_interval=0.05) as e:
        e.start(app.workflow, workflow_id="t")
        wait_for_status(e, "t", "SUSPENDED")
        e.fork("t", from_step=2, new_id="f")
        wait_for_status(e, "f", "SUSPENDED")
        data = e.client.export_workflow("f")
    other = pg_databases.create()
    try:
        with durable.Client(other) as client:
            client.import_workflow(data)
        there = make_trip(other)
        with durable.Engine(other, registry=there.registry, worker=True, poll_interval=0.05) as e:
            e.send("f", "fail", topic="verdict")
            with pytest.raises(errors.WorkflowFailedError) as info:
                e.retrieve("f").result(timeout=20)
            assert e.retrieve("f").status() == "COMPENSATION_FAILED"
        assert "SharedEffectLostError" in info.value.error_type
        assert undone(other) == []  # not undone blindly
    finally:
        pg_databases.drop(other)
