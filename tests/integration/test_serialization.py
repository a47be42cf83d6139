"""Hostile step outputs through real steps on PostgreSQL: a value that cannot be stored
(a signaling NaN Decimal, an object whose __eq__ raises) fails the step with a
SerializationError the workflow can catch, and nothing of it is journaled; values that
can be stored exactly (a NaN Decimal, a timedelta of 100,000 days and a microsecond)
are. Either way the journal stays whole: a replay of every step runs no step body and
gives back the same values, and the workflows beside it run."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from decimal import Decimal
from typing import Any

import pytest

import durable
from durable import errors

REG = durable.Registry()
RAN: Counter[str] = Counter()  # how often each step body really ran
LONG = dt.timedelta(days=100_000, microseconds=1)


class Touchy:
    """A dataclass-like output whose comparison raises (a numpy array, a lazy proxy)."""

    def __init__(self) -> None:
        self.order_id = "o-1"

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("do not compare me")

    __hash__ = object.__hash__

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return {"order_id": self.order_id}


@durable.step(registry=REG, name="ser.signaling")
def signaling() -> Any:
    RAN["signaling"] += 1
    return Decimal("sNaN")


@durable.step(registry=REG, name="ser.touchy")
def touchy() -> Any:
    RAN["touchy"] += 1
    return Touchy()


@durable.step(registry=REG, name="ser.long_wait")
def long_wait() -> Any:
    RAN["long_wait"] += 1
    return {"wait": LONG, "amount": Decimal("NaN"), "limit": dt.timedelta.max}


@durable.workflow(registry=REG, name="ser.hostile")
def hostile() -> dict[str, str]:
    seen: dict[str, str] = {}
    for name, fn in (("signaling", signaling), ("touchy", touchy)):
        try:
            fn()
            seen[name] = "stored"
        except errors.SerializationError as error:
            seen[name] = str(error)
    kept = long_wait()
    seen["kept"] = repr(kept)
    return seen


@durable.workflow(registry=REG, name="ser.returns_signaling")
def returns_signaling() -> Any:
    return signaling()


@durable.workflow(registry=REG, name="ser.plain")
def plain() -> int:
    return 7


def test_an_output_that_cannot_be_stored_fails_its_step_and_leaves_the_journal_whole(
    database_url: str,
) -> None:
    RAN.clear()
    with durable.Engine(database_url, registry=REG, max_workers=2) as engine:
        first = engine.start(hostile, workflow_id="hostile").result(timeout=20)
        journal = engine.steps("hostile")
        ran = dict(RAN)
        replay = engine.fork(
            "hostile", from_step=max(s.step_seq for s in journal) + 1, new_id="hostile-replay"
        ).result(timeout=20)

        uncaught = engine.start(returns_signaling, workflow_id="uncaught")
        with pytest.raises(errors.WorkflowFailedError) as info:
            uncaught.result(timeout=20)
        assert uncaught.status() is durable.WorkflowStatus.ERROR
        assert engine.get_workflow("uncaught").output is None
        assert engine.steps("uncaught") == []
        assert engine.start(plain, workflow_id="beside").result(timeout=20) == 7

    assert "signaling NaN" in first["signaling"] and "Decimal('NaN')" in first["signaling"]
    assert "would not read back the same" in first["touchy"]  # not the RuntimeError
    assert "annotate the function's type" in first["touchy"]
    assert first["kept"] == repr(
        {"wait": LONG, "amount": Decimal("NaN"), "limit": dt.timedelta.max}
    )
    # Only the step whose output was stored is journaled; the replay ran no stored step
    # again (the two refused ones run, and are refused, again: nothing of them was kept).
    assert [s.step_name for s in journal] == ["ser.long_wait"]
    assert replay == first
    assert ran == {"signaling": 1, "touchy": 1, "long_wait": 1}
    assert dict(RAN) == {"signaling": 3, "touchy": 2, "long_wait": 1}
    assert info.value.error_type == "durable.errors.SerializationError"
    assert "the output of step 'ser.signaling'" in info.value.error_message
    assert "signaling NaN" in info.value.error_message
