"""A datetime whose zone was loaded from a file (ZoneInfo.from_file) keeps the key it was
given, which need not be a zone's name (a path, a directory, any text): it is stored with
that key in RFC 9557 form, and read back as the same instant at its offset."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from pathlib import Path
from typing import Any

import pytest

import durable

BERLIN_FILE = Path("/usr/share/zoneinfo/Europe/Berlin")


@pytest.mark.skipif(not BERLIN_FILE.exists(), reason="no system zoneinfo files")
@pytest.mark.parametrize("key", [str(BERLIN_FILE), "Europe", "not a zone"])
def test_a_zone_loaded_from_a_file_under_any_key_is_stored_and_read_back(
    database_url: str, key: str
) -> None:
    # A key that is not a zone's name here (a path, a directory) failed the read-back
    # check: the step's output could not be stored at all, and heartbeat details with it
    # could not be read by the next attempt.
    with BERLIN_FILE.open("rb") as file:
        zone = zoneinfo.ZoneInfo.from_file(file, key=key)
    second = dt.datetime(2026, 10, 25, 2, 30, tzinfo=zone, fold=1)  # the repeated hour
    reg = durable.Registry()
    resumed: list[Any] = []

    @durable.step(retries=1, initial_delay=0, jitter=0, registry=reg)
    def when() -> dt.datetime:
        resumed.append(durable.last_heartbeat())
        if len(resumed) == 1:
            durable.heartbeat({"at": second})
            raise RuntimeError("flaky")
        return second

    @durable.workflow(registry=reg)
    def job() -> dt.datetime:
        return when()

    with durable.Engine(database_url, registry=reg) as engine:
        out = engine.start(job, workflow_id="zoned").result(timeout=20)
        instant = second.astimezone(dt.UTC)  # `==` across zones is False in a fold (PEP 495)
        assert out.astimezone(dt.UTC) == instant and out.utcoffset() == dt.timedelta(hours=1)
        assert resumed[0] is None and resumed[1]["at"].astimezone(dt.UTC) == instant
