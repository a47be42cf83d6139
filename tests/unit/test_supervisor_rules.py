"""`durable worker --processes N`: which exits of a process stop the whole command (a
configuration the next start would fail on again) and which only back it off."""

from __future__ import annotations

import signal

from durable.cli._processes import EXIT_ID_IN_USE, FAST_FAILURES, STOP_MARGIN, _fails_at_start

GRACE = 30.0
LATER = GRACE + STOP_MARGIN + 1


def test_a_process_killed_by_a_signal_never_stops_the_command() -> None:
    assert not _fails_at_start(-signal.SIGKILL, FAST_FAILURES + 5, LATER, GRACE)


def test_errors_at_start_stop_it_once_they_repeat() -> None:
    assert not _fails_at_start(2, FAST_FAILURES - 1, LATER, GRACE)
    assert _fails_at_start(2, FAST_FAILURES, LATER, GRACE)
    assert not _fails_at_start(0, FAST_FAILURES, LATER, GRACE)


def test_an_id_in_use_is_waited_for_while_a_predecessor_may_still_be_stopping() -> None:
    assert not _fails_at_start(EXIT_ID_IN_USE, FAST_FAILURES, GRACE, GRACE)
    assert _fails_at_start(EXIT_ID_IN_USE, FAST_FAILURES, LATER, GRACE)
