"""How a worker tells an outage of its system database: one line when it is lost, one when
it is back, and a failover's aftershocks folded into that one event."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from durable._io.outage import Outage

URL = "postgresql://postgres@10.0.0.1:5432,10.0.0.2:5432/app"


class Info:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port


class Conn:
    """Where a connection went (what Outage reads of one)."""

    def __init__(self, host: str) -> None:
        self.info = Info(host, 5432)


def said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_a_failover_with_an_aftershock_is_one_lost_and_one_back_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="durable.systemdb")
    outage = Outage(URL)
    outage.seen(Conn("10.0.0.1"))
    old = Conn("10.0.0.1")
    outage.seen(old)
    assert outage.lost(RuntimeError("terminating connection"), "record_step", old)
    assert not outage.lost(RuntimeError("again"), "claim")  # the same outage
    promoted = Conn("10.0.0.2")
    outage.seen(promoted)
    # The promoted server restarts: a connection made to it is closed moments later.
    assert outage.lost(RuntimeError("server closed the connection"), "record_steps", promoted)
    outage.seen(Conn("10.0.0.2"))
    warnings = said(caplog, logging.WARNING)
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("lost the system database at 10.0.0.1:5432")
    assert "is back after" in warnings[1] and "a failover" in warnings[1]
    infos = said(caplog, logging.INFO)
    assert any("closed connections again" in m and "record_steps" in m for m in infos), infos
    assert any("back again" in m for m in infos), infos


def test_an_outage_after_the_settling_time_is_a_new_one(
    caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    caplog.set_level(logging.INFO, logger="durable.systemdb")
    monkeypatch.setattr(Outage, "SETTLE_SECONDS", 0.0)
    outage = Outage(URL)
    first = Conn("10.0.0.1")
    outage.seen(first)
    assert outage.lost(RuntimeError("down"), "claim", first)
    second = Conn("10.0.0.1")
    outage.seen(second)
    assert outage.lost(RuntimeError("down again"), "claim", second)
    outage.seen(Conn("10.0.0.1"))
    warnings = said(caplog, logging.WARNING)
    assert [w.split(" ")[0] for w in warnings] == ["lost", "the", "lost", "the"], warnings
