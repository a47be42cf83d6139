"""`python -m durable.cli`: the same as the `durable` console script."""

from __future__ import annotations

from durable.cli import main

if __name__ == "__main__":
    main()
