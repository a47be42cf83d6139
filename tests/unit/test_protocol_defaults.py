"""Defaults the core relies on: a charge reserves nothing and a reservation charges
nothing toward the cap, a journal record counts one attempt, and an effect settled while
stopping is journaled at its own position with no undo when it has none."""

from __future__ import annotations

import hashlib
from decimal import Decimal
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import EffectStatus, StepKind
from durable._core import StepScope
from durable._core.budget import over_cap
from durable.errors import WorkflowInterrupted
from tests.unit.scripted import (
    SERIALIZER,
    WORKFLOW_ID,
    Script,
    charge_card,
    done,
    effect_def,
    effect_row,
    ledger,
    make_run,
)


def tokens_run() -> Any:
    return make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_tokens=100, spent_tokens=60))


def test_a_reservation_adds_no_charge_and_a_charge_no_reservation() -> None:
    charged = StepScope("llm", charging=True, live=1, tokens=40)
    assert over_cap(tokens_run(), charged, reserve_dollars=Decimal("0.1")) is None
    reserved = StepScope("llm", charging=True, live=1, reserved_tokens=40)
    assert over_cap(tokens_run(), reserved, dollars=Decimal("0.1")) is None
    assert over_cap(tokens_run(), reserved) is None


def test_a_journal_record_counts_one_attempt_by_default() -> None:
    script = Script()
    script.run(protocol.record(make_run(), 0, "sleep", StepKind.SLEEP, None))
    assert script.only("record_step")["attempts"] == 1


def test_an_effect_settled_while_stopping_is_journaled_at_its_position() -> None:
    text = SERIALIZER.dumps({"args": [5], "kwargs": {}})
    pending = effect_row(EffectStatus.PENDING, hashlib.sha256(text.encode()).hexdigest())
    run = make_run(records=[done(0, "fetch", 1)], cancel="stop")
    run.journal.next_call("fetch")
    script = Script(statements={"get_effect": pending})
    with pytest.raises(WorkflowInterrupted):
        script.run(protocol.effect(run, effect_def(charge_card), (5,), {}))
    assert script.only("settle_effect")["step_seq"] == 1
    assert run.compensations == []  # no undo registered: the effect has none
