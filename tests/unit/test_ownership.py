"""The ownership of one engine (durable/_io/ownership.py): its executor id's incarnation and
the claims held under it, in one place, with no database."""

from __future__ import annotations

import pytest

from durable._io.ownership import Ownership
from durable.errors import ExecutorIdTakenError


def test_claims_are_held_by_epoch_and_let_go_only_at_that_epoch() -> None:
    own = Ownership("e1", explicit=False, lease_seconds=30.0)
    own.hold("w", 3)
    own.let_go("w", 2)  # an older run's end does not drop the newer claim
    assert own.held_epochs() == {"w": 3}
    own.let_go("w", 3)
    assert own.held_epochs() == {}


def test_statements_on_the_held_claims_are_fenced_by_the_incarnation() -> None:
    own = Ownership("e1", explicit=True, lease_seconds=12.0)
    first = own.register([("job", None), ("job", "v2")])["incarnation"]
    own.hold("a", 1)
    own.hold("b", 4)
    params = own.held_params()
    assert params == {
        "owner": "e1",
        "incarnation": first,
        "held": ["a", "b"],
        "epochs": [1, 4],
        "lease_seconds": 12.0,
    }
    assert own.register([])["incarnation"] != first  # each launch draws a new one
    assert own.identity_params() == {"executor_id": "e1", "incarnation": own.incarnation}


def test_a_cancel_request_is_for_the_run_at_its_epoch() -> None:
    own = Ownership("e1", explicit=False, lease_seconds=30.0)
    assert own.replace_cancel_requests({"w": (2, "stop")}) == ["w"]
    assert own.replace_cancel_requests({"w": (2, "stop")}) == []  # nothing new
    assert own.cancel_request("w", 2) == "stop"
    assert own.cancel_request("w", 3) is None  # a resumed run is not the one asked
    assert own.cancel_request("x", 1) is None


def test_losing_the_id_stops_claiming_once() -> None:
    lost: list[bool] = []
    own = Ownership("e1", explicit=True, lease_seconds=30.0, on_lost=lambda: lost.append(True))
    own.register([])
    own.check_id()
    own.lose_id({"pid": 7, "hostname": "h"})
    own.lose_id({"pid": 8, "hostname": "h"})
    assert own.superseded and lost == [True]
    with pytest.raises(ExecutorIdTakenError, match="pid 7 on h"):
        own.check_id()
    own.register([])  # a new launch takes the id back
    assert not own.superseded


def test_a_stopping_worker_hands_over_until_it_is_launched_again() -> None:
    own = Ownership("e1", explicit=False, lease_seconds=30.0)
    assert not own.handing_over()
    own.hand_over_all()
    assert own.handing_over()
    own.register([])  # the engine launched again: its runs go on
    assert not own.handing_over()
