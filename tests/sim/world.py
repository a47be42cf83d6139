"""The outside world of the simulation: a vendor that records every call it receives.

The vendor is what a payment provider and a model API look like from a workflow: `pay`
moves money under an idempotency key and, like most providers, does NOT deduplicate keys
(each call charges: the effect ledger must make sure it is called once, or asked with
`lookup` after a crash); `refund` undoes a payment; `model` is a metered call whose price
counts against the run's budget. Every call is kept, so the invariants judge what happened
in the world, not what durable says happened.

A call from a thread of a process that the simulation has killed never arrives (a dead
process runs no code): `faults.process_of_run()` tells whose workflow code is calling.
Calls may also be held at a gate while the simulation acts (a paused process).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from durable._run.context import current_run
from tests.apps.model_stub import usage_of
from tests.sim import faults


@dataclass
class Vendor:
    payments: Counter[str] = field(default_factory=Counter)  # key -> times charged
    amounts: dict[str, int] = field(default_factory=dict)  # key -> cents
    refunds: Counter[str] = field(default_factory=Counter)  # refund key -> times refunded
    paid_tags: dict[str, str] = field(default_factory=dict)  # payment key -> instruction tag
    refund_tags: dict[str, str] = field(default_factory=dict)  # refund key -> instruction tag
    models: list[tuple[str, Decimal]] = field(default_factory=list)  # (workflow id, dollars)
    touches: Counter[str] = field(default_factory=Counter)  # plain steps run, by tag
    received: Counter[str] = field(default_factory=Counter)  # message payloads consumed
    lock: threading.Lock = field(default_factory=threading.Lock)

    # Every call of a plain step, a model or an llm request: (kind, tag, process name).
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    # Every call that does something (a payment, a refund, a model or llm request, a plain
    # step, a message consumed), in order: (kind, workflow id, process name).
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def _reachable(self, kind: str = "", tag: str = "") -> None:
        proc = faults.process_of_run()
        if proc is not None:
            proc.alive()
        if kind:
            run = current_run.get()
            wid = run.workflow_id if run is not None else "?"
            with self.lock:
                self.calls.append((kind, f"{wid}|{tag}", proc.name if proc is not None else "?"))

    def _event(self, kind: str) -> None:
        proc = faults.process_of_run()
        run = current_run.get()
        with self.lock:
            self.events.append(
                (
                    kind,
                    run.workflow_id if run is not None else "?",
                    proc.name if proc is not None else "?",
                )
            )

    def snapshot(self) -> tuple[int, ...]:
        """How many calls of each kind the vendor has had (a replay must add none)."""
        with self.lock:
            return (sum(self.payments.values()), sum(self.refunds.values()), len(self.calls))

    def pay(self, key: str, tag: str, cents: int) -> str:
        self._reachable()
        self._event("pay")
        with self.lock:
            self.payments[key] += 1
            self.amounts[key] = cents
            self.paid_tags[key] = tag
        return f"ch_{key}"

    def lookup(self, key: str) -> str | None:
        self._reachable()
        with self.lock:
            return f"ch_{key}" if self.payments[key] else None

    def refund(self, key: str, tag: str) -> str:
        self._reachable()
        self._event("refund")
        with self.lock:
            self.refunds[key] += 1
            self.refund_tags[key] = tag
        return f"re_{key}"

    def refunded(self, key: str) -> str | None:
        self._reachable()
        with self.lock:
            return f"re_{key}" if self.refunds[key] else None

    def model(self, tag: str, dollars: Decimal) -> None:
        self._reachable("model", tag)
        self._event("model")
        run = current_run.get()
        with self.lock:
            self.models.append((run.workflow_id if run is not None else "?", dollars))

    def llm(self, tag: str) -> None:
        self._reachable("llm", tag)
        self._event("llm")
        tokens_in, tokens_out = usage_of(tag)
        run = current_run.get()
        dollars = Decimal(tokens_in + tokens_out) / Decimal(1000)  # PRICES: $1000 per million
        with self.lock:
            self.models.append((run.workflow_id if run is not None else "?", dollars))

    def touch(self, tag: str) -> None:
        self._reachable("touch", tag)
        self._event("touch")
        with self.lock:
            self.touches[tag] += 1

    def receive(self, payload: str) -> None:
        self._reachable()
        self._event("receive")
        with self.lock:
            self.received[payload] += 1
