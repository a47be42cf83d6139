"""How a conversation's storage grows with its length: one row per turn, or the whole
transcript at every turn.

  per turn     `durable.append_turn(role, content)`: one journal row per turn;
  whole state  `durable.state.set(transcript)` after every turn: the full transcript stored
               again at each step, which is what a checkpointer that saves the whole
               state per step (LangGraph's, for one) does.

For each length it runs one workflow of each kind (durability "exit", so the time is the
write, not a commit per turn) and reports the bytes the journal rows take
(sum(pg_column_size(row)), after TOAST compression) and the median time per turn over
--rounds runs. Turns are distinct sentences (deterministic), so compression cannot hide
the repetition. It works in a scratch schema of the given database and drops it.

Run: python -m benchmarks.conversation_storage [--turns 100 1000] [--rounds 3] [--plot PNG]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

import durable

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def sentence(i: int) -> str:
    digest = hashlib.sha256(str(i).encode()).hexdigest()
    return f"turn {i}: the tide table for station {digest[:12]} reads {digest[12:40]}"


def make_app() -> tuple[durable.Registry, Any, Any]:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="bench.per_turn", durability="exit")
    def per_turn(n: int) -> int:
        for i in range(n):
            durable.append_turn("user" if i % 2 == 0 else "assistant", sentence(i))
        return n

    @durable.workflow(registry=reg, name="bench.whole_state", durability="exit")
    def whole_state(n: int) -> int:
        transcript: list[dict[str, str]] = []
        for i in range(n):
            transcript.append(
                {"role": "user" if i % 2 == 0 else "assistant", "content": sentence(i)}
            )
            durable.state.set({"messages": transcript})
        return n

    return reg, per_turn, whole_state


def row_bytes(url: str, schema: str, workflow_id: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT coalesce(sum(pg_column_size(s.*)), 0) FROM {}.steps AS s "
                "WHERE workflow_id = %s"
            ).format(sql.Identifier(schema)),
            [workflow_id],
        ).fetchone()
    return int(row[0]) if row else 0


def main(argv: list[str] | None = None, console: Console | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--turns", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plot", default=None, help="write a PNG plot here")
    args = parser.parse_args(argv)
    console = console or Console()
    schema = f"durable_bench_{uuid.uuid4().hex[:8]}"
    reg, per_turn, whole_state = make_app()
    results: list[dict[str, Any]] = []
    try:
        with durable.Engine(args.url, registry=reg, schema=schema) as engine:
            for n in args.turns:
                for kind, wf in (("per turn", per_turn), ("whole state", whole_state)):
                    times, size = [], 0
                    for _ in range(args.rounds):
                        wid = f"{kind}-{n}-{uuid.uuid4().hex[:6]}"
                        start = time.perf_counter()
                        engine.start(wf, n, workflow_id=wid).result(timeout=600)
                        times.append((time.perf_counter() - start) / n * 1e6)
                        size = row_bytes(args.url, schema, wid)
                    results.append(
                        {
                            "kind": kind,
                            "turns": n,
                            "bytes": size,
                            "us_per_turn": statistics.median(times),
                        }
                    )
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))

    table = Table("storage", "turns", "bytes", "bytes/turn", "growth vs first", "µs/turn (median)")
    for kind in ("per turn", "whole state"):
        rows = [r for r in results if r["kind"] == kind]
        for r in rows:
            table.add_row(
                kind,
                str(r["turns"]),
                f"{r['bytes']:,}",
                f"{r['bytes'] / r['turns']:.0f}",
                f"{r['bytes'] / rows[0]['bytes']:.1f}x",
                f"{r['us_per_turn']:.0f}",
            )
    console.print(table)
    last = args.turns[-1]
    ours = next(r for r in results if r["kind"] == "per turn" and r["turns"] == last)
    theirs = next(r for r in results if r["kind"] == "whole state" and r["turns"] == last)
    console.print(
        f"at {last} turns the whole-state journal is {theirs['bytes'] / ours['bytes']:.0f}x "
        "the per-turn one"
    )
    if args.plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("no plot: pip install -e '.[bench]' for matplotlib")
            return results
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for kind in ("per turn", "whole state"):
            rows = [r for r in results if r["kind"] == kind]
            ax.plot([r["turns"] for r in rows], [r["bytes"] for r in rows], marker="o", label=kind)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("turns")
        ax.set_ylabel("journal bytes")
        ax.set_title("conversation storage")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        console.print(f"plot: {args.plot}")
    return results


if __name__ == "__main__":
    main()
