"""What the command line shows of a stored failure and of stored values.

A failure is stored with its traceback (durable/_core/journal.py, encode_error). Most of
its frames are durable's own (the driver, the step wrapper, the protocol), which say
nothing about what went wrong; `fold` puts the user's frames first in each traceback of
the chain and folds durable's into one line ("… 7 frames in durable …"). Stored values
(inputs, outputs, results) are text written by a serializer; `json_value` decodes the JSON
ones so that `--json` carries them as JSON values, not strings to decode again.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from durable.serialization import JSONSerializer

_FRAME = re.compile(r'^  File "(?P<path>.+)", line \d+, in .+$')
# The entries of the durable package (subpackages and modules): a frame whose file lies
# under a `durable` directory and then one of these is durable's own, wherever the
# worker that stored it had the package installed.
_OWN = frozenset(
    p.stem if p.suffix == ".py" else p.name
    for p in Path(__file__).resolve().parent.parent.iterdir()
    if p.suffix == ".py" or (p.is_dir() and not p.name.startswith("__"))
)


def durable_frame(path: str) -> bool:
    """Whether a traceback frame's file is durable's own code."""
    parts = re.split(r"[\\/]", path)
    for i in range(len(parts) - 1):
        if parts[i] == "durable":
            entry = parts[i + 1]
            if entry.removesuffix(".py") in _OWN:
                return True
    return False


def fold(trace: str) -> list[str]:
    """The lines of a stored traceback with, in each traceback of the chain, the user's
    frames first (in call order) and durable's frames folded into one line after them."""
    out: list[str] = []
    mine: list[str] = []
    own = 0
    frame: list[str] | None = None

    def flush() -> None:
        nonlocal own
        out.extend(mine)
        mine.clear()
        if own:
            out.append(f"  … {own} frame{'s' if own > 1 else ''} in durable …")
        own = 0

    for line in trace.rstrip("\n").split("\n"):
        match = _FRAME.match(line)
        if match:
            if durable_frame(match["path"]):
                own += 1
                frame = None
            else:
                frame = mine
                mine.append(line)
            continue
        if line.startswith("    ") or line.startswith("  [Previous line repeated"):
            if frame is not None:
                frame.append(line)
            continue
        frame = None
        flush()
        out.append(line)
    flush()
    return out


_JSON = JSONSerializer()


def json_value(text: str | None, serializer: str = "json") -> Any:
    """A stored value as a JSON value: decoded when it was written by the JSON serializer
    (tagged values such as datetimes come back as their text), else the stored text."""
    if text is None or serializer != "json":
        return text
    try:
        return _JSON.loads(text)
    except (ValueError, TypeError):
        return text
