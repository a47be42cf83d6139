"""The console's session cookies: opaque, bound to the token, expiring, revocable; and the
timeline's spans of calls that record no start (a sleep, a wait, a child)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

pytest.importorskip("starlette")

from durable._base.models import StepKind, StepRecord, WorkflowInfo, WorkflowStatus
from durable.ui import _auth
from durable.ui._timeline import timeline


def test_a_session_is_bound_to_its_token_and_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = _auth.Sessions("the-token")
    cookie = sessions.issue()
    assert sessions.valid(cookie) and "the-token" not in cookie
    assert not _auth.Sessions("another-token").valid(cookie)
    issued, nonce, mac = cookie.split(".")
    assert not sessions.valid(f"{int(issued) + 1}.{nonce}.{mac}")  # a later time, forged
    assert not sessions.valid(f"{issued}.{nonce}x.{mac}")
    for junk in (None, "", "..", "x.y.z", "1.2", cookie + ".more"):
        assert not sessions.valid(junk), junk
    now = float(issued)
    monkeypatch.setattr(_auth.time, "time", lambda: now + _auth.SESSION_SECONDS - 1)
    assert sessions.valid(cookie)
    monkeypatch.setattr(_auth.time, "time", lambda: now + _auth.SESSION_SECONDS + 1)
    assert not sessions.valid(cookie)


def test_a_signed_out_session_is_refused_here() -> None:
    sessions = _auth.Sessions("the-token")
    kept, ended = sessions.issue(), sessions.issue()
    sessions.revoke(ended)
    assert sessions.valid(kept) and not sessions.valid(ended)


def _info(status: WorkflowStatus, created: dt.datetime, finished: dt.datetime | None) -> Any:
    return WorkflowInfo.from_row(
        {
            "workflow_id": "w",
            "name": "n",
            "version": None,
            "status": status.value,
            "inputs": "[]",
            "output": None,
            "error": None,
            "serializer": "json",
            "durability": "sync",
            "parent_id": None,
            "parent_step_seq": None,
            "owner": None,
            "epoch": 1,
            "lease_expires_at": None,
            "recovery_attempts": 0,
            "created_at": created,
            "updated_at": created,
            "finished_at": finished,
            "journal_version": 1,
        }
    )


def test_a_sleep_lasts_until_the_next_call_and_a_wait_from_the_call_before() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ms = dt.timedelta(milliseconds=1)
    steps = [
        StepRecord(0, "a", StepKind.STEP, "1", None, 1, None, t0, t0 + 100 * ms),
        StepRecord(1, "sleep", StepKind.SLEEP, '"x"', None, 1, None, None, t0 + 100 * ms),
        StepRecord(2, "b", StepKind.STEP, "1", None, 3, None, t0 + 600 * ms, t0 + 700 * ms),
        StepRecord(3, "ok?", StepKind.APPROVAL, "true", None, 1, None, None, t0 + 900 * ms),
    ]
    drawn = timeline(_info(WorkflowStatus.SUCCESS, t0, t0 + 1000 * ms), steps, t0)
    spans = [(b.kind, b.x, b.width, b.duration, b.attempts) for b in drawn.bars]
    assert spans == [
        ("step", 0, 100, "100 ms", 1),
        ("sleep", 100, 500, "500 ms", 1),
        ("step", 600, 100, "100 ms", 3),
        ("approval", 700, 200, "200 ms", 1),
    ]
    assert drawn.total == "1 s" and not drawn.running
    assert [label for _, label in drawn.ticks] == ["0 ms", "250 ms", "500 ms", "750 ms", "1 s"]


def test_the_throttle_counts_wrong_tokens_per_address_and_in_all() -> None:
    now = [1000.0]
    throttle = _auth.Throttle(per_address=3, overall=5, window=60, clock=lambda: now[0])
    for _ in range(3):
        assert throttle.wait("a") == 0
        throttle.failed("a")
    assert throttle.wait("a") == 60 and throttle.wait("b") == 0
    now[0] += 59.5
    assert throttle.wait("a") == 1  # whole seconds, never 0 while it holds
    now[0] += 1
    assert throttle.wait("a") == 0
    throttle.failed("b")
    throttle.succeeded("b")  # the right token: its own count starts again
    for address in ("c", "d", "e", "f", "g"):
        throttle.failed(address)
    assert throttle.wait("h") > 0  # five in the window, from five addresses
    now[0] += 61
    assert throttle.wait("h") == 0 and throttle._failures == {}


def test_a_token_beyond_loopback_must_be_long_and_varied() -> None:
    from durable.errors import WeakTokenError

    for weak in ("", "s3cret", "x" * 31, "ab" * 20, "0123456780" * 4):
        with pytest.raises(WeakTokenError, match="token_urlsafe"):
            _auth.check_strong(weak)
    import secrets

    _auth.check_strong(secrets.token_urlsafe(32))
    _auth.check_strong(secrets.token_hex(16))
