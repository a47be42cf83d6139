"""What one seed runs: a small workload and a schedule of faults and operator actions.

A scenario is plain data (lists, strings and numbers), so that a failing one prints as a
literal that `python -m tests.sim --replay '<json>'` runs again, and Hypothesis can shrink
it: fewer workflows, shorter programs, fewer phases, earlier faults.

The schedule is a list of phases. Each phase is one simulated process (an Engine with its
own connections) that starts the workload (the first phase) or recovers what is left, with
at most one fault armed at its k-th round trip to the server made by workflow code:

    ["crash_before", k]   the process dies before the k-th exchange is sent
    ["crash_after", k]    the process dies after it was done (and committed), reply unread
    ["lost", k]           the reply of the k-th exchange is lost (a network cut); it lives
    ["outage", k]         every connection of the process drops before the k-th exchange
    ["pause", k, action]  the run stops at the k-th exchange while the operator acts
    ["zombie", k]         the run stops there, its lease runs out, a second process takes
                          the workflow and runs it, then the first one goes on
    ["sigterm", k]        a worker is told to stop while its run is stopped there
    ["two", k]            two processes claim the work side by side; the first dies after
                          its k-th exchange
    null                  no fault

and then zero or more operator actions, done once the process has gone quiet:

    ["cancel", w]  ["resume", w]  ["resume_v", w]  ["fork", w, step]  ["deploy"]
    ["approve", w] ["deny", w]    ["raise", w]     ["send", w]        ["advance", s]
    ["export", w]

(cancel_resume cancels, lets a process run the compensations, then resumes; resume_v
moves the run to version "2", which only deployed code serves; export carries
a stopped workflow out of the database and back in, as a move between databases does.)

where w indexes the scenario's workflows (forks are appended to them as they are made).

"budget" is the workflows' [dollars, steps] (absent: [2.0, 12]).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

Scenario = dict[str, Any]

SYNC_OPS = [
    "step",
    "txn",
    "pay",
    "model",
    "llm",
    "child",
    "recv",
    "sleep",
    "approve",
    "patch",
    "fail",
]
ASYNC_OPS = ["pay", "model", "llm", "par", "child", "recv", "sleep", "approve", "patch", "fail"]
ACTIONS = [
    "cancel",
    "cancel_resume",
    "resume",
    "resume_v",
    "fork",
    "deploy",
    "approve",
    "deny",
    "raise",
    "send",
    "advance",
    "export",
]


def instruction(kind: str, depth: int) -> st.SearchStrategy[list[Any]]:
    is_sync = kind in ("prog", "fprog")
    ops = SYNC_OPS if is_sync else ASYNC_OPS
    if depth > 0:
        ops = [o for o in ops if o != "child"]

    def make(op: str) -> st.SearchStrategy[list[Any]]:
        if op == "pay":
            return st.tuples(st.just("pay"), st.sampled_from([100, 250, 700])).map(list)
        if op == "model":
            return st.tuples(st.just("model"), st.sampled_from([0.2, 0.35, 0.5])).map(list)
        if op == "llm":
            return st.tuples(st.just("llm"), st.sampled_from([50, 100, 400])).map(list)
        if op == "sleep":
            return st.tuples(st.just("sleep"), st.sampled_from([1, 30, 3600])).map(list)
        if op == "patch":
            olds = ["pay", "own", "txn"] if is_sync else ["pay"]
            return st.tuples(st.just("patch"), st.sampled_from(olds)).map(list)
        if op == "child":
            hows = ["derived", "own", "submit", "enqueue"] if is_sync else ["derived", "own"]
            return st.tuples(st.just("child"), st.sampled_from(hows), program(kind, depth + 1)).map(
                list
            )
        if op == "par":
            leaf = st.one_of(
                st.tuples(st.just("pay"), st.sampled_from([100, 250])).map(list),
                st.tuples(st.just("model"), st.sampled_from([0.35, 0.5])).map(list),
                st.tuples(st.just("llm"), st.sampled_from([100, 400])).map(list),
            )
            return st.tuples(st.just("par"), st.lists(leaf, min_size=2, max_size=3)).map(list)
        return st.just([op])

    return st.sampled_from(ops).flatmap(make)


def program(kind: str, depth: int = 0) -> st.SearchStrategy[list[list[Any]]]:
    return st.lists(instruction(kind, depth), min_size=1, max_size=5 if depth == 0 else 3)


def action(n_workflows: int) -> st.SearchStrategy[list[Any]]:
    w = st.integers(0, max(0, n_workflows - 1))

    def make(name: str) -> st.SearchStrategy[list[Any]]:
        if name == "deploy":
            return st.just(["deploy"])
        if name == "advance":
            return st.tuples(st.just("advance"), st.sampled_from([5, 61, 4000])).map(list)
        if name == "fork":
            return st.tuples(st.just("fork"), w, st.integers(0, 6)).map(list)
        return st.tuples(st.just(name), w).map(list)

    return st.sampled_from(ACTIONS).flatmap(make)


def fault(n_workflows: int) -> st.SearchStrategy[list[Any] | None]:
    # The first round trips of a run hold the most windows (a child's row before its
    # parent's journal row, an app transaction before the journal's): a third of the faults
    # land in them.
    k = st.one_of(st.integers(1, 4), st.integers(1, 8), st.integers(1, 40))
    crash = st.tuples(st.sampled_from(["crash_before", "crash_after", "lost", "outage"]), k)
    return st.one_of(
        st.none(),
        crash.map(list),
        crash.map(list),
        st.tuples(st.just("pause"), k, action(n_workflows)).map(list),
        st.tuples(st.sampled_from(["zombie", "sigterm", "two"]), k).map(list),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    kinds = draw(
        st.lists(st.sampled_from(["prog", "aprog", "fprog", "faprog"]), min_size=1, max_size=2)
    )
    workflows = [[kind, draw(program(kind))] for kind in kinds]
    n = len(workflows)
    phases = draw(
        st.lists(
            st.tuples(fault(n), st.lists(action(n), max_size=2)).map(list),
            min_size=1,
            max_size=4,
        )
    )
    mode = draw(st.sampled_from(["sync", "async", "exit"]))
    app = draw(st.sampled_from(["same", "separate"]))
    # The workflows' budget: roomy, or tight enough that programs reach the cap mid-way
    # (gathered steps crossing the steps limit, a model call that does not fit).
    budget = draw(st.sampled_from([[2.0, 12], [1.0, 6], [0.6, 3]]))
    return {
        "workflows": workflows,
        "phases": phases,
        "durability": mode,
        "app": app,
        "budget": budget,
    }
