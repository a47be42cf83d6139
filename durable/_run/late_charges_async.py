"""Writing a late charge: what an attempt that no longer counts (given up at its timeout or
heartbeat timeout, see _core.charge) spent when its call returned, written to its
budget's ledger on its own, sent again while the database is away.

This module is the source of the awaited write (made in the background on an event
loop); `_run/late_charges.py`, the plain one, is generated from it by tools/async_to_sync.py.
"""

from __future__ import annotations

import logging

from durable import _core as protocol
from durable._core import LateCharge, Run, StepScope
from durable._run.acompat import sleep_async
from durable._run.in_step_async import drive_in_step_async
from durable.errors import DatabaseUnavailableError

logger = logging.getLogger("durable.budget")

# How often a late charge is sent before it is given up (logged, not written), and the
# wait before the first resend (doubled each time); resent, its key adds it once.
LATE_CHARGE_SENDS = 5
LATE_CHARGE_BACKOFF = 0.2


async def write_late_async(run: Run, scope: StepScope, late: LateCharge) -> None:
    """Write `late` to its budget's ledger, sent again (with a doubling wait) while the
    database is away; given up, and logged, after LATE_CHARGE_SENDS sends."""
    delay = LATE_CHARGE_BACKOFF
    for send in range(1, LATE_CHARGE_SENDS + 1):
        try:
            await drive_in_step_async(run, protocol.write_late_charge(run, scope, late))
            return
        except DatabaseUnavailableError as exc:
            if send == LATE_CHARGE_SENDS:
                _not_written(run, scope, late, exc)
                return
            await sleep_async(delay)
            delay *= 2


def _not_written(run: Run, scope: StepScope, late: LateCharge, exc: Exception) -> None:
    logger.error(
        "late charge %s of step %s of %s ($%s, %d tokens) not written to its budget: %s",
        late.key,
        scope.name,
        run.workflow_id,
        late.dollars,
        late.tokens,
        exc,
    )
