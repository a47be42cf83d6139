"""Generate the sync twin of durable's async database I/O: `durable/_runio.py` from
`durable/_runio_async.py`.

The I/O of a run (checkout, statements on its connection, batches of step records, the
application's transaction) is written once, as async code; its sync twin is this script's
mechanical translation of it, so the two cannot drift apart. The translation works on
tokens, so comments and layout survive: `async` and `await` go, and names are mapped
(AsyncConnection to Connection, asyncio.sleep to time.sleep, a name ending in `_async` to
the name without it, ...). The result is put through ruff (import order, then format), so
that the committed file is what `ruff format` would make of it.

    python tools/async_to_sync.py           # rewrite durable/_runio.py
    python tools/async_to_sync.py --check   # exit 1 if durable/_runio.py is out of date

tests/unit/test_generated_sync.py runs the check.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path("durable/_runio_async.py")
TARGET = Path("durable/_runio.py")
COMMAND = "python tools/async_to_sync.py"

# Whole dotted names first (a name's parts alone would map them wrongly: `asyncio` in
# `sqlalchemy.ext.asyncio` is not the asyncio module).
DOTTED = {
    "asyncio": "time",
    "asyncio.sleep": "time.sleep",
    "sqlalchemy.ext.asyncio": "sqlalchemy",
    "sqlalchemy.ext.asyncio.AsyncConnection": "sqlalchemy.Connection",
}
# Then each part of a dotted name.
NAMES = {
    "AbstractAsyncContextManager": "AbstractContextManager",
    "AsyncAppTransaction": "AppTransaction",
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncCursor": "Cursor",
    "AsyncExitStack": "ExitStack",
    "AsyncIterator": "Iterator",
    "AsyncRunIO": "RunIO",
    "AsyncTransaction": "Transaction",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "asynccontextmanager": "contextmanager",
    "enter_async_context": "enter_context",
}
SUFFIX = "_async"  # run_on_async -> run_on, _checkout_async -> _checkout, ...
DROPPED = {"async", "await"}


def header(source: Path = SOURCE) -> str:
    """The lines that say the file is generated, from what and how to regenerate it."""
    return (
        f"# Generated from {source.as_posix()} by tools/async_to_sync.py: do not edit.\n"
        f"# Edit the source, then run `{COMMAND}`\n"
        "# (tests/unit/test_generated_sync.py fails while this file is out of date).\n"
    )


def _rename(name: str) -> str:
    if name in NAMES:
        return NAMES[name]
    if name.endswith(SUFFIX) and len(name) > len(SUFFIX):
        return name[: -len(SUFFIX)]
    return name


def translate(text: str) -> str:
    """The async module `text` as sync code (not yet formatted)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def at(pos: tuple[int, int]) -> int:
        return offsets[pos[0] - 1] + pos[1]

    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) in `text`
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.type != tokenize.NAME:
            i += 1
            continue
        if tok.string in DROPPED:
            # The keyword and the blank after it: `await x` -> `x`, `async def` -> `def`.
            edits.append((at(tok.start), at(tokens[i + 1].start), ""))
            i += 1
            continue
        # A dotted name: NAME (. NAME)*, on one line.
        j = i
        parts = [tok.string]
        while (
            j + 2 < len(tokens)
            and tokens[j + 1].string == "."
            and tokens[j + 2].type == tokenize.NAME
            and tokens[j + 2].start[0] == tok.start[0]
        ):
            j += 2
            parts.append(tokens[j].string)
        dotted = ".".join(parts)
        if i > 0 and tokens[i - 1].string == ".":
            new = ".".join(_rename(p) for p in parts)  # an attribute of an expression
        elif dotted in DOTTED:
            new = DOTTED[dotted]
        elif len(parts) > 1 and ".".join(parts[:-1]) in DOTTED:
            new = DOTTED[".".join(parts[:-1])] + "." + _rename(parts[-1])
        else:
            new = ".".join(_rename(p) for p in parts)
        if new != dotted:
            edits.append((at(tok.start), at(tokens[j].end), new))
        i = j + 1
    out = text
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    return out


def _ruff(args: list[str], text: str, path: Path) -> str:
    """`text` through ruff (the repository's configuration applies, as for `path`)."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(ROOT / path), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ruff {' '.join(args)} failed on the generated code:\n{done.stderr}")
    return done.stdout


def generate(source: Path = SOURCE, target: Path = TARGET) -> str:
    """The text of the sync module, as it is to be committed."""
    text = translate((ROOT / source).read_text("utf-8"))
    compile(text, str(target), "exec")  # the translation is valid Python
    text = header(source) + text
    text = _ruff(["check", "--fix-only", "--select", "I", "--exit-zero"], text, target)
    return _ruff(["format"], text, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args(argv)
    wanted = generate()
    path = ROOT / TARGET
    current = path.read_text("utf-8") if path.exists() else ""
    if args.check:
        if current != wanted:
            print(f"{TARGET} is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        path.write_text(wanted, "utf-8")
        print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
