"""Log lines a person or a log shipper can use: one per event, with its fields.

durable logs through the standard `logging` module under `durable.*`. Events that matter
to an operator (a claim, a recovery after an expired lease, a failed workflow, a
nondeterminism error, a wait at a gate, a worker giving up) carry `extra` fields:
`event`, `workflow_id` and what else applies. Routine steps log nothing at INFO.
`durable worker --log-format json` prints each record as one JSON object per line; the
text format escapes control characters in what it prints (ids, names and errors are
stored text: see durable._base.terminal), keeping the line breaks of a traceback.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from durable._base.terminal import inert

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, with control characters other than line breaks
    escaped: a workflow id holding ESC]0; must not retitle the terminal of whoever tails
    the worker's log."""

    def format(self, record: logging.LogRecord) -> str:
        return inert(super().format(record), keep_newlines=True)


def configure(level: str, fmt: str) -> None:
    """Set up the root logger for a `durable` command (text or JSON lines on stderr)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
