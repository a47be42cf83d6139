"""Run every benchmark once and write docs/benchmarks.md with its charts.

    python -m benchmarks.report            # run all, then write the page (about 10 minutes)
    python -m benchmarks.report --quick    # tiny sizes, to check the pipeline
    python -m benchmarks.report --render   # only rewrite the page from the stored results

Each benchmark keeps its own JSON under benchmarks/results/ (the page is made from those
files, so it always shows one run of each; run on its own, a benchmark writes there only
with --save) and draws its PNG into docs/benchmarks/. The
page states the server, its settings and the versions measured, since every number here
depends on them: compare ratios measured in one run, not microseconds across machines.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CHARTS = ROOT / "docs" / "benchmarks"
PAGE = ROOT / "docs" / "benchmarks.md"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _stored_text(name: str) -> list[str]:
    path = RESULTS / name
    return [path.read_text("utf-8").rstrip(), ""] if path.exists() else []


def _load(name: str) -> Any:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text("utf-8")) if path.exists() else None


def _run_all(url: str, quick: bool) -> None:
    from benchmarks import checkpoint_overhead, recovery, step_overhead

    CHARTS.mkdir(parents=True, exist_ok=True)
    small = ["--steps", "20", "--rounds", "2", "--empty-runs", "2"] if quick else []
    step_overhead.main(
        [
            "--database-url",
            url,
            "--out",
            str(RESULTS / "step_overhead.json"),
            "--plot",
            str(CHARTS / "step_overhead.png"),
            *small,
        ]
    )
    checkpoint_overhead.main(
        [
            "--database-url",
            url,
            "--rounds",
            "2" if quick else "3",
            "--out",
            str(RESULTS / "checkpoint_overhead.json"),
            "--plot",
            str(CHARTS / "checkpoint_overhead.png"),
            *(["--quick", "--no-peers"] if quick else []),
        ]
    )
    recovery.main(
        [
            *("--processes", "0", "--processes", "1", "--processes", "2"),
            *([] if quick else ["--processes", "4"]),
            "--database-url",
            url,
            "--rounds",
            "1",
            *(["--n", "50"] if quick else ["--n", "1000", "--n", "10000"]),
            "--out",
            str(RESULTS / "recovery.json"),
        ]
    )
    if importlib.util.find_spec("benchmarks.throughput") is not None:
        throughput: Any = importlib.import_module("benchmarks.throughput")
        args = ["--database-url", url, "--out", str(RESULTS / "throughput.json")]
        args += ["--plot", str(CHARTS / "throughput.png")]
        if quick:
            args += ["--workflows", "20", "--workers", "1", "--modes", "sync"]
        throughput.main(args)
    from tests import citus

    try:
        citus.ensure_installed()
    except citus.Unavailable as exc:
        print(f"not measured on a Citus cluster: {exc}")
        return
    from benchmarks import citus as citus_bench

    args = ["--json", str(RESULTS / "citus.json"), "--plot", str(CHARTS / "citus.png")]
    if quick:
        args += ["--steps", "10", "--rounds", "1", "--workflows", "10", "--workers", "1"]
    citus_bench.main(args)


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _units(so: dict[str, Any]) -> str:
    floor = so["floor_us"]["median"]
    rows = []
    labels = [
        ("bare `INSERT` + commit (the floor)", "floor_us", "1", "1"),
        ("`@step`, sync mode", "durable_step_us", _f(so["statements_per_step"]), "1"),
        ("`async def` `@step`, sync mode", "async_step_us", "1", "1"),
        (
            "empty workflow: start + finish",
            "empty_workflow_us",
            str(so["statements_per_empty_workflow"]),
            "2",
        ),
        ("empty workflow: `start(wf).result()`", "start_result_us", "2", "2"),
        (
            "empty workflow: `await (await start_async(wf)).result()`",
            "start_result_async_us",
            "2",
            "2",
        ),
        ("round trip: `SELECT 1`", "round_trip_us", "1", "0"),
        ("app transaction, unjournaled (SQLAlchemy)", "app_transaction_us", "", "1"),
        ("`@transaction` step (the same transaction, journaled)", "transaction_step_us", "", "1"),
        (
            "`@effect`",
            "effect_us",
            _f(so.get("statements_per_effect")),
            _f(so.get("commits_per_effect")),
        ),
    ]
    for label, key, statements, commits in labels:
        if key not in so:
            continue
        s = so[key]
        rows.append(
            [
                label,
                _f(s["median"], 0),
                f"{_f(s['p25'], 0)}-{_f(s['p75'], 0)}",
                _f(s["median"] / floor),
                statements,
                commits,
            ]
        )
    table = _table(
        ["what", "median µs", "IQR µs", "x floor", "statements", "commits"],
        rows,
    )
    cpu = so.get("durable_step_cpu_us", {}).get("median")
    acpu = so.get("async_step_cpu_us", {}).get("median")
    notes = []
    inter = so.get("interleaved")
    if inter:
        notes.append(
            f"- **Steps and floor INSERTs interleaved in blocks of {inter['block']} inside one "
            f"workflow** ({inter['blocks']} blocks; the steadier measure on a disk whose "
            "flush time wanders), step / floor, median (IQR): "
            + "; ".join(
                f"{mode} mode **{_f(inter[mode]['ratio']['median'])}** "
                f"({_f(inter[mode]['ratio']['p25'])}-{_f(inter[mode]['ratio']['p75'])})"
                for mode in ("sync", "async", "exit")
            )
            + "."
        )
    notes += [
        f"- A sync step / the floor: **{_f(so['ratio']['of_medians'])}** (per-round median "
        f"{_f(so['ratio']['paired']['median'])}); an `async def` step / a sync step: "
        f"**{_f(so['async_ratio']['of_medians'])}**.",
    ]
    if "start_result_ratio" in so:
        notes.append(
            "- An empty workflow started and waited for, / the floor (per-round median): "
            f"`start(wf).result()` **{_f(so['start_result_ratio']['median'])}**, "
            f"`start_async` **{_f(so['start_result_async_ratio']['median'])}**."
        )
    if "transaction_ratio" in so:
        notes.append(
            f"- A `@transaction` step / the same transaction unjournaled: "
            f"**{_f(so['transaction_ratio']['of_medians'])}**."
        )
    if cpu is not None and acpu is not None:
        notes.append(
            f"- Client CPU per step: sync {_f(cpu, 0)} µs, `async def` {_f(acpu, 0)} µs "
            "(this process, all threads; steadier than wall time on a busy machine)."
        )
    cpu_table = _cpu_per_op(so)
    if cpu_table:
        notes += ["", cpu_table]
    commits = so.get("commits", {})
    if commits.get("reliable"):
        notes.append(
            f"- Server-side commits per step: {_f(commits['durable_per_step'])} "
            f"({commits['note']})."
        )
    cfg = so["config"]
    head = (
        f"{cfg['rounds']} rounds of {cfg['steps']} operations, "
        f"{so['payload_bytes']}-byte step outputs, medians (IQR over rounds)."
    )
    return head + "\n\n" + table + "\n\n" + "\n".join(notes)


def _cpu_per_op(so: dict[str, Any]) -> str:
    """The floor's and a step's CPU and counts: what they cost whatever a commit costs."""
    cpu = so.get("cpu_per_op")
    if not cpu:
        return ""
    commits = so.get("commits", {})
    rows = []
    for label, key, statements, committed in (
        ("bare `INSERT` + commit (the floor)", "floor", 1.0, commits.get("floor_per_insert")),
        (
            "`@step`, sync mode",
            "durable_step",
            so["statements_per_step"],
            commits.get("durable_per_step"),
        ),
    ):
        c = cpu[key]
        rows.append(
            [
                label,
                _f(c["thread_cpu_us"], 0),
                _f(c["process_cpu_us"], 0),
                _f(c["server_cpu_us"], 0),
                _f(float(statements)),
                _f(committed),
            ]
        )
    return (
        "CPU per operation (medians of "
        f"{cpu['rounds']} rounds): the measuring thread's, the client process's, and the "
        "server's (the backends' utime + stime from /proc): unlike wall time, these do not "
        "depend on how long the disk takes to flush a commit.\n\n"
        + _table(
            [
                "what",
                "client thread CPU µs",
                "client process CPU µs",
                "server CPU µs",
                "statements",
                "commits",
            ],
            rows,
        )
    )


def _modes(rows: list[dict[str, Any]]) -> str:
    body = []
    for r in rows:
        body.append(
            [
                r["system"],
                r["mode"],
                r["payload"],
                str(r["steps"]),
                _f(r["median_us"], 1),
                _f(r.get("ratio_to_floor")),
                _f(r.get("statements_per_step")),
                _f(r.get("commits_per_step")),
                _f(r.get("client_thread_cpu_us_per_step"), 0),
                _f(r.get("client_cpu_us_per_step"), 0),
                _f(r.get("server_cpu_us_per_step"), 0),
            ]
        )
    return _table(
        [
            "system",
            "mode",
            "payload",
            "steps",
            "median µs / step",
            "x floor",
            "statements / step",
            "commits / step",
            "client thread CPU µs / step",
            "client process CPU µs / step",
            "server CPU µs / step",
        ],
        body,
    )


def _recovery(rows: list[dict[str, Any]]) -> str:
    return _table(
        [
            "workflows",
            "steps each",
            "worker",
            "median s",
            "workflows / s",
            "statements / wf",
            "commits / wf",
            "worker CPU ms / wf",
            "server CPU ms / wf",
        ],
        [
            [
                str(r["workflows"]),
                str(r["steps_per_workflow"]),
                (
                    f"`durable worker --processes {r['processes']}`"
                    if isinstance(r.get("processes"), int)
                    else "in this process"
                ),
                _f(r["median_seconds"]),
                _f(r["workflows_per_second"], 0),
                _f(r.get("statements_per_workflow"), 1),
                _f(r.get("commits_per_workflow")),
                _f(r.get("client_cpu_ms_per_workflow"), 3),
                _f(r.get("server_cpu_ms_per_workflow"), 3),
            ]
            for r in rows
        ],
    )


def _throughput(data: dict[str, Any]) -> str:
    """The throughput run as a table, and the server's own rate beside it."""
    rates = ", ".join(
        f"{_f(float(rate), 0)}/s from {n} connection{'s' if n != '1' else ''}"
        for n, rate in data["insert_rate"].items()
    )
    _table(
        [
            "mode",
            "group commit",
            "workers",
            "workflows / s",
            "steps / s",
            "x insert rate",
            "statements / step",
            "commits / step",
            "WAL flushes / step",
            "worker CPU µs / step",
            "server CPU µs / step",
        ],
        [
            [
                r["mode"],
                "on" if r["group_commit"] else "off",
                str(r["workers"]),
                _f(r["workflows_per_s"], 0),
                _f(r["steps_per_s"], 0),
                _f(r["ratio_to_insert_rate"]),
                _f(r.get("statements_per_step")),
                _f(r["commits_per_step"]),
                _f(r["wal_syncs_per_step"]),
                _f(r.get("worker_cpu_us_per_step"), 0),
                _f(r.get("server_cpu_us_per_step"), 0),
            ]
            for r in data["durable"]
        ],
    )
    return (
        f'Plain autocommit `INSERT`s on the same server: {rates}. "x insert rate" is '
        f"steps/s over the {data['insert_rate_connections']}-connection rate. Worker and "
        "server CPU per step are measured over the same window as steps/s (the worker "
        "processes' CPU, and the utime + stime of their backends, sampled from /proc as they "
        "run): they do not depend on what a commit costs on this disk.\n\n{table}"
    )


def _citus(data: dict[str, Any]) -> str:
    """One server beside a Citus cluster: per-operation costs and counts, then throughput."""
    st = data["steps"]
    cfg = data["config"]
    rows = []
    for label, key, per in (
        ("bare `INSERT` + commit (the floor)", "floor_us", "per_floor_insert"),
        ("`@step`, sync mode", "step_us", "per_step"),
        ("empty workflow: start + finish", "empty_workflow_us", "per_empty_workflow"),
        ("round trip: `SELECT 1`", "round_trip_us", None),
    ):
        row = [label]
        for side in ("single", "citus"):
            row.append(_f(st[side][key]["median"], 0))
        row.append(_f(st["ratios"][key]))
        for side in ("single", "citus"):
            c = st[side][per] if per else None
            row.append(
                "-"
                if c is None
                else f"{_f(c['coordinator'])} / {_f(c['workers'])} / {_f(max(0.0, c['prepared']))}"
            )
        rows.append(row)
    ops = _table(
        [
            "what",
            "one server µs",
            "Citus µs",
            "Citus / one server",
            "one server: commits coord. / workers / 2PC",
            "Citus: commits coord. / workers / 2PC",
        ],
        rows,
    )
    tp = _table(
        [
            "target",
            "workers",
            "workflows / s",
            "Citus / one server",
            "coordinator commits / step",
            "worker commits / step",
            "2PC / workflow",
        ],
        [
            [
                "Citus" if r["target"] == "citus" else "one server",
                str(r["workers"]),
                _f(r["workflows_per_s"], 1),
                _f(r.get("ratio_to_single")),
                _f(r["coordinator_commits_per_step"]),
                _f(r["worker_commits_per_step"]),
                _f(max(0.0, r["prepared_per_workflow"])),
            ]
            for r in sorted(
                data["throughput"], key=lambda r: (r["workers"], r["target"] != "single")
            )
        ],
    )
    server = data["server"]
    return (
        f"{server['version']}, Citus {server['citus']}, fsync={server['fsync']} on every node; "
        f'{cfg["nodes"]}, {cfg["shards"]} shards per table. "One server" is a database on '
        "the coordinator's own server without the extension: same binaries, settings and "
        f"disk. {cfg['rounds']} rounds of {cfg['steps']} operations alternating the two, "
        "medians; commits counted per operation on every node (`pg_stat_database`), "
        "two-phase commits from `pg_dist_transaction`. Statements the client sent per step: "
        f"{_f(st['single']['statements_per_step'])} on one server, "
        f"{_f(st['citus']['statements_per_step'])} on Citus.\n\n"
        f"{ops}\n\nThroughput: {cfg['workflows']} queued workflows of 10 steps drained by N "
        f"`durable worker` processes ({cfg['concurrency']} workflows each), one server and "
        f"the cluster alternating.\n\n{tp}"
    )


def _generic(data: Any) -> str:
    rows = data if isinstance(data, list) else data.get("rows", [])
    if not rows or not isinstance(rows[0], dict):
        return "```json\n" + json.dumps(data, indent=2)[:4000] + "\n```"
    keys = [k for k, v in rows[0].items() if not isinstance(v, dict | list)]
    return _table(keys, [[_f(r.get(k)) for k in keys] for r in rows])


# What each target of the third performance round (the CPU a step costs) came to, and where
# the CPU left goes: measured A/B in one sitting, the code before and after.
THIRD_ROUND = """## The CPU a step costs, third round: targets, and where the CPU left goes

Wall ratios depend on the floor (a bare INSERT's commit: 0.10 ms on one disk, 0.3 ms on
another), so every benchmark now also reports, beside its wall ratios, the client's CPU
per step (the measuring thread's, `time.thread_time`, and the process's), the server's
(the backend's utime + stime from `/proc/<pid>/stat`, or `schedstat`), and statements and
commits per step (`benchmarks/_common.py`). A run writes no results file unless given
`--out PATH` (or `--save`, which overwrites `benchmarks/results/`). Measured A/B: the code
before this round (4471d76) and after, with the same benchmark programs, alternated in one
sitting on an idle 2-core machine, medians; this machine's floor INSERT costs 55-110 µs of
client CPU, so read the ratios.

- **Client CPU per sync step** (target: at most 1.6x the floor INSERT's CPU in the same
  run, about 45 µs). `benchmarks/step_cpu.py` (thread CPU in place: blocks of 50 steps
  inside one running workflow, each after 50 bare psycopg INSERTs in the same thread; 4
  runs each): **1.90x -> 1.34x** the floor (146 -> 107 µs; the floor 77-80 µs here).
  `benchmarks/step_overhead.py` (2 runs each): process CPU per step 127-161 -> **87-94 µs**,
  1.83-1.86x -> **1.47-1.54x** the floor's; wall, steps interleaved with the floor inside
  one workflow, **1.46x -> 1.22x** (the second round's target of 1.25x, met); `async` and
  `exit` modes 0.088x -> 0.056-0.064x. `benchmarks/checkpoint_overhead.py` (one run each,
  no peers), sync mode: 100 B 1.50x -> **1.23x** the floor (client CPU 226 -> 113 µs), 10
  KB 1.48x -> **1.14x** (192 -> 104 µs), 1 MB 1.85x -> **1.32x** (6.4 -> 1.2 ms of client
  CPU). What changed: the step's record and the run's outcome are prepared once per
  connection and sent on the raw libpq connection with their values as text (the server
  infers the types from the statement, so the rows are the same; a connection with another
  cursor factory, such as OpenTelemetry's instrumentation, goes the ordinary way so that
  its spans keep durable's statements); other statements reuse the connection's cursors; a
  value JSON keeps exactly is walked once (the proof that it reads back the same) and
  encoded once in C (orjson with `durable-pg[fast]`, where its bytes are json's; json's own
  C encoder otherwise); a lone group-commit writer lets the lead lapse under one lock; the
  plain step makes fewer calls (107 per step, from 155). What is left: psycopg's wait and
  libpq (the floor's own), the protocol generator's sends, the clock, the cancel and pause
  checks. A native record path would take the rest of the record's share (below).
- **`async def` step CPU** (target: at most 1.3x the sync step's). 211-270 -> 172-232 µs
  (0.79-0.86x), but **1.98-2.2x** a sync step now that the sync step is cheaper: not met.
  What is left: each record checks a connection out of the loop's pool and back (no
  connection is held while step code may await), and each wait registers the socket with
  the event loop and sets a timer; holding the run's connection across a step whose code
  does not await would remove the first.
- **`start(wf).result()`** (target: client CPU -30%). Wall 1,381-1,720 -> **1,091-1,133 µs**
  (-28%), 4.6-5.0x -> 4.0-4.8x the floor; its client CPU in `step_cpu.py` 755 -> 734 µs
  (-3%): not met. What is left: two pool checkouts (the create, the run), the create's
  INSERT through psycopg's cursor, the lifecycle generator, and the future and its locks.
- **Server CPU of a record statement** (target: at most 1.3x the floor INSERT's).
  `benchmarks/server_cpu.py` reads each backend's CPU over blocks of 2,000 statements, the
  floor INSERT, `record_step` and the same INSERT without its fence alternated, and with
  `--before REF` the statement and schema of an earlier revision in the same sitting
  (prepared, as durable sends it; 10 rounds): `record_step` **1.98x -> 1.49x** the floor
  (paired per round 1.81x -> 1.41x; 121 -> 91 µs, the floor 61 µs). The journal's four
  CHECK constraints are gone (migration 0041): PostgreSQL builds each CHECK expression anew
  for every statement that writes the table (the list of 14 kinds most of all), and none
  guarded against anything durable's statements can get wrong; an import, whose rows come
  from a file, checks them itself. Not met: the rest is the fence (the workflow's row read
  and locked FOR SHARE; the same INSERT without it is 1.20x), which is what keeps a run
  that lost its workflow from writing. Passing the finish time from the client instead of
  the column's default gained nothing measurable on the prepared path.
- **Throughput** (targets: worker CPU per step at most 80 µs; sync-mode steps/s with 4
  workers at least 0.5x the 16-connection INSERT rate). `benchmarks/throughput.py` now
  measures CPU over the window the steps/s are counted in (start-up and shutdown left out:
  the whole run's figure, 350 µs per step, is mostly start-up). 4 workers, sync, group
  commit, 2,000 workflows, 2 runs each: worker CPU per step **66 -> 49-67 µs** (met);
  3,627-3,698 -> **3,702-3,749 steps/s**, 0.36-0.39x -> **0.38-0.46x** the INSERT rate
  (8,200-9,900/s): not met. What is left is the server: **225 µs of server CPU per step**
  against 49-67 µs of the workers', on the same two cores (the record statement with its
  fence, the queue's claim and dequeue statements, the commits). A worker no longer runs a
  claim round each time a run ends while a backlog drains (rounds once per poll interval,
  at once on a notification, or right after a round that claimed something), and a step
  waiting on a shared commit waits on a bare lock.
- **Recovery** (target: 10,000 interrupted 10-step workflows in 1.5 s). `benchmarks/
  recovery.py --n 10000 --processes 0` (a worker loop in the benchmark's process; 3 runs
  each): **8.2 -> 7.1 s** (0.86x), client CPU per workflow 0.47 -> 0.40 ms, server 0.36 ->
  0.33 ms, statements per workflow 0.40 -> 0.33. Journals are read as tuples and a record
  is built only when the replay reaches it, a replayed step returns its journaled value
  without driving a generator, inputs stored by position are rebuilt without
  `signature.bind`, and a backlog's full claim rounds wake sleepers once per 50 ms. Not
  met: about 850 Python calls per workflow remain (claim, journal load, one connection
  checkout per run, the pool's future, replay, outcome), spread thin; reaching 1.5 s on
  this machine needs about 4.7x less CPU per workflow: overlapping the next claim with
  the current batch's load, a lighter run than a pool future, or more processes on more
  cores.
"""


# What each target of the second performance round came to, and where the time left goes.
# Measured A/B (the code before and after, alternated in one sitting) on the 2-core machine
# the tables above come from; the tables are the latest full run.
REMAINING = """## Targets, and where the time left goes

Measured A/B (the code before and after this round, alternated in one sitting, medians)
on the 2-core machine of the tables above.

- **`start(wf).result()` of an empty workflow** (target 2.5x the floor). A run started in
  this process now hands its stored output to its handle (no read-back: 2 statements, 2
  commits, down from 3), a caller that waits without a limit runs a run no thread has
  begun on its own thread (no hand-off and no wake-up between threads), and `start_async`
  creates the workflow on its event loop's own pool (no thread hop). Sync: 5.1-6.4x before,
  **3.9-4.2x** after (4.20x per round in the table above); async: 7.8-8.8x before,
  **3.4-4.6x** after (4.17x above). Client CPU per call: 760-840
  µs before, 500-610 µs after, against about 70 µs for the floor's one statement. What is
  left is Python spread thin (a CPU profile has no function above 10% of it): two pool
  checkouts, psycopg's query conversion and parameter dumping for two statements, the
  lifecycle and protocol generators, the future and its locks. What would remove it: one
  checkout for the create and the run, and a shorter path through the generators for a
  workflow with no steps.
- **Group commit across workflows, sync durability kept** (target: sync steps/s with 4
  workers >= the 16-connection INSERT rate). Step records of sync-mode runs written at the
  same moment now go in one statement and one commit (`durable/_io/finishes.py`, as outcomes
  already did); each run returns only after the commit that holds its record, and each
  record is fenced by its own run's epoch. With 4 workers x 8 workflows: commits per step
  1.25 -> **0.64**, WAL flushes per step 0.61 -> **0.38**, steps/s 2,600-2,900 -> 2,900-3,250,
  that is **0.33-0.40x** the 16-connection INSERT rate (7,900-8,700/s); in the table above,
  2,986-3,428 steps/s, 0.33-0.38x of 9,120/s. Not met, and the limit is the CPU, not the
  disk: the workers spend 0.39-0.47 ms of client CPU per step and the server 0.23-0.27 ms,
  so two cores top out near 3,000 steps/s whatever the commits cost.
  What would remove it: fewer Python instructions per step (the same cost as the
  next item), or more cores. Crash test: `tests/acceptance/test_group_commit_crash.py`
  kills a worker right after a shared commit and before its runs return.
- **Step paths.** A sync step: 1.37x the floor interleaved inside one workflow in an
  earlier run, 1.43x interleaved (1.44x by rounds) in the table above; target
  1.25x, not met, and the fence is not what is left. The fence is
  the statement itself (`INSERT ... SELECT ... FROM workflows WHERE (epoch, status) = ...
  FOR SHARE`), one round trip and one commit as the floor. Sent bare from psycopg, 9 rounds
  of 300 interleaved with the floor: **1.02x** the floor with `FOR SHARE` (56 more WAL
  bytes per record: the row lock), 1.03x with `FOR KEY SHARE`, 0.95x with no lock (which
  would let a zombie's record in: the lock is what makes its INSERT wait for a new
  owner's claim to commit, then find the epoch changed). What is left is the client: a
  sync step costs 140-160 µs of client CPU against 60-80 µs for the floor's statement
  (the step's protocol generator, serializing and checking its output, the driver's
  dispatch, the journal's bookkeeping), spread over a dozen functions with none above
  10%. `@transaction`: 1.31x the same transaction in an earlier run, 1.45x above (target 1.25x;
  its record goes in the application's own transaction, so no group commit applies).
  `async def` / sync: 1.23x wall (target 1.2x) and 1.81x client CPU (272 against 150 µs;
  target 1.5x): asyncio's own scheduling per await, and the async driver's dispatch.
  `durability="async"`: **0.06x** interleaved in an earlier run, **0.08x** above (target
  0.10x, met), 0.18-0.22x by rounds.
  These were not changed in this round.
- **Recovery across processes** (target: 10,000 interrupted 10-step workflows in 1 s).
  `durable worker --processes N` runs N workers with their own executor ids and
  heartbeats, sharing the claims row by row (FOR UPDATE SKIP LOCKED). 10,000 workflows,
  timed from the command's start (the table above): 1 process 6.2 s, **2 processes 5.3
  s**, 4 processes 5.7 s; a worker loop in this process 6.1 s (other runs, concurrency 16
  or 64 per process: 7.6-8.7, 6.3-7.4 and 8.5-9.7 s; 1,000 workflows are start-up). Not
  met: on 2 cores the workers' Python (claim, journal read, replay, outcome:
  about 0.7 ms of CPU per workflow across processes) and the server share the same two
  cores, so a second process gains little and a fourth loses. The limit would move with
  cores: each process is one core's worth of replay. Within a process, a CPU profile of a
  recovery puts the most time in rebuilding each journaled record (`StepRecord.from_row`)
  and decoding its output (`json.loads`), ten of each per workflow; a replay that decoded
  only the records a run reads, and kept rows as tuples, would cut that share.
"""


_NATIVE_ROWS = [
    ("step", "a sync `@step` in place, today"),
    ("step+native", "the same step with the native record path"),
    ("record", "the record path today: `run.keep` and psycopg's INSERT"),
    ("native", "the native record path: encode, exactness walk, libpq send"),
    ("psycopg", "a bare psycopg INSERT of the same statement, output encoded"),
    ("libpq", "raw libpq through the extension, output encoded"),
    ("keep", "`run.keep` alone, no I/O"),
    ("encode", "the extension's encode and walk alone, no I/O"),
]


def _native(data: dict[str, Any]) -> str:
    """The native record path experiment (benchmarks/native/, not part of the package)."""
    m = {name: row["median"] for name, row in data["summary"].items()}

    def ratio(x: float) -> str:
        return _f(x, 3 if x < 0.1 else 2)

    rows = [
        [what, _f(m[name], 1), ratio(m[name] / m["record"]), ratio(m[name] / m["step"])]
        for name, what in _NATIVE_ROWS
    ]
    load = data["load_average"]
    return (
        "## A native record path: an experiment\n\n"
        "`benchmarks/native/` (not part of the package; its README says how to build it) is "
        "a C extension that journals a sync step's output in one call: the JSON text, byte "
        "for byte what `JSONSerializer` writes, found in the same walk that checks the value "
        "reads back exactly (the rules of `faithful`), and the fenced `record_step` INSERT "
        "sent with libpq on the connection psycopg already holds. Client CPU per operation "
        "(`time.thread_time`), in one process inside one running workflow, the variants "
        f"alternated in blocks of {data['block']}, medians of {data['rounds']} rounds "
        f"(`python -m benchmarks.native.bench`; load average {load[0]:.0f}-{load[1]:.0f} on "
        f"{data['cpus']} CPUs while it ran: every number is inflated against an idle "
        "machine, the ratios much less):\n\n"
        + _table(["µs per operation", "µs", "x record path", "x step"], rows)
        + "\n\n"
        f"The native record path costs what raw libpq does ({_f(m['native'], 0)} against "
        f"{_f(m['libpq'], 0)} µs, {_f(m['native'] / m['record'])}x today's record path): in "
        f"C, encoding and checking cost {_f(m['encode'], 1)} µs against "
        f"{_f(m['keep'], 1)} µs in Python, and psycopg's Python layer is gone. What is left "
        "is the round trip itself in libpq and the kernel, which on a busy machine is most "
        "of it (a thread that sleeps through a commit wakes with cold caches). A whole step "
        f"with it costs {_f(m['step+native'] / m['step'])}x what it costs today "
        f"({_f(m['step+native'], 0)} against {_f(m['step'], 0)} µs): the rest is durable's "
        f"own protocol for a step (about {_f(m['step+native'] - m['native'], 0)} µs here), "
        "which this experiment leaves in Python. Adopting it would mean a wheel per "
        "platform and Python (cibuildwheel), today's pure-Python path kept as the fallback "
        "for everything else (no wheel, another serializer, an annotation to rebuild, group "
        "commits, the async driver), and sending on psycopg's connection behind its back; "
        "the README weighs it."
    )


def render() -> str:
    so = _load("step_overhead")
    parts = [
        "# Benchmarks",
        "",
        "Made by `python -m benchmarks.report` (every benchmark once, then this page; "
        "`--render` rewrites the page from the stored results in `benchmarks/results/`). "
        "Each benchmark is also a program of its own: `python -m benchmarks.<name> -h`. "
        "Every ratio compares numbers measured in the same run on the same server; "
        "microseconds move with the machine, ratios much less. Where the server's disk "
        "flush time varies from minute to minute (a virtual machine's often does: the "
        "floor's IQR shows it), read a ratio with its per-round IQR, and compare systems "
        "and modes within one table rather than across runs.",
        "",
    ]
    if so is not None:
        server = so["server"]
        client = so["client"]
        parts += [
            "## Where it was measured",
            "",
            f"- Server: {server['version'].split(' on ')[0]}, fsync={server['fsync']}, "
            f"synchronous_commit={server['synchronous_commit']}, "
            f"wal_sync_method={server['wal_sync_method']}, reached over "
            f"{server['host']}:{server['port']}.",
            f"- Client: Python {client['python']}, psycopg {client['psycopg']} "
            f"({client['psycopg_impl']}), durable {client['durable']}; "
            f"{platform.machine()}, {os.cpu_count()} CPUs.",
            "",
            "## One unit of work",
            "",
            "What a step, a workflow's start and finish, a `@transaction` step and an effect "
            "cost against the physical limit of a durable write on this server: one bare "
            "`INSERT` and its commit (`benchmarks/step_overhead.py`).",
            "",
            _units(so),
            "",
            "![step overhead](benchmarks/step_overhead.png)",
            "",
        ]
    parts += [THIRD_ROUND.rstrip(), ""]
    modes = _load("checkpoint_overhead")
    if modes:
        parts += [
            "## Durability modes and payload sizes",
            "",
            "Per step, for each durability mode, payload size and workflow length, plain "
            "`def` and `async def`, beside peers when installed "
            "(`benchmarks/checkpoint_overhead.py`). Every system runs in rounds interleaved "
            'with the floor; "x floor" is the median of its per-round ratios to the floor '
            "of the same round.",
            "",
            _modes(modes),
            "",
            "![checkpoint overhead](benchmarks/checkpoint_overhead.png)",
            "",
        ]
    recovery = _load("recovery")
    if recovery:
        parts += [
            "## Recovery",
            "",
            "One worker recovering workflows interrupted after all their steps were "
            "journaled: claim, journal read, replay, outcome (`benchmarks/recovery.py`).",
            "",
            _recovery(recovery),
            "",
        ]
    throughput = _load("throughput")
    if throughput:
        parts += [
            "## Throughput with many workers",
            "",
            "Worker processes draining a queue of 10-step workflows, against the server's own "
            "commit rate from plain `INSERT`s (`benchmarks/throughput.py`).",
            "",
            _throughput(throughput) if "durable" in throughput else _generic(throughput),
            "",
            "![throughput](benchmarks/throughput.png)",
            "",
        ]
    parts += [REMAINING.rstrip(), ""]
    native = _load("native_record")
    if native:
        parts += [_native(native), ""]
    cluster = _load("citus")
    if cluster:
        parts += [
            "## On a Citus cluster",
            "",
            "Step cost and throughput on a Citus coordinator with two workers beside one "
            "server, measured in one run (`benchmarks/citus.py`; it starts its own cluster). "
            "What it means for sizing a cluster: [Outgrowing one server](scaling.md), which "
            "also has the grid by shard count and worker processes (1, 2 and 4 processes at "
            "8, 32 and 64 shards, on the coordinator and spread over the worker nodes; "
            "`benchmarks/results/citus_grid.json`).",
            "",
            _citus(cluster),
            "",
            "![one server vs Citus](benchmarks/citus.png)",
            "",
            # A later, separate run (kept as written): where a transaction's table lives.
            *_stored_text("citus_transactions.md"),
        ]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None, write: Callable[[str], None] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    parser.add_argument(
        "--database-url", default=os.environ.get("DURABLE_BENCH_ADMIN_URL", DEFAULT_URL)
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--render", action="store_true", help="only rewrite the page")
    args = parser.parse_args(argv)
    if not args.render:
        _run_all(args.database_url, args.quick)
    page = render()
    if write is None:
        PAGE.write_text(page, "utf-8")
        print(f"wrote {PAGE.relative_to(ROOT)}")
    else:
        write(page)
    return page


if __name__ == "__main__":
    main()
