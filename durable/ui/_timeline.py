"""A workflow's steps laid out on a time axis, for the console's timeline: each journaled
call a bar from its start to its end (waits and children told apart, retries counted), the
wait in progress to now, and durations written for people (`0.32 ms`, `1.5 s`, `2 min 5 s`).

Only positions are computed here (in thousandths of the axis); the template draws them as
SVG rectangles, whose geometry is markup, not style, so the console's Content-Security-Policy
(no inline styles) holds."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from durable._base.models import StepKind, StepRecord, WorkflowInfo, WorkflowStatus

SCALE = 1000  # the axis is 0..SCALE wide
MIN_WIDTH = 3  # an instant still shows
WAITS = frozenset({StepKind.SLEEP, StepKind.RECV, StepKind.APPROVAL, StepKind.EVENT})


def human_duration(seconds: float | None) -> str:
    """A duration as a person writes it: three significant digits under a minute (`0.32 ms`,
    `12.5 ms`, `320 ms`, `1.25 s`, `42.1 s`), then minutes, hours and days."""
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    if seconds < 1:
        ms = seconds * 1000
        if ms < 0.01:
            return "0 ms" if ms == 0 else "<0.01 ms"
        return f"{_significant(ms)} ms"
    if seconds < 60:
        return f"{_significant(seconds)} s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s"


def _significant(value: float) -> str:
    """Three significant digits for 0.01 <= value < 1000, trailing zeros dropped."""
    decimals = 2 if value < 10 else 1 if value < 100 else 0
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def between(start: dt.datetime | None, end: dt.datetime | None) -> str:
    """The human duration from start to end, or "" when either is unknown."""
    if start is None or end is None:
        return ""
    return human_duration((end - start).total_seconds())


def _span(
    step: StepRecord, previous_end: dt.datetime, following: StepRecord | None
) -> tuple[dt.datetime | None, dt.datetime | None]:
    """When a journaled call began and ended. A step records both; a sleep is recorded when
    it starts, and lasts until the next call begins (or its wake-up time, while it still
    sleeps); a wait or child without a start is recorded when it ends, having begun when the
    call before it ended."""
    if step.started_at is not None:
        return step.started_at, step.finished_at or step.started_at
    if step.finished_at is None:
        return None, None
    if step.kind is StepKind.SLEEP:
        if following is not None:
            return step.finished_at, following.started_at or following.finished_at
        return step.finished_at, _wake_time(step.output) or step.finished_at
    if step.kind in WAITS or step.kind is StepKind.CHILD:
        return min(previous_end, step.finished_at), step.finished_at
    return step.finished_at, step.finished_at


def _wake_time(output: str | None) -> dt.datetime | None:
    """A sleep's wake-up time, as its journal row stores it (a JSON string, ISO 8601)."""
    try:
        value = json.loads(output or "")
        return dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Bar:
    """One row of the timeline."""

    label: str
    seq: int | None
    kind: str  # the journal kind, or "waiting" for the wait in progress
    css: str  # bar-step, bar-wait, bar-child, bar-failed, bar-waiting
    x: int
    width: int
    duration: str
    attempts: int
    child_id: str | None
    title: str


@dataclass(frozen=True)
class Timeline:
    """The bars, the axis' ticks (x, label) and the workflow's total duration."""

    bars: list[Bar]
    ticks: list[tuple[int, str]]
    total: str
    running: bool


def timeline(info: WorkflowInfo, steps: list[StepRecord], now: dt.datetime) -> Timeline:
    """The timeline of a workflow from its creation to its end (to now while it runs)."""
    start = info.created_at
    running = not info.status.is_terminal
    ends = [s.finished_at for s in steps if s.finished_at is not None]
    end = info.finished_at or (now if running else max(ends, default=start))
    end = max([end, *ends])
    span = max((end - start).total_seconds(), 1e-6)

    def at(moment: dt.datetime) -> int:
        return round(SCALE * max(0.0, (moment - start).total_seconds()) / span)

    bars: list[Bar] = []
    previous_end = start
    for i, step in enumerate(steps):
        began, finished = _span(step, previous_end, steps[i + 1] if i + 1 < len(steps) else None)
        previous_end = max(previous_end, step.finished_at or previous_end)
        if began is None or finished is None:
            continue
        x = min(at(began), SCALE - MIN_WIDTH)
        width = max(MIN_WIDTH, at(finished) - x)
        css = (
            "bar-failed"
            if step.error
            else "bar-child"
            if step.kind is StepKind.CHILD
            else "bar-wait"
            if step.kind in WAITS
            else "bar-step"
        )
        took = between(began, finished)
        retried = f", {step.attempts} attempts" if step.attempts > 1 else ""
        bars.append(
            Bar(
                label=step.step_name,
                seq=step.step_seq,
                kind=step.kind.value,
                css=css,
                x=x,
                width=min(width, SCALE - x),
                duration=took,
                attempts=step.attempts,
                child_id=step.child_workflow_id,
                title=f"#{step.step_seq} {step.step_name} ({step.kind.value}): {took}{retried}",
            )
        )
    if info.status is WorkflowStatus.SUSPENDED or (running and steps):
        since = max(ends, default=start)
        x = min(at(since), SCALE - MIN_WIDTH)
        what = "waiting" if info.status is WorkflowStatus.SUSPENDED else "running"
        took = between(since, end)
        bars.append(
            Bar(
                what,
                None,
                what,
                "bar-waiting",
                x,
                max(MIN_WIDTH, SCALE - x),
                took,
                1,
                None,
                f"{what} since the last journaled call: {took}",
            )
        )
    ticks = [(round(SCALE * i / 4), human_duration(span * i / 4)) for i in range(5)]
    return Timeline(bars, ticks, human_duration((end - start).total_seconds()), running)
