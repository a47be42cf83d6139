"""A trigger: a workflow run once per message of a source, and how a message names its run.

`@on_message(source)` above `@durable.workflow` registers a Trigger; a worker (`durable
worker`, or an engine's `run_worker`) consumes its source. Each message's key (its id,
or a header or JSON field the trigger names) becomes the workflow id
`trigger:<name>:<key>`, so a message delivered twice records one workflow.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from durable._base import labels
from durable._base.names import check_name
from durable._base.registry import Registry, WorkflowDef, default_registry
from durable._run.decorators import workflow_def
from durable.errors import DefinitionError
from durable.triggers._source import Message, Source

F = TypeVar("F", bound=Callable[..., Any])

Key = Callable[[Message], "str | None"]
"""What names a message's run: its key, or None when it has none (the message is then
rejected: a message with no key could not be told from its redelivery)."""

Decode = Callable[[Message], Any]
"""The workflow's argument made of a message (a JSON value). Raising rejects the message."""


def message_id(message: Message) -> str | None:
    """The broker's id of the message (the default key)."""
    return message.id


def header(name: str) -> Key:
    """The key is the message's header `name` (compared as given, then case-blind)."""
    check_name("header", name)

    def key(message: Message) -> str | None:
        if name in message.headers:
            return message.headers[name]
        lowered = name.lower()
        return next((v for k, v in message.headers.items() if k.lower() == lowered), None)

    return key


def field(path: str) -> Key:
    """The key is a field of the JSON body; `a.b` reads a nested field. A number is
    written as JSON writes it."""
    check_name("field", path)
    parts = path.split(".")

    def key(message: Message) -> str | None:
        value: Any = json.loads(message.body)
        for part in parts:
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        if value is None or isinstance(value, (dict, list)):
            return None
        return value if isinstance(value, str) else json.dumps(value)

    return key


def body_hash(message: Message) -> str:
    """The key is the SHA-256 of the body: two messages with the same body are one run
    (for publishers that set no id; say so by choosing it)."""
    return hashlib.sha256(message.body).hexdigest()


def json_body(message: Message) -> Any:
    """The default decode: the body read as JSON (UTF-8)."""
    return json.loads(message.body)


def text_body(message: Message) -> str:
    """The body as UTF-8 text."""
    return message.body.decode("utf-8")


@dataclass(frozen=True, eq=False)
class Trigger:
    """A workflow run once per message of `source` (see `on_message`)."""

    name: str
    source: Source
    workflow: WorkflowDef
    fn: Callable[..., Any]
    key: Key = message_id
    decode: Decode = json_body

    def workflow_id(self, key: str) -> str:
        return labels.trigger_message_id(self.name, key)


def on_message(
    source: Source,
    *,
    name: str | None = None,
    key: Key = message_id,
    decode: Decode = json_body,
    registry: Registry | None = None,
) -> Callable[[F], F]:
    """Run the workflow below once per message of `source`, called with the decoded body.

    Put it above @durable.workflow. Workers (`durable worker`, `Engine.run_worker`,
    `Engine(worker=True)`) consume every registered trigger: each message's row is committed
    (PENDING, for any worker) before the message is acknowledged, under the workflow id
    `trigger:<name>:<key>`, so a message delivered again after a crash starts nothing new.

    name: the trigger's name (default: the workflow's name), the prefix of its ids.
    key: what names a message's run (default: its broker id; `header("X-Id")`,
      `field("order.id")` or `body_hash` name another; any `Message -> str | None`).
    decode: the workflow's argument made of the message (default: the body as JSON).
    A message that cannot be decoded or has no key is rejected (dead-lettered where the
    source has a dead-letter place, else dropped) and logged; it never stops the consumer.
    """
    if not isinstance(source, Source):
        raise DefinitionError(
            f"on_message: {source!r} is not a message source: give a "
            "durable.triggers.RabbitMQ(...), NatsJetStream(...) or a Source subclass"
        )
    if not callable(key) or not callable(decode):
        raise DefinitionError("on_message: key= and decode= take a function of a Message")
    check_name("trigger name", name, optional=True)

    def decorate(fn: F) -> F:
        defn = workflow_def(fn)
        try:
            inspect.signature(fn).bind(None)
        except (TypeError, ValueError):
            # Else every message would be rejected for a mistake of the code, not its own.
            raise DefinitionError(
                f"on_message: workflow {defn.name!r} is called with one argument, the "
                "decoded message: give it exactly one required parameter"
            ) from None
        trigger = Trigger(name or defn.name, source, defn, fn, key, decode)
        (registry if registry is not None else default_registry).add_trigger(trigger)
        return fn

    return decorate
