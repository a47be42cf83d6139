"""Fences whose refusal the other tests do not reach: held records refused at a barrier
stop the run before the effect behind them, and every refusal names the run that lost
(its workflow and epoch), whichever write or check refused it."""

from __future__ import annotations

from typing import Any

import pytest

from durable import _core as protocol
from durable._core import WriteSteps
from durable.errors import StaleOwnerError
from tests.unit.scripted import (
    DEFAULT,
    EPOCH,
    WORKFLOW_ID,
    Script,
    charge_card,
    effect_def,
    held,
    make_run,
)


def test_held_records_refused_at_a_barrier_stop_the_run_before_the_effect() -> None:
    run = make_run(mode="exit")
    run.pending.extend([held(0, "a"), held(1, "b")])

    def one_written(op: Any) -> Any:
        return [WORKFLOW_ID] if isinstance(op, WriteSteps) else DEFAULT

    script = Script(one_written)
    with pytest.raises(StaleOwnerError) as caught:
        script.run(protocol.effect(run, effect_def(charge_card), (1,), {}))
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)
    assert script.labels == ["WriteSteps 2"]
    assert run.pending == []


@pytest.mark.parametrize(
    "statements",
    [
        {"effect_intent": 0, "get_effect": None},  # the intent refused, no row found
        {"settle_effect": 0},  # the outcome refused
    ],
)
def test_an_effects_refusals_name_the_run_that_lost(statements: dict[str, Any]) -> None:
    with pytest.raises(StaleOwnerError) as caught:
        Script(statements=statements).run(
            protocol.effect(make_run(), effect_def(charge_card), (1,), {})
        )
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)


def test_a_claim_no_longer_held_names_the_run_that_lost() -> None:
    with pytest.raises(StaleOwnerError) as caught:
        protocol.run.proven(make_run(), None, None)  # type: ignore[arg-type]
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)
