"""RunFilter: which workflow runs a list, a count or a bulk action is about.

One frozen value, built in code (`RunFilter(status="ERROR", attributes={"customer":
"c-1"})`) or from the text of the CLI and the console (`RunFilter.parse(["customer=c-1",
"amount>=100"], status=...)`). Every field narrows (AND); an empty filter matches every
run. It becomes bind parameters of the listing statements (list_workflows,
count_workflows), nothing else: no SQL is made from it. Attribute equality is answered
by the attributes' GIN index (`attributes @> {...}`); a range is a jsonpath whose values
are parameters, and a value of another type (a string where a number is asked) matches
no range.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable._base.models import WorkflowStatus
from durable._base.names import check_name, check_version
from durable._run.attributes import AttributeValue, check_key, stored_value
from durable.errors import ConfigurationError

RANGE_OPS = (">=", "<=", ">", "<")
_EXPRESSION = re.compile(r"^\s*([^<>=!\s][^<>=!]*?)\s*(>=|<=|>|<|=)\s*(.*?)\s*$", re.S)


@dataclass(frozen=True)
class AttributeRange:
    """`attributes[key] <op> value`, op one of >, >=, <, <=; value a number or an aware
    datetime (a stored value of another type never matches)."""

    key: str
    op: str
    value: float | int | dt.datetime

    def __post_init__(self) -> None:
        check_key(self.key)
        if self.op not in RANGE_OPS:
            raise ConfigurationError(
                f"attribute range on {self.key!r}: op {self.op!r}: use one of >, >=, <, <="
            )
        value = self.value
        if isinstance(value, dt.datetime):
            stored_value(self.key, value)  # aware, or refused
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigurationError(
                f"attribute range {self.key}{self.op}{value!r}: compare with a number or an "
                "aware datetime"
            )
        elif not math.isfinite(value):
            raise ConfigurationError(f"attribute range on {self.key!r}: {value!r} is not finite")

    def __str__(self) -> str:
        value = self.value.isoformat() if isinstance(self.value, dt.datetime) else self.value
        return f"{self.key}{self.op}{value}"


def _statuses(status: object) -> tuple[WorkflowStatus, ...]:
    if status is None:
        return ()
    items = [status] if isinstance(status, str) else list(status)  # type: ignore[call-overload]
    out = []
    for item in items:
        try:
            out.append(WorkflowStatus(item))
        except ValueError:
            raise ConfigurationError(
                f"status={item!r}: use one of {', '.join(s.value for s in WorkflowStatus)}"
            ) from None
    return tuple(out)


@dataclass(frozen=True)
class RunFilter:
    """Which runs: every field given narrows the match (all must hold).

    status: one status or several (any of them); default any.
    name: the workflow's name. version: its version ("" for runs with none).
    attributes: {key: value} each equal (a datetime compares as its UTC ISO text).
    ranges: AttributeRange conditions on numbers and times.
    created_from / created_to: created in [from, to).
    parent_id: only the runs this workflow started; top_level: only runs no workflow started.
    id_prefix: ids starting with this text.
    """

    status: WorkflowStatus | str | tuple[WorkflowStatus | str, ...] | None = None
    name: str | None = None
    version: str | None = None
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    ranges: tuple[AttributeRange, ...] = ()
    created_from: dt.datetime | None = None
    created_to: dt.datetime | None = None
    parent_id: str | None = None
    top_level: bool = False
    id_prefix: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _statuses(self.status) or None)
        check_name("name", self.name, optional=True)
        check_name("parent_id", self.parent_id, optional=True)
        check_name("id_prefix", self.id_prefix, optional=True)
        if self.version:
            check_version("version", self.version)
        if not isinstance(self.attributes, Mapping):
            raise ConfigurationError("attributes: give a dict of the values to match")
        attrs = {check_key(k): stored_value(k, v) for k, v in self.attributes.items()}
        object.__setattr__(self, "attributes", attrs)
        ranges = tuple(self.ranges)
        for r in ranges:
            if not isinstance(r, AttributeRange):
                raise ConfigurationError(f"ranges: {r!r} is not a durable.AttributeRange")
        object.__setattr__(self, "ranges", ranges)

    def __hash__(self) -> int:
        return hash((self.status, self.name, self.version, tuple(sorted(self.attributes))))

    @classmethod
    def parse(cls, expressions: Iterable[str] = (), **fields: Any) -> RunFilter:
        """A filter from `key=value` (equal) and `key>=value`, `key<value`, ... (a range on
        a number or an ISO time; a time without a zone is UTC) expressions, plus `fields`.
        An equality value is read as JSON when it is a number, true, false, null or a
        quoted string, else taken as text (`customer=c-1`)."""
        attributes: dict[str, Any] = dict(fields.pop("attributes", None) or {})
        ranges = list(fields.pop("ranges", ()) or ())
        for expression in expressions:
            key, op, text = _split(expression)
            if op == "=":
                attributes[key] = _equal_value(text)
            else:
                ranges.append(AttributeRange(key, op, _range_value(key, op, text)))
        return cls(attributes=attributes, ranges=tuple(ranges), **fields)

    def expressions(self) -> list[str]:
        """The attribute conditions as parse() reads them back."""
        out = [
            f"{k}={v if isinstance(v, str) and _equal_value(v) == v else json.dumps(v)}"
            for k, v in sorted(self.attributes.items())
        ]
        return out + [str(r) for r in self.ranges]

    def params(self) -> dict[str, Any]:
        """The bind parameters of the RunFilter part of list_workflows / count_workflows."""
        path, variables = [], {}
        for i, r in enumerate(self.ranges):
            key = json.dumps(r.key)  # a jsonpath string literal: JSON's escapes
            if isinstance(r.value, dt.datetime):
                variables[f"v{i}"] = stored_value(r.key, r.value)
                path.append(f"$.{key}.datetime() {r.op} $v{i}.datetime()")
            else:
                variables[f"v{i}"] = r.value
                path.append(f"$.{key} {r.op} $v{i}")
        statuses = self.status
        assert statuses is None or isinstance(statuses, tuple)
        return {
            "statuses": None if not statuses else [s.value for s in statuses],  # type: ignore[union-attr]
            "version": self.version,
            "parent_id": self.parent_id,
            "attr_eq": json.dumps(self.attributes) if self.attributes else None,
            "attr_path": " && ".join(path) if path else None,
            "attr_vars": json.dumps(variables) if path else None,
        }

    def narrowed(self, statuses: Iterable[WorkflowStatus]) -> RunFilter | None:
        """This filter, its statuses cut to `statuses` (a bulk action's: the runs it can
        change); None when none is left (it matches no run the action changes)."""
        mine = self.status
        assert mine is None or isinstance(mine, tuple)
        kept = tuple(s for s in statuses if not mine or s in mine)
        return dataclasses.replace(self, status=kept) if kept else None


def _split(expression: str) -> tuple[str, str, str]:
    match = _EXPRESSION.match(expression) if isinstance(expression, str) else None
    if match is None:
        raise ConfigurationError(
            f"attribute filter {expression!r}: write key=value, or key>=value, key>value, "
            "key<=value, key<value (e.g. customer=c-1, amount>=100)"
        )
    return check_key(match.group(1)), match.group(2), match.group(3)


def _equal_value(text: str) -> Any:
    if text in ("true", "false", "null") or text.startswith('"'):
        try:
            return json.loads(text)
        except ValueError:
            return text
    try:
        number = json.loads(text)
    except ValueError:
        return text
    return number if isinstance(number, int | float) else text


def _range_value(key: str, op: str, text: str) -> float | int | dt.datetime:
    try:
        number = json.loads(text)
        if isinstance(number, int | float) and not isinstance(number, bool):
            return number
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigurationError(
            f"attribute filter {key}{op}{text}: compare with a number or an ISO time "
            "(e.g. amount>=100, due<2026-01-31T00:00:00Z)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
