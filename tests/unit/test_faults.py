"""How application-database errors reach the core: `_systemdb.app_error_fault` turns
psycopg's and SQLAlchemy's errors into an AppFault (a kind, and a constraint for a unique
violation), the only form `_core.steps.transaction` decides on."""

from __future__ import annotations

import psycopg
import sqlalchemy.exc

from durable._core import TRANSACTION_OUTPUTS_TAKEN, AppFault, Fault
from durable._io.systemdb import FENCE_LOST, app_error_fault


def _error(cls: type[psycopg.Error], sqlstate: str | None = None) -> psycopg.Error:
    error = cls("boom")
    if sqlstate is not None:
        error.sqlstate = sqlstate
    return error


def test_each_kind_of_error_has_its_fault() -> None:
    assert app_error_fault(_error(psycopg.errors.SerializationFailure)) == AppFault(Fault.CONFLICT)
    assert app_error_fault(_error(psycopg.errors.DeadlockDetected)) == AppFault(Fault.CONFLICT)
    assert app_error_fault(_error(psycopg.errors.ReadOnlySqlTransaction)) == AppFault(
        Fault.READ_ONLY
    )
    assert app_error_fault(_error(psycopg.errors.RaiseException, FENCE_LOST)) == AppFault(
        Fault.FENCE
    )
    assert app_error_fault(_error(psycopg.errors.DivisionByZero)) is None
    assert app_error_fault(ValueError("not a database error")) is None


def test_an_invalidated_connection_is_lost_whatever_the_error() -> None:
    wrapped = sqlalchemy.exc.DBAPIError(
        "SELECT 1", None, ValueError("gone"), connection_invalidated=True
    )
    assert app_error_fault(wrapped) == AppFault(Fault.LOST)


def test_a_unique_violation_names_its_constraint() -> None:
    fault = app_error_fault(_error(psycopg.errors.UniqueViolation))
    assert fault is not None and fault.kind is Fault.UNIQUE
    assert TRANSACTION_OUTPUTS_TAKEN == AppFault(Fault.UNIQUE, "transaction_outputs_pkey")
    assert Fault("conflict") is Fault.CONFLICT  # the kinds keep the names they had as text
