"""The stored form of a workflow call: its inputs, checked and encoded, read back as the
run sees them, and the row that records a new workflow.

Recording a workflow is shared by everything that makes one (a client's submit and
enqueue, an engine's start, a schedule's tick, the runner's direct calls): the inputs are
bound to the function's signature and must read back as given before anything is stored,
and a child started inside a workflow takes the next position of its parent's journal
(start_placed: the one way every start from workflow code is stored and journaled).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from durable._base import labels
from durable._base.models import WorkflowInfo
from durable._base.registry import Registry, WorkflowDef
from durable._run import tracing
from durable._run.attributes import attributes_for
from durable._run.context import current_run
from durable._run.methods import STORED_KEY, reference, resolve
from durable._run.timeouts import timeout_for
from durable.errors import (
    PayloadTooLargeError,
    SerializationError,
    WorkflowArgumentsError,
    WorkflowConflictError,
)
from durable.serialization import (
    JSONSerializer,
    PickleSerializer,
    Serializer,
    check_faithful,
    dumps_checked,
    parameter_types,
    rebuild,
)

T = TypeVar("T")


class Inputs:
    """Encodes and decodes the inputs of workflow calls with one serializer and payload
    limit (a Client's or an Engine's)."""

    def __init__(self, serializer: Serializer, max_payload_bytes: int) -> None:
        self.serializer = serializer
        self.max_payload_bytes = max_payload_bytes
        # Stored with each workflow: a reader knows what wrote its values.
        self.serializer_name = (
            "pickle"
            if isinstance(serializer, PickleSerializer)
            else ("json" if isinstance(serializer, JSONSerializer) else type(serializer).__name__)
        )

    def encode(self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The stored form of a call's arguments. The call is bound to the function's
        signature first (WorkflowArgumentsError), and each argument must read back as it
        was given (SerializationError), so nothing unusable is ever stored. A method's
        receiver is stored by name (see _methods), not as an argument."""
        receiver = reference(defn, args)
        signature, hints = parameter_types(defn.fn)
        if signature is not None:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise WorkflowArgumentsError(defn.name, str(signature), str(exc)) from None
            for position, (name, value) in enumerate(bound.arguments.items()):
                if receiver is not None and position == 0:
                    continue
                kind = signature.parameters[name].kind
                label = f"argument {name!r} of workflow {defn.name!r}"
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    for item in value:
                        check_faithful(self.serializer, item, None, label)
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    for item in value.values():
                        check_faithful(self.serializer, item, None, label)
                else:
                    check_faithful(self.serializer, value, hints.get(name), label)
        if receiver is not None:
            args = args[1:]
        stored: dict[str, Any] = {"args": list(args), "kwargs": dict(kwargs)}
        if receiver is not None:
            stored[STORED_KEY] = receiver
        try:
            return dumps_checked(
                self.serializer,
                stored,
                f"the inputs of workflow {defn.name!r}",
                self.max_payload_bytes,
            )
        except PayloadTooLargeError:
            raise
        except SerializationError:
            # Name the argument that failed, so the message points at the caller's mistake.
            labelled = [(f"argument {i}", v) for i, v in enumerate(args)]
            labelled += [(f"argument {k!r}", v) for k, v in kwargs.items()]
            for label, value in labelled:
                dumps_checked(
                    self.serializer,
                    value,
                    f"{label} of workflow {defn.name!r} (the inputs of workflow {defn.name!r})",
                    self.max_payload_bytes,
                )
            raise

    def receiver(self, text: str) -> Any:
        """The receiver a stored call records (a method's class and instance name, a
        classmethod's class), or None: what tells two calls of one method apart."""
        try:
            data = self.serializer.loads(text)
        except Exception:
            return None
        return data.get(STORED_KEY) if isinstance(data, dict) else None

    def check_receiver(self, info: WorkflowInfo, defn: WorkflowDef, inputs: str) -> None:
        """WorkflowConflictError when the stored workflow `info` is `defn` called on another
        instance (or class) than these inputs name: its result is not this call's."""
        held, asked = self.receiver(info.inputs), self.receiver(inputs)
        if held != asked:
            raise WorkflowConflictError(
                info.workflow_id, _on(info.name, held), _on(defn.name, asked)
            )

    def decode(
        self, text: str, defn: WorkflowDef | None = None, registry: Registry | None = None
    ) -> tuple[list[Any], dict[str, Any]]:
        """Stored inputs as the run sees them, first run and replay alike (rebuilt as the
        parameters' annotations when pydantic is installed). A method's receiver comes
        first: the instance (or class) `registry` holds under the stored name."""
        data = self.serializer.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("args"), list):
            raise SerializationError(
                "the stored inputs are not {'args': [...], 'kwargs': {...}}: they were not "
                "written by this serializer",
                what="the stored inputs",
                type_name=type(data).__qualname__,
            )
        args, kwargs = list(data["args"]), dict(data.get("kwargs") or {})
        if defn is None:
            return args, kwargs
        if isinstance(data.get(STORED_KEY), dict) and registry is not None:
            args.insert(0, resolve(defn, data[STORED_KEY], registry))
        signature, hints = parameter_types(defn.fn)
        if signature is None or not hints:
            return args, kwargs
        positional = _positional(defn.fn)
        if not kwargs and positional is not None and positional[1] <= len(args):
            names = positional[0]
            if len(args) <= len(names):
                # Stored by position, as a call binds them: each is its parameter's, so
                # no binding is needed to know which annotation rebuilds it.
                for i, value in enumerate(args):
                    if names[i] in hints:
                        args[i] = rebuild(value, hints[names[i]])
                return args, kwargs
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs  # the run reports the mismatch as the workflow's error
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if name in hints and kind not in (
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            ):
                bound.arguments[name] = rebuild(value, hints[name])
        return list(bound.args), dict(bound.kwargs)

    def row(
        self,
        defn: WorkflowDef,
        workflow_id: str,
        inputs: str,
        parent: tuple[str, int] | None,
        durability: str,
    ) -> dict[str, Any]:
        return {
            "workflow_id": workflow_id,
            "name": defn.name,
            "version": defn.version,
            "inputs": inputs,
            "serializer": self.serializer_name,
            "durability": defn.durability or durability,
            "parent_id": parent[0] if parent else None,
            "parent_step_seq": parent[1] if parent else None,
            # The decorator's, or the start's own (timeout=, durable.workflow_timeout);
            # a child's is cut to its parent's time left.
            "timeout_seconds": timeout_for(defn.timeout, parent),
            "budget_id": _budget_for(defn, workflow_id, parent),
            "trace_context": tracing.start_context(defn.name, workflow_id),
            # The journal format this code writes (and the newest it reads).
            "journal_version": labels.JOURNAL_VERSION,
            # Stored with it, so every claim honours it, whatever that worker's engine says.
            "max_recovery_attempts": defn.max_recovery_attempts,
            # The start's (attributes=, durable.workflow_attributes), as JSON text.
            "attributes": attributes_for(),
        }


def _budget_for(defn: WorkflowDef, workflow_id: str, parent: tuple[str, int] | None) -> str | None:
    """The budget a new workflow draws from: its parent's if the parent has one (a child
    spends from its root's ledger), else its own if its code declares one."""
    if parent is not None:
        run = current_run.get()
        if run is not None and run.workflow_id == parent[0] and run.budget_id is not None:
            return run.budget_id
    return workflow_id if defn.budget is not None else None


def _on(name: str, receiver: Any) -> str:
    """A method workflow's name with the instance (or class) it was called on."""
    if not isinstance(receiver, dict):
        return name
    if "instance" in receiver:
        return f"{name} on instance {receiver['instance']!r} of {receiver.get('class')}"
    return f"{name} on class {receiver.get('class')}"


@functools.lru_cache(maxsize=4096)
def _positional(fn: Any) -> tuple[tuple[str, ...], int] | None:
    """The names of `fn`'s positional parameters and how many are required, when arguments
    given by position alone bind to them one for one (no keyword-only parameter is
    required); None otherwise (Inputs.decode binds them)."""
    signature, _ = parameter_types(fn)
    if signature is None:
        return None
    names: list[str] = []
    required = 0
    empty = inspect.Parameter.empty
    for name, param in signature.parameters.items():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            names.append(name)
            if param.default is empty:
                required = len(names)
        elif param.kind is param.KEYWORD_ONLY and param.default is empty:
            return None
    return tuple(names), required
