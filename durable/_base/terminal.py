"""Stored text on a terminal: shown, never obeyed.

Ids, names, error messages, payloads and keys are written by workflows (and, through them,
by whoever sends a workflow its input), then printed by the `durable` command to an
operator's terminal. A terminal obeys control characters in what it prints: `ESC[2J`
clears the screen, `ESC]0;...BEL` retitles the window, `ESC]8;;url ESC\\` turns the text
after it into a link to a hidden address, a carriage return or a backspace overwrites what
was printed before, a newline forges a line of output, and a right-to-left override
(U+202E) reorders the rest of the line. So every such character in stored text is printed
as its Python escape (`\\x1b`, `\\r`, `\\n`, `\\x9b`, `\\u202e`), which the operator can
read and the terminal does not act on.

Rich, which draws the tables, drops a few of these (BEL, backspace, carriage return)
silently and passes ESC through; `Console` here escapes every string it is given to render
instead, so a command cannot forget a field.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.text import Text

# C0 controls, DEL and C1 controls (category Cc), and the bidirectional formatting
# characters that reorder a line on screen (Trojan Source, CVE-2021-42574).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_NEWLINE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def inert(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with its control characters escaped, visible and inert on a terminal.

    keep_newlines: leave line breaks as they are, for messages written over several lines
    by durable itself (an error message and the stored values quoted in it).
    """
    return (_CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL).sub(_escape, text)


class InertConsole(Console):
    """A rich Console that prints stored values as data: no markup, no emoji, no
    highlighting, and every control character escaped. Rich turns each string it prints
    (a line, a table cell, a title) into Text through `render_str`, so escaping there
    covers them all."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, emoji=False, highlight=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(inert(text), **kwargs)
