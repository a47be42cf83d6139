"""The Python side of the native record path (an experiment; see README.md).

`load()` imports the built extension (None when it is not built) and binds it to the libpq
that psycopg loaded: the PGconn psycopg holds (`conn.pgconn.pgconn_ptr`) belongs to that
copy (psycopg[binary] bundles its own), so the extension calls that copy's functions.
"""

from __future__ import annotations

import ctypes.util
import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg

_PARAM = re.compile(rb"%\((\w+)\)s")


def libpq_path() -> str:
    """The file of the libpq this process's psycopg uses."""
    import psycopg.pq  # loads it

    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            path = line.split()[-1]
            if Path(path).name.startswith("libpq") and ".so" in path:
                return path
    found = ctypes.util.find_library("pq")
    if found is None:
        raise OSError(f"no libpq found (psycopg implementation: {psycopg.pq.__impl__})")
    return found


def load() -> ModuleType | None:
    """The extension, bound to psycopg's libpq; None when it is not built."""
    try:
        module = importlib.import_module("benchmarks.native._durable_record")
    except ImportError:
        return None
    module.bind(libpq_path())
    return module


def positional(query: bytes) -> tuple[bytes, tuple[str, ...]]:
    """`query` with psycopg's named placeholders (%(name)s) as $1, $2, ..., and the names
    in their order."""
    names: list[str] = []

    def number(match: re.Match[bytes]) -> bytes:
        name = match.group(1).decode()
        if name not in names:
            names.append(name)
        return b"$%d" % (names.index(name) + 1)

    return _PARAM.sub(number, query).replace(b"%%", b"%"), tuple(names)


class Statement:
    """One named statement of durable's, prepared on each connection it is sent on."""

    def __init__(self, native: ModuleType, name: str, query: bytes) -> None:
        self.native = native
        self.name = f"durable_native_{name}"
        self.sql, self.names = positional(query)
        self._prepared: set[int] = set()

    def address(self, conn: psycopg.Connection[Any]) -> int:
        address = int(conn.pgconn.pgconn_ptr)
        if address not in self._prepared:
            self.native.prepare(address, self.name, self.sql.decode(), len(self.names))
            self._prepared.add(address)
        return address

    def values(self, params: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(params[n] for n in self.names)

    def execute(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        count: int = self.native.execute(self.address(conn), self.name, self.values(params))
        return count
