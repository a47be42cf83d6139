"""How the console writes stored values for people: JSON previews and pretty-printing,
stored errors, times in UTC, a schedule's next tick; the Jinja2 environment with them."""

from __future__ import annotations

import datetime as dt
import json
import zoneinfo
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from durable._client.schedules import next_tick
from durable._core import decode_error
from durable.ui._timeline import between, human_duration

PREVIEW = 120
HERE = Path(__file__).parent


def _short(value: Any, width: int = PREVIEW) -> str:
    text = "" if value is None else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _pretty(text: str | None) -> str:
    """Stored JSON, indented (or the text as stored if it is not JSON)."""
    if text is None:
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _error(text: str | None) -> str:
    if not text:
        return ""
    try:
        kind, message, trace = decode_error(text)
    except (ValueError, AttributeError):
        return text
    return f"{kind}: {message}" + (f"\n\n{trace}" if trace else "")


def _when(value: dt.datetime | None) -> str:
    return "" if value is None else value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _next_tick(row: dict[str, Any]) -> str:
    if row["paused"]:
        return ""
    try:
        return _when(next_tick(row["cron"], row["timezone"], dt.datetime.now(dt.UTC)))
    except (ValueError, KeyError, zoneinfo.ZoneInfoNotFoundError):
        return ""


def _templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.filters.update(
        short=_short, pretty=_pretty, error=_error, when=_when, seconds=human_duration
    )
    env.globals.update(duration=between)
    return env
