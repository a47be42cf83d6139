"""A workflow that receives messages sent before it started, for the crash tests of
send(..., before_start=True) and start_or_send.

`early.receiver` receives `n` messages on "orders" and records each in the world table
(a step after the receive: the crash point `after_recv` lies between a message's
consumption and that record). Run as a script, this module is a sender process:

    python -m tests.apps.early_app send URL ID MESSAGE            (before_start=True)
    python -m tests.apps.early_app engine_start_or_send URL ID MESSAGE
    python -m tests.apps.early_app client_start_or_send URL ID MESSAGE GO_AT

each SIGKILLed where DURABLE_CRASH_POINTS says (after_keep_early_message,
after_start_or_send); GO_AT is the time.time() at which to send (callers at once).
"""

from __future__ import annotations

import sys
import time

import durable
from tests.apps.counter_app import World, setup

registry = durable.Registry()

__all__ = ["receiver", "registry", "setup"]


@durable.step(registry=registry, name="early.note")
def note(workflow_id: str, what: str) -> None:
    World.record(workflow_id, what)


@durable.workflow(registry=registry, name="early.receiver")
def receiver(n: int) -> list[str]:
    got = []
    for _ in range(n):
        message = durable.recv("orders", timeout=120)
        note(durable.workflow_id(), f"got {message}")
        got.append(message)
    return got


def main(argv: list[str]) -> None:
    command, url, workflow_id, message = argv[:4]
    if command == "send":
        with durable.Client(url) as client:
            client.send(workflow_id, message, topic="orders", before_start=True)
    elif command == "engine_start_or_send":
        with durable.Engine(url, registry=registry, lease_seconds=1.0) as engine:
            engine.start_or_send(
                receiver, 2, workflow_id=workflow_id, message=message, topic="orders"
            )
            time.sleep(60)  # (killed after the commit: never gets here)
    elif command == "client_start_or_send":
        with durable.Client(url) as client:
            time.sleep(max(0.0, float(argv[4]) - time.time()))
            client.start_or_send(
                receiver, 2, workflow_id=workflow_id, message=message, topic="orders"
            )
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
