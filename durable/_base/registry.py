"""The explicit registry that decorators fill and engines read.

A registry maps names to definitions. It is the only mutable state durable keeps outside
an engine; `default_registry` exists so that plain `@durable.workflow()` works, and code
that wants isolation (tests, plugins) passes its own `Registry` to decorators and engines.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from durable._base.models import Budget, RetryPolicy, StepKind
from durable.errors import DuplicateNameError

Durability = Literal["sync", "async", "exit"]


@dataclass(frozen=True)
class WorkflowDef:
    """A registered workflow: its stored name, optional version and the function."""

    name: str
    fn: Callable[..., Any]
    version: str | None = None
    durability: Durability | None = None
    # Seconds from the first start after which the workflow is cancelled (None: never).
    timeout: float | None = None
    # Limits of the workflow tree's budget ledger, or None.
    budget: Budget | None = None
    # Crashes of its worker it survives; None: the engine's max_recovery_attempts.
    max_recovery_attempts: int | None = None
    # Defined in a class body ("method": maybe a method, decided per call by _methods) or
    # a classmethod below the decorator; None for a plain function or a staticmethod.
    receiver: Literal["method", "classmethod"] | None = None

    @property
    def is_async(self) -> bool:
        """An `async def` workflow: it runs on an event loop, under the async driver."""
        return inspect.iscoroutinefunction(self.fn)


@dataclass(frozen=True)
class StepDef:
    """A registered step: its journaled name, its kind and how it is retried."""

    name: str
    fn: Callable[..., Any]
    kind: StepKind = StepKind.STEP
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    isolation_level: str | None = None
    effect: EffectOptions | None = None
    # Seconds an attempt may run before it is cancelled (async) or given up (def).
    timeout: float | None = None
    # Seconds an attempt may go without durable.heartbeat() before it is given up.
    heartbeat_timeout: float | None = None
    # As WorkflowDef.receiver: whether a call's first argument may be bound as `self`.
    receiver: Literal["method", "classmethod"] | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


@dataclass(frozen=True)
class EffectOptions:
    """What makes an effect safe to resume.

    reconcile: asks the outside world what happened to a key; returns the recorded result,
        or None if the call never landed (then it is called again with the same key).
    idempotent: the outside world deduplicates keys, so calling again with the same key is
        safe (needed when there is no reconcile function).
    key: optional function of the call's arguments giving the user part of the key; the key
        is then <workflow_id>:<user part> instead of <workflow_id>:<step position>.
    """

    reconcile: Callable[..., Any] | None = None
    idempotent: bool = False
    key: Callable[..., str] | None = None
    requires_approval: bool = False


class Registry:
    """Workflows and steps by name, and the named instances whose methods are workflows
    (durable.Instance). Registering a taken name raises DuplicateNameError."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workflows: dict[tuple[str, str | None], WorkflowDef] = {}
        self._steps: dict[str, StepDef] = {}
        self._compensations: dict[str, Callable[..., Any]] = {}
        self._schedules: dict[str, Any] = {}
        self._queues: dict[str, Any] = {}
        self._triggers: dict[str, Any] = {}
        self._instances: dict[tuple[str, str], object] = {}

    def add_workflow(self, defn: WorkflowDef) -> None:
        with self._lock:
            key = (defn.name, defn.version)
            if key in self._workflows and self._workflows[key].fn is not defn.fn:
                label = defn.name if defn.version is None else f"{defn.name}@{defn.version}"
                raise DuplicateNameError("workflow", label)
            self._workflows[key] = defn

    def add_step(self, defn: StepDef) -> None:
        with self._lock:
            existing = self._steps.get(defn.name)
            if existing is not None and existing.fn is not defn.fn:
                raise DuplicateNameError("step", defn.name)
            self._steps[defn.name] = defn

    def set_compensation(self, effect_name: str, undo: Callable[..., Any]) -> None:
        with self._lock:
            if effect_name in self._compensations and self._compensations[effect_name] is not undo:
                raise DuplicateNameError("compensation for effect", effect_name)
            self._compensations[effect_name] = undo

    def compensation(self, effect_name: str) -> Callable[..., Any] | None:
        return self._compensations.get(effect_name)

    def get_workflow(self, name: str, version: str | None = None) -> WorkflowDef | None:
        return self._workflows.get((name, version))

    def workflows(self) -> list[WorkflowDef]:
        return list(self._workflows.values())

    def workflow_names(self) -> list[str]:
        return sorted({name for name, _ in self._workflows})

    def add_schedule(self, schedule: Any) -> None:
        """Register a durable.scheduled() schedule (a _schedules.Schedule)."""
        with self._lock:
            existing = self._schedules.get(schedule.name)
            if existing is not None and existing != schedule:
                raise DuplicateNameError("schedule", schedule.name)
            self._schedules[schedule.name] = schedule

    def schedules(self) -> list[Any]:
        return list(self._schedules.values())

    def add_trigger(self, trigger: Any) -> None:
        """Register a durable.triggers.on_message trigger; names are unique."""
        with self._lock:
            existing = self._triggers.get(trigger.name)
            if existing is not None and existing is not trigger:
                raise DuplicateNameError("trigger", trigger.name)
            self._triggers[trigger.name] = trigger

    def triggers(self) -> list[Any]:
        return list(self._triggers.values())

    def add_queue(self, queue: Any) -> None:
        """Register a durable.Queue; two different queues may not share a name."""
        with self._lock:
            existing = self._queues.get(queue.name)
            if existing is not None and existing is not queue:
                raise DuplicateNameError("queue", queue.name)
            self._queues[queue.name] = queue

    def queues(self) -> list[Any]:
        return list(self._queues.values())

    def get_queue(self, name: str) -> Any | None:
        """The durable.Queue registered under `name`, if any."""
        return self._queues.get(name)

    def steps(self) -> list[StepDef]:
        return list(self._steps.values())

    def add_instance(self, class_name: str, name: str, instance: object) -> None:
        """Register a durable.Instance under (its class's qualified name, its name)."""
        with self._lock:
            existing = self._instances.get((class_name, name))
            if existing is not None and existing is not instance:
                raise DuplicateNameError(
                    f"instance of class {class_name}",
                    name,
                    "give each instance of a class its own instance_name (recovery finds "
                    "the instance by it), or register it in a separate durable.Registry()",
                )
            self._instances[(class_name, name)] = instance

    def get_instance(self, class_name: str, name: str) -> object | None:
        return self._instances.get((class_name, name))


default_registry = Registry()
