"""Generate durable's sync modules from their async sources (the list in PAIRS).

What durable does with I/O around a run (the run's database I/O, the host that performs a
workflow's lifecycle, the in-workflow API) is written once, as async code; its sync twin is
this script's mechanical translation of it, so the two cannot drift apart. The translation
works on tokens, so comments and layout survive: `async` and `await` go, and names are
mapped (AsyncConnection to Connection, asyncio.sleep to time.sleep, a name ending in
`_async` to the name without it, ...). The result is put through ruff (import order, then
format), so that the committed file is what `ruff format` would make of it.

Where the two sides really differ, the source says so in a block the translation resolves
(as psycopg's generator does):

    if True:  # ASYNC
        ...what the async side does...
    else:
        ...what the sync side does...

The async module runs the first branch (the `if True` costs nothing); the sync module gets
only the second, dedented. What differs by a call alone (sleep, to_thread, an event) goes
through `durable/_run/acompat.py`, whose async names map to its sync ones.

    python tools/async_to_sync.py           # rewrite every generated module
    python tools/async_to_sync.py --check   # exit 1 if one is out of date

tests/unit/test_generated_sync.py runs the check.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (async source, generated sync module): every generated file in the package.
PAIRS: list[tuple[Path, Path]] = [
    (Path("durable/_io/runio_async.py"), Path("durable/_io/runio.py")),
    (Path("durable/_run/host_async.py"), Path("durable/_run/host_sync.py")),
    (Path("durable/_run/in_step_async.py"), Path("durable/_run/in_step.py")),
    (Path("durable/_run/waits_async.py"), Path("durable/_run/waits.py")),
    (Path("durable/_run/streams_async.py"), Path("durable/_run/streams.py")),
    (Path("durable/_run/patches_async.py"), Path("durable/_run/patches.py")),
    (Path("durable/_run/state_async.py"), Path("durable/_run/state.py")),
    (Path("durable/_run/children_async.py"), Path("durable/_run/children.py")),
    (Path("durable/_client/starts_async.py"), Path("durable/_client/starts.py")),
    (Path("durable/_client/client_calls_async.py"), Path("durable/_client/client_calls.py")),
    (Path("durable/_host/engine_calls_async.py"), Path("durable/_host/engine_calls.py")),
    (Path("durable/_run/active_async.py"), Path("durable/_run/active.py")),
    (Path("durable/_run/late_charges_async.py"), Path("durable/_run/late_charges.py")),
    (Path("durable/_client/debounce_async.py"), Path("durable/_client/debounce.py")),
    (Path("durable/_run/llm_steps_async.py"), Path("durable/_run/llm_steps.py")),
    (Path("durable/_client/in_txn_async.py"), Path("durable/_client/in_txn.py")),
]
SOURCE, TARGET = PAIRS[0]
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
    "AsyncEvent": "Event",
    "AsyncFuture": "Future",
    "AsyncLifeHost": "LifeHost",
    "AsyncAppTransaction": "AppTransaction",
    "AsyncBoundedConnection": "BoundedConnection",
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncCursor": "Cursor",
    "AsyncExitStack": "ExitStack",
    "AsyncIterator": "Iterator",
    "AsyncRunIO": "RunIO",
    "AsyncStateWrites": "StateWrites",
    "AsyncClientCalls": "ClientCalls",
    "AsyncEngineCalls": "EngineCalls",
    "AsyncRunsHere": "RunsHere",
    "AsyncCall": "Call",
    "AsyncDebounces": "Debounces",
    "AsyncChildResult": "ChildResult",
    "AsyncWorkflowHandle": "WorkflowHandle",
    "AsyncTransaction": "Transaction",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "asynccontextmanager": "contextmanager",
    "enter_async_context": "enter_context",
    "host_async": "host_sync",  # the host's generated module is not named `host`
    "is_async": "is_async",  # an attribute or a parameter of both sides, not a twin's name
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


_ASYNC_IF = re.compile(r"^(?P<indent>[ ]*)if True:[ ]*# ASYNC[ ]*$")
_ELSE = re.compile(r"^(?P<indent>[ ]*)else:[ ]*(#.*)?$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _body(lines: list[str], i: int, indent: int) -> int:
    """The index just past the block that starts at `lines[i]` and is indented deeper than
    `indent` (blank lines belong to it)."""
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
        i += 1
    return i


def resolve_blocks(text: str) -> str:
    """`text` with each `if True:  # ASYNC` block replaced by its `else:` branch, dedented
    (nothing, if it has none): what the sync side does where the two differ."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        found = _ASYNC_IF.match(lines[i].rstrip("\n"))
        if found is None:
            out.append(lines[i])
            i += 1
            continue
        indent = len(found["indent"])
        i = _body(lines, i + 1, indent)
        other = _ELSE.match(lines[i].rstrip("\n")) if i < len(lines) else None
        if other is None or len(other["indent"]) != indent:
            continue
        end = _body(lines, i + 1, indent)
        body = lines[i + 1 : end]
        deeper = min((_indent(line) for line in body if line.strip()), default=indent)
        out.extend(line[deeper - indent :] if line.strip() else line for line in body)
        i = end
    return "".join(out)


def translate(text: str) -> str:
    """The async module `text` as sync code (not yet formatted)."""
    text = resolve_blocks(text)
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
    # `from durable._client import starts_async as starts` became `... starts as starts`.
    return re.sub(r"\bimport (\w+) as \1\b", r"import \1", out)


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
    # Imports sorted (and those only the async side used dropped), and an async generator's
    # `for x in xs: yield x` made `yield from xs`.
    fixes = ["--select", "I,F401,UP028", "--unsafe-fixes"]
    text = _ruff(["check", "--fix-only", *fixes, "--exit-zero"], text, target)
    return _ruff(["format"], text, target)


def stale() -> list[Path]:
    """The generated modules that differ from what their sources generate now."""
    return [
        target
        for source, target in PAIRS
        if not (ROOT / target).exists()
        or (ROOT / target).read_text("utf-8") != generate(source, target)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether all are current")
    args = parser.parse_args(argv)
    if args.check:
        for target in stale():
            print(f"{target} is out of date: run `{COMMAND}`", file=sys.stderr)
        return 1 if stale() else 0
    for source, target in PAIRS:
        wanted = generate(source, target)
        path = ROOT / target
        if not path.exists() or path.read_text("utf-8") != wanted:
            path.write_text(wanted, "utf-8")
            print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
