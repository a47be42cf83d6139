"""Optional extras: an import that needs one says which, and the exact `pip install`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from durable.errors import MissingExtraError


@contextmanager
def extra(name: str) -> Iterator[None]:
    """Imports inside the block come from extra `name`: a missing one raises
    MissingExtraError (an ImportError) naming it, instead of a bare ModuleNotFoundError."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] in {"durable", "__main__"}:
            raise  # not an extra's package: a bug of ours, said as it is
        raise MissingExtraError(name, exc.name and exc.name.split(".")[0]) from exc
