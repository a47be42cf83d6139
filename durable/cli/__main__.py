"""`python -m durable.cli`: the same as the `durable` console script (named `durable` in
its usage lines, and completed by the same `_DURABLE_COMPLETE` variable)."""

from __future__ import annotations

from durable.cli import main

if __name__ == "__main__":
    main(prog_name="durable")
