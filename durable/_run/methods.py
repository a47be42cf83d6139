"""Methods as workflows and steps: named instances, and what a stored call records of them.

A workflow's inputs are stored so that a fresh process can call it again. An instance
cannot be stored, so an object whose methods are workflows derives from `Instance` and is
registered under a name (DBOS's configured instances): the stored call records that name,
and a recovery calls the method on the instance registered under it in its own process.
A classmethod's class is recorded by its qualified name; a staticmethod is a plain function.

Whether the first argument of a decorated function is a receiver is decided per call, from
the class dict of that argument: `@staticmethod` and `@classmethod` may sit above or below
the durable decorator, and a decorator below them cannot see them. A function defined
outside any class body never pays for the check. A classmethod workflow's class, once a
call found it, is noted on its function, for a run in this process to find it again even
where its module cannot name it (a class defined in a function).
"""

from __future__ import annotations

import copy
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

from durable._base.models import StepKind
from durable._base.registry import Registry, StepDef, WorkflowDef, default_registry
from durable.errors import DefinitionError, UnknownInstanceError

Receiver = Literal["method", "classmethod"]

# The key of a stored call that records its receiver (absent for plain functions).
STORED_KEY = "receiver"


class Instance:
    """Base class of objects whose methods are workflows: each is registered by name.

    `super().__init__(instance_name)` registers the object in `registry` (the default
    registry unless given; the engine's registry is where recovery looks). A workflow
    called on it stores the class's qualified name and the instance's name instead of the
    object, so recovery in a fresh process calls the method on the instance registered
    there under that name: create every instance when the program starts, before the
    engine or worker does, with the same names in every process. Two instances of a class
    cannot share a name (DuplicateNameError)."""

    instance_name: str

    def __init__(self, instance_name: str, *, registry: Registry | None = None) -> None:
        if not isinstance(instance_name, str) or not instance_name:
            raise DefinitionError(
                f"instance_name={instance_name!r}: give each instance a non-empty name, the "
                "same in every process (recovery finds the instance by it)"
            )
        reg = registry if registry is not None else default_registry
        reg.add_instance(type(self).__qualname__, instance_name, self)
        self.instance_name = instance_name


Rewrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def unwrap(obj: Any) -> tuple[Any, Rewrap, Receiver | None]:
    """A decorated object as (function, rewrap, receiver): a staticmethod or classmethod
    below the durable decorator is unwrapped and wrapped again around the result; a function
    defined in a class body may be a method (decided per call, see `receiver_of`)."""
    if isinstance(obj, staticmethod):
        return obj.__func__, cast(Rewrap, staticmethod), None
    if isinstance(obj, classmethod):
        # (A classmethod object is not callable: it is what the class body needs.)
        return obj.__func__, cast(Rewrap, classmethod), "classmethod"
    parts = getattr(obj, "__qualname__", "").split(".")
    in_class = len(parts) > 1 and parts[-2] != "<locals>"
    return obj, _same, "method" if in_class else None


def _same(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    return wrapper


def receiver_of(defn: WorkflowDef | StepDef, args: Sequence[Any]) -> Receiver | None:
    """Whether `args[0]` of this call is the method's receiver: an instance whose class (or
    a base) holds the decorated function itself, or a class that holds it as a classmethod.
    Otherwise (a staticmethod above the decorator, a plain function) nothing is bound."""
    if defn.receiver is None or not args:
        return None
    first, fn = args[0], defn.fn
    if defn.receiver == "method":
        for klass in type(first).__mro__:
            if getattr(klass.__dict__.get(fn.__name__), "__wrapped__", None) is fn:
                return "method"
    if isinstance(first, type):
        for klass in first.__mro__:
            raw = klass.__dict__.get(fn.__name__)
            if isinstance(raw, classmethod) and getattr(raw.__func__, "__wrapped__", None) is fn:
                # Where a recovery in this process looks for the class first (a class
                # defined in a function cannot be found through its module).
                fn.__durable_owner__ = klass
                return "classmethod"
    return None


def bind(defn: StepDef, args: Sequence[Any]) -> tuple[StepDef, Sequence[Any]]:
    """A step, tool or transaction called on a receiver, as a definition of the bound method
    and the other arguments: a transaction's connection then follows `self`, and a tool's
    recorded arguments leave the receiver out. An effect method is refused (DefinitionError)."""
    if receiver_of(defn, args) is None:
        return defn, args
    if defn.kind is StepKind.EFFECT:
        raise DefinitionError(
            f"effect {defn.name!r} was called as a method: an effect's key, reconcile and "
            "compensation take the call's arguments, which cannot hold an object; make it "
            "a module-level function or a @staticmethod and pass what it needs"
        )
    bound = copy.copy(defn)  # (dataclasses.replace costs ten times as much, per call)
    object.__setattr__(bound, "fn", types.MethodType(defn.fn, args[0]))
    return bound, args[1:]


Entry = Callable[[Any, Sequence[Any], Any], Any]


def bound_entries(sync_entry: Entry, async_entry: Entry) -> tuple[Entry, Entry]:
    """The driver entry points of a step defined in a class body, binding its receiver."""

    def sync_bound(defn: StepDef, args: Sequence[Any], kwargs: Any) -> Any:
        return sync_entry(*bind(defn, args), kwargs)

    def async_bound(defn: StepDef, args: Sequence[Any], kwargs: Any) -> Any:
        return async_entry(*bind(defn, args), kwargs)

    return sync_bound, async_bound


def reference(defn: WorkflowDef, args: Sequence[Any]) -> dict[str, str] | None:
    """What a stored call records of its receiver, or None if it has none. An instance
    must be registered (UnknownInstanceError otherwise): nothing else could find it again."""
    kind = receiver_of(defn, args)
    if kind is None:
        return None
    first = args[0]
    if kind == "classmethod":
        return {"class": first.__qualname__}
    name = getattr(first, "instance_name", None) if isinstance(first, Instance) else None
    if not isinstance(name, str):
        raise UnknownInstanceError(
            type(first).__qualname__,
            None,
            f"workflow {defn.name!r} is a method of an object that is not registered by "
            "name, so a recovery could not find it: derive its class from durable.Instance "
            "and call super().__init__(instance_name) in its __init__",
        )
    return {"class": type(first).__qualname__, "instance": name}


def resolve(defn: WorkflowDef, ref: dict[str, str], registry: Registry) -> Any:
    """The receiver a stored reference names, in this process: the instance registered
    under its name, or the class (the method's own or a subclass); UnknownInstanceError."""
    class_name = ref.get("class", "")
    if "instance" in ref:
        instance = registry.get_instance(class_name, ref["instance"])
        if instance is None:
            raise UnknownInstanceError(class_name, ref["instance"])
        return instance
    owner = _owner(defn.fn)
    pending = [owner] if owner is not None else []
    while pending:
        klass = pending.pop()
        if klass.__qualname__ == class_name:
            return klass
        pending.extend(klass.__subclasses__())
    raise UnknownInstanceError(
        class_name,
        None,
        f"workflow {defn.name!r} was called on class {class_name!r}, which is not loaded "
        "in this process (nor a subclass of the method's class): import its module",
    )


def _owner(fn: Callable[..., Any]) -> type | None:
    """The class whose body defined `fn`: as a call in this process found it, else through
    its module (None for a class defined inside a function and not called yet)."""
    owner = getattr(fn, "__durable_owner__", None)
    if isinstance(owner, type):
        return owner
    found: Any = sys.modules.get(fn.__module__)
    for part in fn.__qualname__.split(".")[:-1]:
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None
