"""What the command line shows of a stored traceback: the user's frames first in each
traceback of a chain, durable's frames (wherever durable is installed) folded into one line."""

from __future__ import annotations

from durable.cli._tracebacks import durable_frame, fold, json_value

SITE = "/srv/app/.venv/lib/python3.12/site-packages/durable"

CHAINED = f"""Traceback (most recent call last):
  File "{SITE}/_run/driver.py", line 83, in _call
    value = fn(*args, **kwargs)
  File "/srv/app/billing.py", line 7, in charge
    raise KeyError("card")
KeyError: 'card'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "{SITE}/_run/driver.py", line 83, in _call
    value = fn(*args, **kwargs)
  File "/srv/app/billing.py", line 12, in pay
    return charge(cents)
           ^^^^^^^^^^^^^
  File "{SITE}/_core/steps.py", line 141, in step
    raise exc
  File "/srv/app/billing.py", line 9, in charge
    raise ValueError("declined") from None
ValueError: declined
"""


def test_each_traceback_of_a_chain_puts_the_users_frames_first() -> None:
    assert fold(CHAINED) == [
        "Traceback (most recent call last):",
        '  File "/srv/app/billing.py", line 7, in charge',
        '    raise KeyError("card")',
        "  … 1 frame in durable …",
        "KeyError: 'card'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/srv/app/billing.py", line 12, in pay',
        "    return charge(cents)",
        "           ^^^^^^^^^^^^^",
        '  File "/srv/app/billing.py", line 9, in charge',
        '    raise ValueError("declined") from None',
        "  … 2 frames in durable …",
        "ValueError: declined",
    ]


def test_only_durables_own_modules_are_its_frames() -> None:
    assert durable_frame(f"{SITE}/_run/driver.py")
    assert durable_frame("C:\\app\\venv\\Lib\\site-packages\\durable\\_core\\steps.py")
    assert durable_frame(f"{SITE}/serialization.py")
    assert not durable_frame("/home/ana/durable/tests/test_orders.py")  # a project so named
    assert not durable_frame("/home/ana/durable/orders.py")
    assert not durable_frame("/srv/app/billing.py")


def test_stored_values_become_json_values() -> None:
    assert json_value('{"total":12}') == {"total": 12}
    assert json_value(None) is None
    assert json_value("gASVCgAAAAAAAAB9lC4=", "pickle") == "gASVCgAAAAAAAAB9lC4="
