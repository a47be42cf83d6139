"""A watch's Ctrl-C (durable/cli/_common.py's _CtrlC): the state it keeps and the wait it
guards, without a terminal or a database."""

from __future__ import annotations

import threading

import pytest

from durable._io.listen import Subscription
from durable.cli._common import _CtrlC


def test_a_wake_up_without_a_payload_ends_the_guarded_wait() -> None:
    """The listener wakes watchers with no payload after it reconnects, so that they look
    again at what was written while it was down: the guarded wait returns then, not at the
    end of the interval (up to an hour)."""
    subscription = Subscription(None, "durable_work", None, None, None)  # type: ignore[arg-type]
    guarded = _CtrlC().guard(subscription.woken)
    done = threading.Event()

    def waiter() -> None:
        guarded(3600)
        done.set()

    threading.Thread(target=waiter, daemon=True).start()
    threading.Timer(0.3, subscription.notify, [None]).start()  # as after a reconnect
    assert done.wait(60), "the guarded wait slept through a wake-up that carried no payload"


def test_a_notification_and_the_end_of_the_wait_return_as_before() -> None:
    assert _CtrlC().guard(lambda seconds: True)(3600) is True
    assert _CtrlC().guard(lambda seconds: False)(0.0) is False


def test_the_first_ctrl_c_is_taken_at_the_wait_the_second_at_once_and_then_none() -> None:
    ctrl_c = _CtrlC()
    ctrl_c.on_signal(2, None)  # pending: the watch ends at its next wait
    with pytest.raises(KeyboardInterrupt):
        ctrl_c.guard(lambda seconds: False)(10)
    # The watch is ending (closing its client, bounded): a Ctrl-C now is let go, where
    # one torn through the close could hang it.
    ctrl_c.on_signal(2, None)
    ctrl_c.on_signal(2, None)

    hung = _CtrlC()
    hung.on_signal(2, None)
    with pytest.raises(KeyboardInterrupt):
        hung.on_signal(2, None)  # a look (or a connect) that hangs: the second one, at once
    hung.on_signal(2, None)  # and then the way out is left alone
