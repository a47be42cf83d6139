"""The options and value types the commands share: --database-url, --schema, --json,
--progress, durations, finite numbers and checked ids.

Declared once so that every command spells and checks them alike; a bad value is a usage
error (exit 2) before anything connects.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import click

from durable._base.names import check_name
from durable.errors import InvalidNameError

url_option = click.option(
    "--database-url",
    envvar="DURABLE_DATABASE_URL",
    default=None,
    help="System database URL (default: $DURABLE_DATABASE_URL, else the embedded server).",
)
schema_option = click.option("--schema", default="durable", show_default=True)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# The longest duration an option takes. A retention window is subtracted from now() in
# SQL, where a few thousand years already fall off the timestamp range, and a worker
# sleeps an interval through threading, which refuses waits past ~292 years: a century
# is "never" for every option here, and keeps each of them working.
_MAX_DURATION = dt.timedelta(days=36500)


class Duration(click.ParamType[dt.timedelta, Any]):
    """A duration such as 90d, 12h, 30m, 45s or plain seconds, from zero to 36500d."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dt.timedelta:
        if isinstance(value, dt.timedelta):
            return value
        text = str(value).strip().lower()
        unit = text[-1:] if text[-1:] in _UNITS else "s"
        number = text[:-1] if text[-1:] in _UNITS else text
        try:
            amount = float(number)
        except ValueError:
            self.fail(f"{value!r}: give a duration such as 7d, 12h, 30m or 45s", param, ctx)
        if math.isnan(amount):
            self.fail(f"{value!r}: give a duration such as 7d, 12h, 30m or 45s", param, ctx)
        if amount < 0:
            self.fail(f"{value!r}: a duration is zero or more", param, ctx)
        seconds = amount * _UNITS[unit]  # inf past the float range, refused just below
        if seconds > _MAX_DURATION.total_seconds():
            self.fail(f"{value!r}: a duration is at most {_MAX_DURATION.days}d", param, ctx)
        return dt.timedelta(seconds=seconds)


DURATION = Duration()


class _FiniteRange(click.FloatRange):
    """A finite number within a range. click's FloatRange lets NaN through (every
    comparison with it is false) and, without a maximum, infinity: a wait of either
    spins or never ends, and neither is an amount of money, so both are refused."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r}: give a finite number", param, ctx)
        return number


def _checked_name(what: str, value: str | None) -> str | None:
    """An id given on the command line, checked as the library checks ids (non-empty, at
    most 512 bytes, no NUL): a bad one is a usage error before anything starts."""
    if value is not None:
        try:
            check_name(what, value)
        except InvalidNameError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


_HOUR = 3600.0
_DAY = 86400.0
_BIGINT = 2**63 - 1  # PostgreSQL's bigint, where token counts are kept
_INTEGER = 2**31 - 1  # PostgreSQL's integer, where step counts are kept


progress_option = click.option(
    "--progress/--no-progress",
    default=None,
    help="Show progress on stderr (default: a bar when stderr is a terminal).",
)


def _attr_filter(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Any:
    """--attr expressions, checked as RunFilter.parse reads them (a usage error if not)."""
    from durable._run.filter import RunFilter
    from durable.errors import ConfigurationError

    try:
        RunFilter.parse(value)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


attr_option = click.option(
    "--attr",
    "attrs",
    multiple=True,
    callback=_attr_filter,
    metavar="EXPR",
    help="Only runs whose attributes match: key=value, or a range on a number or an ISO "
    "time: 'amount>=100', 'due<2026-02-01T00:00:00Z' (repeat: all must hold).",
)


class Moment(click.ParamType[dt.datetime, Any]):
    """A point in time: an ISO 8601 time (2026-03-01, 2026-03-01T12:00:00+02:00; one
    without a zone is UTC) or a duration ago (1h, 30m, 7d, as Duration reads them)."""

    name = "time"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dt.datetime:
        if isinstance(value, dt.datetime):
            return value
        text = str(value).strip()
        try:
            moment = dt.datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
        if text[-1:].lower() not in _UNITS:
            self.fail(
                f"{value!r}: give an ISO time (2026-03-01T12:00:00Z) or a duration ago "
                "such as 1h, 30m or 7d",
                param,
                ctx,
            )
        ago = DURATION.convert(text, param, ctx)
        return dt.datetime.now(dt.UTC) - ago


MOMENT = Moment()
