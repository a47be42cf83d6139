"""What an application-database error means to a transaction step.

A driver sees psycopg's and SQLAlchemy's errors; the core sees only an `AppFault`: the
kind of failure, and for a unique violation the constraint that refused the row. The
kind decides what the step does (see `steps.transaction`): a conflict runs the
transaction again, a refused fence or a record already written by another owner is a
lost claim, a lost connection is an outage, and a write refused as read-only is either
an outage (a standby) or the step's own doing, which the core asks the server to tell
apart. Any other error is the step's outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Fault(StrEnum):
    """The kinds of application-database failure the core tells apart."""

    LOST = "lost"  # the connection (the commit may or may not have landed)
    FENCE = "fence"  # the journal row's fence refused it: the run lost its workflow
    CONFLICT = "conflict"  # a serialization failure or deadlock: run the transaction again
    READ_ONLY = "read_only"  # a write refused: a standby, or a read-only transaction
    UNIQUE = "unique"  # a unique violation (the constraint says which)


@dataclass(frozen=True, slots=True)
class AppFault:
    """One application-database error as the core sees it: its kind, and for a unique
    violation the constraint that refused the row (None otherwise)."""

    kind: Fault
    constraint: str | None = None


# The app-side record of a transaction step at a position is already there: another run
# of the workflow recorded it first (a separate application database).
TRANSACTION_OUTPUTS_TAKEN = AppFault(Fault.UNIQUE, "transaction_outputs_pkey")
