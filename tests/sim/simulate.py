"""Run scenarios: one (a replay), or seeds of generated ones under a time budget.

`python -m tests.sim --seeds 20 --budget 240` runs seed after seed (each seed is a fixed
batch of generated scenarios, the same on every machine) until the seeds or the budget
run out. A failing scenario is shrunk by Hypothesis to a smaller one that still fails,
printed as JSON with the command that replays it:

    python -m tests.sim --replay '<the scenario>'
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from hypothesis import HealthCheck, Phase, given, seed, settings

from durable.testing import TemplateDatabases
from tests.sim import invariants
from tests.sim.runner import Sim, Stuck
from tests.sim.scenario import Scenario, scenarios

PER_SEED = 10  # scenarios in one seed's batch
SWEPT = ("crash_before", "crash_after")  # the kinds of crash a sweep puts at every round trip


class Violation(AssertionError):
    """A scenario broke an invariant; the message says which and how to replay it."""


@dataclass
class Outcome:
    violations: list[str]
    log: list[str]
    seconds: float


class Databases:
    """One database for a run of many scenarios, emptied before each: truncating the
    tables costs a few milliseconds, a database cloned from a template a third of a
    second."""

    def __init__(self, dbs: TemplateDatabases) -> None:
        self.dbs = dbs
        self.urls: dict[str, str] = {}  # "system" / "app" -> URL

    def fresh(self, which: str) -> str:
        url = self.urls.get(which)
        if url is None:
            url = self.urls[which] = self.dbs.create(migrated=which == "system")
            with psycopg.connect(url, autocommit=True, application_name="sim_admin") as c:
                c.execute("CREATE TABLE sim_app (workflow_id text NOT NULL, tag text NOT NULL)")
            return url
        with psycopg.connect(url, autocommit=True, application_name="sim_admin") as c:
            tables = [
                f'"{schema}"."{name}"'
                for schema, name in c.execute(
                    "SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN "
                    "('pg_catalog', 'information_schema') AND tablename <> 'schema_migrations'"
                )
            ]
            c.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
        return url

    def close(self) -> None:
        for url in self.urls.values():
            self.dbs.drop(url)
        self.urls.clear()


def run_scenario(dbs: Databases, scenario: Scenario) -> Outcome:
    started = time.monotonic()
    url = dbs.fresh("system")
    app_url = dbs.fresh("app") if scenario.get("app") == "separate" else None
    sim = Sim(url, scenario, app_url=app_url)
    try:
        sim.run()
        facts = invariants.Facts(url, app_url)
        violations = invariants.check(sim, facts)
        if not violations:
            violations = [f"replays: {v}" for v in sim.replay_finished()]
    except Stuck as exc:
        violations = [f"stuck: {exc}"]
    finally:
        sim.close()
    return Outcome(violations, sim.log, time.monotonic() - started)


def replay_command(scenario: Scenario) -> str:
    return f"python -m tests.sim --replay '{json.dumps(scenario, separators=(',', ':'))}'"


def check_one(dbs: Databases, scenario: Scenario) -> Outcome:
    outcome = run_scenario(dbs, scenario)
    if outcome.violations:
        raise Violation(
            "\n".join(outcome.violations)
            + "\nscenario: "
            + json.dumps(scenario)
            + "\nreplay:   "
            + replay_command(scenario)
        )
    return outcome


def check_seed(
    dbs: Databases,
    n: int,
    per_seed: int = PER_SEED,
    shrink: bool = True,
    on_scenario: Callable[[Scenario, Outcome], None] | None = None,
) -> None:
    """Run seed `n`'s batch; on a violation, shrink it and raise Violation."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]

    @seed(n)
    @settings(
        max_examples=per_seed,
        database=None,
        deadline=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(scenarios())
    def one(scenario: Scenario) -> None:
        outcome = check_one(dbs, scenario)
        if on_scenario is not None:
            on_scenario(scenario, outcome)

    one()


def run_seeds(
    dbs: Databases,
    seeds: list[int],
    budget: float,
    per_seed: int = PER_SEED,
    report: Callable[[str], Any] = print,
) -> int:
    """Run the seeds until the budget is spent; returns how many scenarios ran."""
    started = time.monotonic()
    ran = [0]

    def count(_: Scenario, __: Outcome) -> None:
        ran[0] += 1

    for n in seeds:
        if time.monotonic() - started > budget:
            report(f"time budget of {budget:.0f} s spent after {ran[0]} scenarios")
            break
        try:
            check_seed(dbs, n, per_seed, on_scenario=count)
        except Exception as exc:  # a Violation, or Hypothesis's report of several or flaky
            raise Violation(
                f"seed {n} (after {ran[0]} scenarios): {_messages(exc)}\n"
                f"or the seed: python -m tests.sim --seed {n}"
            ) from None
    return ran[0]


def _messages(exc: BaseException) -> str:
    """The violations in an error Hypothesis raised (one, several, or a flaky one)."""
    if isinstance(exc, BaseExceptionGroup):
        return "\n---\n".join(_messages(e) for e in exc.exceptions)
    if isinstance(exc, Violation):
        return str(exc)
    note = "\n".join(getattr(exc, "__notes__", []))
    return f"{type(exc).__name__}: {exc}\n{note}"


def sweep(dbs: Databases, scenario: Scenario, kinds: tuple[str, ...] = SWEPT) -> int:
    """Crash the workload's first process at every round trip in turn: run it once without
    a fault to count its round trips (n), then once for each k in 1..n and each kind, the
    rest of the scenario left to recovery and the drain. Returns how many runs it took;
    raises Violation on the first that breaks an invariant."""
    base = {**scenario, "phases": [[None, []]]}
    url = dbs.fresh("system")
    app_url = dbs.fresh("app") if scenario.get("app") == "separate" else None
    sim = Sim(url, base, app_url=app_url)
    try:
        sim.run()
    finally:
        sim.close()
    n = sim.trips[0] if sim.trips else 0
    for k in range(1, n + 1):
        for kind in kinds:
            check_one(dbs, {**scenario, "phases": [[[kind, k], []]]})
    return 1 + n * len(kinds)


def sweep_seed(dbs: Databases, n: int, on_sweep: Callable[[int], None] | None = None) -> None:
    """Seed `n`'s workload, swept. (Hypothesis's first example of any seed is the simplest
    one, one workflow of one step: the workload is its second.)"""
    drawn: list[Scenario] = []

    @seed(n)
    @settings(
        max_examples=2,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(scenarios())
    def draw(scenario: Scenario) -> None:
        drawn.append(scenario)

    draw()
    runs = sweep(dbs, drawn[-1])
    if on_sweep is not None:
        on_sweep(runs)


def sweep_seeds(
    dbs: Databases, seeds: list[int], budget: float, report: Callable[[str], Any] = print
) -> int:
    """Sweep the seeds' workloads until the budget is spent; returns how many runs."""
    started = time.monotonic()
    ran = [0]

    def count(runs: int) -> None:
        ran[0] += runs

    for n in seeds:
        if time.monotonic() - started > budget:
            report(f"time budget of {budget:.0f} s spent after {ran[0]} runs")
            break
        try:
            sweep_seed(dbs, n, on_sweep=count)
        except Exception as exc:
            raise Violation(
                f"sweep of seed {n} (after {ran[0]} runs): {_messages(exc)}\n"
                f"or the seed: python -m tests.sim --sweep --first {n} --seeds 1"
            ) from None
    return ran[0]
