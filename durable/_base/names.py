"""What an id, key, topic or name may be, checked before anything is stored.

Ids and keys are primary or unique keys in PostgreSQL: a value of a few KB fails inside an
index ("index row size exceeds maximum"), and a NUL character or a lone surrogate cannot be
sent at all. So every such value is checked at the call, with an error that says which
argument and why: a non-empty string of at most 512 bytes of UTF-8, with no NUL.
"""

from __future__ import annotations

from durable._base.labels import MAX_ID_BYTES
from durable.errors import InvalidNameError

MAX_NAME_BYTES = MAX_ID_BYTES  # the ids the library derives are kept within it too


def check_name(what: str, value: object, *, optional: bool = False) -> None:
    """Raise InvalidNameError unless `value` is usable as an id, key, topic or name."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise InvalidNameError(what, value, f"is a {type(value).__qualname__}, not a string")
    if not value:
        raise InvalidNameError(what, value, "is empty")
    if "\x00" in value:
        raise InvalidNameError(what, value, "contains a NUL character")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidNameError(what, value, "is not valid text (a lone surrogate)") from None
    if size > MAX_NAME_BYTES:
        raise InvalidNameError(what, value, f"is {size} bytes long")


def check_text(what: str, value: object) -> None:
    """Free text stored as given (a reason, a comment): no NUL, valid UTF-8."""
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidNameError(what, value, f"is a {type(value).__qualname__}, not a string")
    if "\x00" in value:
        raise InvalidNameError(what, value, "contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidNameError(what, value, "is not valid text (a lone surrogate)") from None


def check_version(what: str, value: object) -> None:
    """A version to move a workflow to: a name, or "" for no version (a declared version is
    never empty, so "" cannot be taken for one)."""
    if value != "":
        check_name(what, value)


def workflow_label(name: str, version: str | None) -> str:
    """The code a workflow needs, as people read it: `name@version`, or `name` when it has
    no version (workers are routed by this pair)."""
    return f"{name}@{version}" if version else name
