"""One strict mypy run over every typing snippet the unit tests check.

Each check of a snippet is mostly mypy reading durable, psycopg and the standard library:
the snippets are checked together, as modules of one run, in the worker process that runs
the typing tests (they share an xdist group), and each test reads its own module's lines
of the output. A snippet is its own module, so one's errors never show in another's."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from mypy import api

# Every test that reads `checked()` carries this mark, so that they all run in one process.
GROUP = pytest.mark.xdist_group("strict-mypy")


@dataclass(frozen=True)
class Checked:
    """A snippet's file and mypy's output lines about it."""

    path: Path
    rows: list[str]

    @property
    def errors(self) -> list[str]:
        return [row for row in self.rows if ": error:" in row]

    def line_of(self, row: str) -> int:
        found = re.match(rf"{re.escape(str(self.path))}:(\d+):", row)
        assert found is not None, row
        return int(found[1])


_lock = threading.Lock()
_done: dict[str, Checked] = {}


def _snippets() -> dict[str, str]:
    from tests.unit import test_methods_typing, test_start_options, test_typed_starts

    return {
        "typed_starts": test_typed_starts.SNIPPET,
        "options_accepted": test_start_options.ACCEPTED,
        "options_refused": test_start_options.REFUSED,
        "methods": test_methods_typing.SNIPPET,
    }


def checked(name: str, tmp: pytest.TempPathFactory) -> Checked:
    """mypy --strict's verdict on the snippet `name` (see _snippets), from the one run."""
    with _lock:
        if not _done:
            base = tmp.mktemp("strict-mypy")
            paths = {}
            for module, code in _snippets().items():
                paths[module] = base / f"{module}.py"
                paths[module].write_text(code, "utf-8")
            out, err, _ = api.run(
                [
                    "--strict",
                    "--no-incremental",
                    "--cache-dir",
                    str(base / "cache"),
                    *map(str, paths.values()),
                ]
            )
            assert not err, err
            rows = out.splitlines()
            ours = tuple(f"{path}:" for path in paths.values())
            stray = [row for row in rows if ": error:" in row and not row.startswith(ours)]
            assert not stray, out  # an error outside the snippets: in durable itself
            for module, path in paths.items():
                mine = [row for row in rows if row.startswith(f"{path}:")]
                _done[module] = Checked(path, mine)
        return _done[name]
