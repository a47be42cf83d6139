"""python -m tests.sim: the seeded simulation from the command line (see simulate.py)."""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from durable.testing import TemplateDatabases, find_postgres
from tests.sim.simulate import (
    PER_SEED,
    Databases,
    Violation,
    check_one,
    check_seed,
    run_seeds,
    sweep_seeds,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds (batches) to run")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--random", action="store_true", help="random seeds (printed)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds, at most")
    parser.add_argument("--per-seed", type=int, default=PER_SEED, help="scenarios per seed")
    parser.add_argument("--seed", type=int, help="run this one seed (and shrink a failure)")
    parser.add_argument("--replay", help="run this one scenario (JSON), as printed")
    parser.add_argument("--jobs", type=int, default=1, help="processes running seeds side by side")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="crash each seed's workload at every round trip in turn, instead of at random",
    )
    parser.add_argument("--stride", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs > 1 and args.replay is None and args.seed is None:
        return _in_parallel(args)
    source = find_postgres()
    templates = TemplateDatabases(source.url, prefix="durable_sim")
    dbs = Databases(templates)
    started = time.monotonic()
    try:
        if args.replay:
            outcome = check_one(dbs, json.loads(args.replay))
            print("\n".join(outcome.log))
            print(f"ok in {outcome.seconds:.2f} s")
            return 0
        if args.seed is not None:
            check_seed(dbs, args.seed, args.per_seed)
            print(f"seed {args.seed}: ok")
            return 0
        if args.random:
            seeds = [random.randrange(2**32) for _ in range(args.seeds)]
            print("random seeds:", " ".join(map(str, seeds)))
        else:
            seeds = list(range(args.first, args.first + args.seeds * args.stride, args.stride))
        if args.sweep:
            ran = sweep_seeds(dbs, seeds, args.budget)
        else:
            ran = run_seeds(dbs, seeds, args.budget, args.per_seed)
        took = time.monotonic() - started
        print(f"{ran} scenarios, no violation, in {took:.0f} s ({ran / took:.1f}/s)")
        return 0
    except Violation as exc:
        print(f"VIOLATION\n{exc}", file=sys.stderr)
        return 1
    finally:
        dbs.close()
        templates.close()
        source.close()


def _in_parallel(args: argparse.Namespace) -> int:
    """Run the seeds in `jobs` processes (seed first+j, first+j+jobs, ...), each with a
    database of its own; fails if any of them found a violation."""
    import subprocess

    jobs = []
    for j in range(args.jobs):
        command = [
            sys.executable,
            "-m",
            "tests.sim",
            "--seeds",
            str(-(-args.seeds // args.jobs)),
            "--first",
            str(args.first + j),
            "--stride",
            str(args.jobs),
            "--budget",
            str(args.budget),
            "--per-seed",
            str(args.per_seed),
        ]
        if args.random:
            command.append("--random")
        jobs.append(subprocess.Popen(command))
    codes = [job.wait() for job in jobs]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
