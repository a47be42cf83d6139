"""Operator actions of `durable.Client` (and of the Engine, which holds one): resume, fork,
their refusals, the CLI commands behind them, and what a Client does not do (run threads of
its own, register an executor).

Every test counts what really ran through `App.runs`, a list each step call appends to when
its body runs (a replayed step does not run its body), and checks the journal and the
stored status beside it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg_pool
import pytest

import durable
from durable import errors

N = 4
EXPECTED = [0, 10, 20, 30]  # tick(i) returns 10 * i (+ App.offset)

# The threads an Engine starts (heartbeat, worker loop, LISTEN, workflow pool, async
# writer); a Client must start none of them.
ENGINE_THREADS = ("durable-heartbeat", "durable-worker", "durable-listen", "durable-writer")
ENGINE_POOL_PREFIX = "durable-workflow"


@dataclass
class App:
    """One registry with one workflow, `<prefix>.run(tag, n, block_at, fail_at)`, which
    returns [tick(tag, i) for i in range(n)].

    tick appends (tag, i) to `runs` each time its body runs; at `block_at` it waits for
    `gate` (the first time only, until the gate is set); at `fail_at` it raises while
    `broken` holds True."""

    registry: durable.Registry
    workflow: Callable[..., list[int]]
    runs: list[tuple[str, int]] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    broken: list[bool] = field(default_factory=lambda: [True])
    offset: list[int] = field(default_factory=lambda: [0])

    def ran(self, tag: str) -> list[int]:
        return [i for t, i in self.runs if t == tag]


def make_app(prefix: str) -> App:
    registry = durable.Registry()
    app = App(registry, workflow=lambda *a: [])

    @durable.step(registry=registry, name=f"{prefix}.tick")
    def tick(tag: str, i: int, block: bool, fail: bool) -> int:
        app.runs.append((tag, i))
        if block and not app.gate.is_set():
            app.entered.set()
            assert app.gate.wait(10), "the test never released the gate"
        if fail and app.broken[0]:
            raise ValueError(f"tick {i} of {tag} is broken")
        return 10 * i + app.offset[0]

    @durable.workflow(registry=registry, name=f"{prefix}.run")
    def run(tag: str, n: int, block_at: int | None = None, fail_at: int | None = None) -> list[int]:
        return [tick(tag, i, i == block_at, i == fail_at) for i in range(n)]

    app.workflow = run
    return app


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def worker(url: str, app: App, **options: Any) -> durable.Engine:
    return durable.Engine(url, registry=app.registry, worker=True, poll_interval=0.05, **options)


def journal(client: durable.Client, workflow_id: str) -> list[tuple[int, str | None, Any]]:
    """(position, output, error type) of each journaled step."""
    out = []
    for s in client.steps(workflow_id):
        error = None if s.error is None else json.loads(s.error)["type"]
        out.append((s.step_seq, s.output, error))
    return out


def cancel_at_step_1(
    engine: durable.Engine, app: App, workflow_id: str, *, settle: bool = True
) -> None:
    """Run workflow `workflow_id` (tag = id) until tick 1 is in flight, cancel it there,
    then let the tick finish: the run stops before tick 2 and ends CANCELLED.

    With `settle`, also wait until the engine's heartbeat has forgotten the cancel request
    of the finished run: until then the engine cancels a run resumed by a Client again (a
    bug, see test_client_resume_right_after_a_workers_cancel)."""
    handle = engine.start(app.workflow, workflow_id, N, 1, workflow_id=workflow_id)
    assert app.entered.wait(10)
    assert engine.cancel(workflow_id, reason="operator") is durable.WorkflowStatus.RUNNING
    app.gate.set()
    with pytest.raises(errors.WorkflowCancelledError, match="operator"):
        handle.result(timeout=10)
    assert app.ran(workflow_id) == [0, 1]  # the tick in flight finished; no later one ran
    assert [s.step_seq for s in engine.steps(workflow_id)] == [0, 1]
    assert engine.get_workflow(workflow_id).status is durable.WorkflowStatus.CANCELLED
    if settle:
        wait_for(
            lambda: workflow_id not in engine.ownership.cancel_requests,
            what="the engine to forget the cancel request",
        )


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


# -- resume of a CANCELLED workflow ----------------------------------------------------------------


def test_engine_resume_of_a_cancelled_workflow_runs_only_the_steps_left(
    database_url: str,
) -> None:
    app = make_app("t1")
    # No worker loop: the engine runs what it starts, and what it resumes, itself.
    with durable.Engine(database_url, registry=app.registry) as engine:
        cancel_at_step_1(engine, app, "c")

        handle = engine.resume("c")
        assert handle.workflow_id == "c"
        assert handle.result(timeout=10) == EXPECTED
        assert app.ran("c") == [0, 1, 2, 3]  # ticks 0 and 1 replayed, not run again
        assert [s.step_seq for s in engine.steps("c")] == [0, 1, 2, 3]
        info = engine.get_workflow("c")
        assert info.status is durable.WorkflowStatus.SUCCESS
        assert info.error is None and info.recovery_attempts == 0


def test_client_resume_of_a_cancelled_workflow_is_run_by_a_worker(database_url: str) -> None:
    app = make_app("t2")
    with worker(database_url, app) as engine:
        handle = engine.submit(app.workflow, "c", N, 1, workflow_id="c")
        assert app.entered.wait(10)
        # A Client's cancel reaches the running engine through the database (its heartbeat
        # polls for requests); release the step only once the engine knows.
        with durable.Client(database_url) as client:
            assert client.cancel("c", reason="from a client") is durable.WorkflowStatus.RUNNING
        wait_for(
            lambda: "c" in engine.ownership.cancel_requests, what="the engine to see the cancel"
        )
        app.gate.set()
        with pytest.raises(errors.WorkflowCancelledError, match="from a client"):
            handle.result(timeout=10)
    assert app.ran("c") == [0, 1]

    # No engine runs now: the Client only records that the workflow may run again.
    with durable.Client(database_url) as client:
        resumed = client.resume("c")
        assert resumed.status() is durable.WorkflowStatus.PENDING
        assert client.executors() == []
        time.sleep(0.2)
        assert app.ran("c") == [0, 1]  # nothing ran it

        with worker(database_url, app):
            assert resumed.result(timeout=10) == EXPECTED
        assert app.ran("c") == [0, 1, 2, 3]
        assert [s.step_seq for s in client.steps("c")] == [0, 1, 2, 3]
        assert client.get_workflow("c").status is durable.WorkflowStatus.SUCCESS


def test_engine_resume_right_after_its_own_cancel(database_url: str) -> None:
    app = make_app("t3")
    engine = durable.Engine(database_url, registry=app.registry)
    # The engine's heartbeat does not poll for cancel requests during this test, so the
    # request this engine recorded for its own run stays in engine.ownership.cancel_requests: the
    # resume alone must keep it from stopping the resumed run.
    engine._services.heartbeat.cancel_poll_interval = 60.0
    with engine:
        cancel_at_step_1(engine, app, "c", settle=False)
        handle = engine.resume("c")
        assert handle.result(timeout=10) == EXPECTED
        assert app.ran("c") == [0, 1, 2, 3]


def test_client_resume_right_after_a_workers_cancel(database_url: str) -> None:
    app = make_app("t3b")
    engine = worker(database_url, app)
    engine._services.heartbeat.cancel_poll_interval = 60.0  # makes the window last the whole test
    with engine, durable.Client(database_url) as client:
        cancel_at_step_1(engine, app, "c", settle=False)
        handle = client.resume("c")
        assert handle.result(timeout=10) == EXPECTED
        assert app.ran("c") == [0, 1, 2, 3]


# -- resume of an ERROR workflow -------------------------------------------------------------------


def test_resume_of_a_failed_workflow_reruns_the_failed_step_and_replays_the_rest(
    database_url: str,
) -> None:
    registry = durable.Registry()
    runs: list[str] = []
    broken = [True]

    @durable.step(registry=registry, name="t4.load")
    def load(x: int) -> int:
        runs.append("load")
        return x + 1

    @durable.step(registry=registry, name="t4.probe")
    def probe() -> str:
        runs.append("probe")
        if runs.count("probe") == 1:
            raise KeyError("not there the first time")
        return "found"

    @durable.step(registry=registry, name="t4.check")
    def check(x: int) -> int:
        runs.append("check")
        return x

    @durable.step(registry=registry, name="t4.flaky")
    def flaky(x: int) -> int:
        runs.append("flaky")
        if broken[0]:
            raise ValueError("the service is down")
        return x * 10

    @durable.step(registry=registry, name="t4.save")
    def save(x: int) -> int:
        runs.append("save")
        return x + 5

    @durable.workflow(registry=registry, name="t4.pipeline")
    def pipeline(x: int) -> int:
        a = load(x)
        try:
            probe()  # fails the first time; the workflow handles that and goes on
        except KeyError:
            a += 100
        return save(flaky(check(a)))

    with durable.Engine(database_url, registry=registry, worker=True, poll_interval=0.05) as engine:
        handle = engine.submit(pipeline, 1, workflow_id="e")
        with pytest.raises(errors.WorkflowFailedError, match="the service is down") as failed:
            handle.result(timeout=10)
        assert failed.value.error_type == "builtins.ValueError"
        assert runs == ["load", "probe", "check", "flaky"]
        assert handle.status() is durable.WorkflowStatus.ERROR
        assert journal(engine, "e") == [
            (0, "2", None),
            (1, None, "builtins.KeyError"),
            (2, "102", None),
            (3, None, "builtins.ValueError"),
        ]

        broken[0] = False  # the operator fixes the service
        resumed = engine.resume("e")
        assert resumed.result(timeout=10) == 102 * 10 + 5
        # The failure that ended the run (after the last step that succeeded) runs again;
        # everything before it replays from the journal, the handled probe failure
        # included (probe would succeed now, and the result would be 25).
        assert runs == ["load", "probe", "check", "flaky", "flaky", "save"]
        assert journal(engine, "e") == [
            (0, "2", None),
            (1, None, "builtins.KeyError"),
            (2, "102", None),
            (3, "1020", None),
            (4, "1025", None),
        ]
        info = engine.get_workflow("e")
        assert info.status is durable.WorkflowStatus.SUCCESS
        assert info.error is None


# -- resume of a MAX_RECOVERY_ATTEMPTS_EXCEEDED workflow -------------------------------------------


def test_resume_of_a_workflow_given_up_after_crashes(database_url: str) -> None:
    """Workers that stop heartbeating mid-step (as a killed process does: nobody renews or
    releases the lease) make the workflow crash its worker again and again, until a claim
    gives up on it; resume then lets a healthy worker finish it."""
    registry = durable.Registry()
    runs: list[str] = []
    gate = threading.Event()

    @durable.step(registry=registry, name="t5.first")
    def first() -> str:
        runs.append("first")
        return "a"

    @durable.step(registry=registry, name="t5.hang")
    def hang() -> str:
        runs.append("hang")
        assert gate.wait(10), "the test never released the gate"
        runs.append("hang-returned")
        return "b"

    @durable.step(registry=registry, name="t5.last")
    def last() -> str:
        runs.append("last")
        return "c"

    @durable.workflow(registry=registry, name="t5.job")
    def job() -> str:
        return first() + hang() + last()

    def crashing_engine() -> durable.Engine:
        return durable.Engine(
            database_url,
            registry=registry,
            lease_seconds=0.3,
            max_recovery_attempts=1,
            max_workers=1,
        )

    with durable.Client(database_url) as client:
        handle = client.submit(job, workflow_id="m")
        zombies = []
        try:
            # The first claim runs it; the second recovers it (1 attempt, the allowed one).
            for attempt in (1, 2):
                engine = crashing_engine()
                engine.launch()
                zombies.append(engine)
                assert [h.workflow_id for h in engine.recover()] == ["m"]
                wait_for(lambda n=attempt: runs.count("hang") == n, what="the hanging step")
                engine.shutdown(wait=False)  # heartbeat stops, the lease is not released
                time.sleep(0.5)  # past the lease
            assert runs == ["first", "hang", "hang"]

            # The next claim gives up: the workflow crashed its worker too often.
            with crashing_engine() as third:
                assert third.recover() == []
            info = client.get_workflow("m")
            assert info.status is durable.WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED
            assert info.owner is None
        finally:
            gate.set()
        # The stuck runs wake up now, but their epoch is stale: they record nothing.
        for zombie in zombies:
            wait_for(lambda z=zombie: z.runner.running_count() == 0, what="the stale runs to end")
        assert runs.count("hang-returned") == 2 and "last" not in runs
        assert journal(client, "m") == [(0, '"a"', None)]
        assert handle.status() is durable.WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED

        client.resume("m")
        info = client.get_workflow("m")
        assert info.status is durable.WorkflowStatus.PENDING
        assert info.recovery_attempts == 0
        runs.clear()
        with durable.Engine(
            database_url, registry=registry, worker=True, poll_interval=0.05, max_workers=1
        ):
            assert handle.result(timeout=10) == "abc"
        assert runs == ["hang", "hang-returned", "last"]  # `first` replayed
        assert [s.step_name for s in client.steps("m")] == ["t5.first", "t5.hang", "t5.last"]
        assert client.get_workflow("m").status is durable.WorkflowStatus.SUCCESS


# -- fork ------------------------------------------------------------------------------------------


def test_fork_reuses_the_steps_before_from_step_and_runs_the_rest(database_url: str) -> None:
    app = make_app("t6")
    app.gate.set()
    with worker(database_url, app) as engine:
        assert engine.start(app.workflow, "w", N, workflow_id="orig").result(10) == EXPECTED
        assert app.ran("w") == [0, 1, 2, 3]
        app.runs.clear()
        app.offset[0] = 1  # tick runs give other values from now on

        fork = engine.fork("orig", from_step=2, new_id="orig-fork")
        assert isinstance(fork, durable.WorkflowHandle)
        assert fork.workflow_id == "orig-fork"
        # Ticks 0 and 1 replay the original's outputs; ticks 2 and 3 run again.
        assert fork.result(timeout=10) == [0, 10, 21, 31]
        assert app.ran("w") == [2, 3]
        assert [s.output for s in engine.steps("orig-fork")] == ["0", "10", "21", "31"]
        info = engine.get_workflow("orig-fork")
        assert info.status is durable.WorkflowStatus.SUCCESS
        assert info.inputs == engine.get_workflow("orig").inputs

        # from_step=0 reuses nothing; the id defaults to a new one.
        again = engine.fork("orig", from_step=0)
        assert again.workflow_id not in ("orig", "orig-fork")
        assert again.result(timeout=10) == [1, 11, 21, 31]
        assert app.ran("w") == [2, 3, 0, 1, 2, 3]

        # Refusals, from an Engine and from a Client; none of them stores anything.
        with durable.Client(database_url) as client:
            before = [(w.workflow_id, w.status, w.epoch) for w in client.list_workflows()]
            for actor in (engine, client):
                with pytest.raises(errors.ConfigurationError, match="'orig-fork' is taken"):
                    actor.fork("orig", from_step=1, new_id="orig-fork")
                with pytest.raises(errors.ConfigurationError, match="'orig' is taken"):
                    actor.fork("orig", from_step=1, new_id="orig")
                with pytest.raises(errors.ConfigurationError, match="from_step=-1"):
                    actor.fork("orig", from_step=-1)
                with pytest.raises(errors.WorkflowNotFoundError, match="'nope'"):
                    actor.fork("nope", from_step=0, new_id="from-nothing")
            after = [(w.workflow_id, w.status, w.epoch) for w in client.list_workflows()]
            assert after == before
            assert [s.output for s in client.steps("orig-fork")] == ["0", "10", "21", "31"]
        assert app.ran("w") == [2, 3, 0, 1, 2, 3]


# -- refusals and aliases --------------------------------------------------------------------------


def test_resume_of_a_succeeded_workflow_returns_it_untouched_and_refuses_unknown_ones(
    database_url: str,
) -> None:
    """As DBOS's resume_workflow: resuming a finished workflow gives back its handle and runs
    nothing, so scripts may call resume unconditionally."""
    app = make_app("t7")
    app.gate.set()
    with worker(database_url, app) as engine:
        assert engine.start(app.workflow, "s", 2, workflow_id="done").result(10) == [0, 10]
        stored = engine.get_workflow("done")
        with durable.Client(database_url) as client:
            # The engine offers resume; the alias is its client's (as every Client's).
            aliases = (engine.client.resume_workflow, client.resume_workflow)
            for resume in (engine.resume, client.resume, *aliases):
                handle = resume("done")
                assert handle.workflow_id == "done"
                assert handle.result(timeout=5) == [0, 10]
                with pytest.raises(errors.WorkflowNotFoundError, match="'nope'"):
                    resume("nope")
            assert client.get_workflow("done") == stored  # untouched: same epoch, output
            assert client.list_workflows() == [stored]
        assert app.ran("s") == [0, 1]


def test_resume_and_fork_aliases(database_url: str) -> None:
    # The aliases are the Client's; the Engine shows resume and fork only (engine.client
    # has the aliases).
    assert durable.Client.resume_workflow is durable.Client.resume
    assert durable.Client.fork_workflow is durable.Client.fork
    app = make_app("t8")
    with worker(database_url, app) as engine:
        cancel_at_step_1(engine, app, "c")
        with durable.Client(database_url) as client:
            forked = client.fork_workflow("c", from_step=1, new_id="c-fork")
            assert forked.result(timeout=10) == EXPECTED
            assert app.ran("c") == [0, 1, 1, 2, 3]
            resumed = client.resume_workflow("c")
            assert resumed.result(timeout=10) == EXPECTED
            assert app.ran("c") == [0, 1, 1, 2, 3, 2, 3]


# -- what a Client does not do ---------------------------------------------------------------------


def _engine_threads(threads: set[threading.Thread] | None = None) -> list[str]:
    return [
        t.name
        for t in (threading.enumerate() if threads is None else threads)
        if t.name in ENGINE_THREADS or t.name.startswith(ENGINE_POOL_PREFIX)
    ]


def _new_threads(before: set[threading.Thread]) -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t not in before}


def test_a_client_runs_nothing_and_registers_no_executor(database_url: str) -> None:
    app = make_app("t9")
    # Engines of earlier tests stop their LISTEN threads asynchronously; wait them out so
    # that the counts below are this test's only. (Engines shut down with wait=False leak
    # their never-stopped "durable-writer" thread: those stay, and do not change counts.)
    wait_for(
        lambda: set(_engine_threads()) <= {"durable-writer"},
        what="the threads of earlier engines to end",
    )

    # The threads a bare connection pool of psycopg_pool has (its scheduler and workers):
    # the only ones a Client may have while it is connected.
    before = set(threading.enumerate())
    pool = psycopg_pool.ConnectionPool(database_url, min_size=1, max_size=4, open=True)
    pool_threads = len(_new_threads(before))
    pool.close()
    wait_for(lambda: not _new_threads(before), what="the bare pool's threads to end")

    baseline = threading.active_count()
    before = set(threading.enumerate())
    client = durable.Client(database_url)
    assert threading.active_count() == baseline  # constructing connects nothing
    with client:
        connected = threading.active_count()
        opened = _new_threads(before)
        assert connected == baseline + pool_threads
        assert len(opened) == pool_threads

        first = client.submit(app.workflow, "a", N, workflow_id="a")
        second = client.submit(app.workflow, "b", N, workflow_id="b")
        assert [w.workflow_id for w in client.list_workflows()] == ["b", "a"]
        client.send("b", {"hello": 1}, topic="greeting")
        assert client.cancel("a") is durable.WorkflowStatus.CANCELLED  # never started
        assert client.get_workflow("b").status is durable.WorkflowStatus.PENDING
        assert client.executors() == []

        assert threading.active_count() == connected
        assert _new_threads(before) == opened  # no operation started a thread
        assert _engine_threads(opened) == []
        time.sleep(0.3)
        # Nothing ran: no step, no journal, no owner.
        assert app.runs == []
        assert client.steps("a") == [] and client.steps("b") == []
        assert second.status() is durable.WorkflowStatus.PENDING
        assert first.status() is durable.WorkflowStatus.CANCELLED
        assert client.get_workflow("b").owner is None
    wait_for(lambda: threading.active_count() == baseline, what="the pool's threads to end")
    assert not any(t.is_alive() for t in opened)

    # The executors table is empty for a Client and holds a row while an Engine runs.
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM durable.executors").fetchone() == (0,)
    with durable.Client(database_url) as client:
        assert client.executors() == []
        with worker(database_url, app) as engine:
            assert [e["executor_id"] for e in client.executors()] == [engine.executor_id]
            assert client.retrieve("b").result(timeout=10) == EXPECTED
        assert client.executors() == []


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_resume_says_it_resumed_even_when_a_worker_finished_it_before_it_looked(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    """`durable workflows resume` read the status after resuming: a worker that claimed
    (or finished) the workflow in between made it print 'still going, nothing to
    resume' or 'already succeeded'. A trigger stands for a worker that is that quick."""
    app = make_app("t11")
    with worker(database_url, app) as engine:
        cancel_at_step_1(engine, app, "c")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """
            CREATE FUNCTION quick_worker() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.status = 'PENDING' AND OLD.status = 'CANCELLED' THEN
                    NEW.status := 'SUCCESS';
                    NEW.output := '"done"';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER quick_worker BEFORE UPDATE ON durable.workflows
                FOR EACH ROW EXECUTE FUNCTION quick_worker();
            """
        )
    out = cli(subprocess_env, "workflows", "resume", "c", "--database-url", database_url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "resumed c: a worker will pick it up"


def test_cli_resume_and_fork_act_like_the_python_methods(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    app = make_app("t10")
    url = ["--database-url", database_url]
    with worker(database_url, app) as engine:
        failed = engine.submit(app.workflow, "e", N, None, 2, workflow_id="e")
        with pytest.raises(errors.WorkflowFailedError, match="tick 2 of e is broken"):
            failed.result(timeout=10)
        cancel_at_step_1(engine, app, "c")
    assert app.ran("e") == [0, 1, 2]
    app.broken[0] = False

    out = cli(subprocess_env, "workflows", "resume", "e", *url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "resumed e: a worker will pick it up"
    out = cli(subprocess_env, "workflows", "fork", "c", "--from-step", "1", "--new-id", "cf", *url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cf"

    with durable.Client(database_url) as client:
        assert client.get_workflow("e").status is durable.WorkflowStatus.PENDING
        assert client.get_workflow("cf").status is durable.WorkflowStatus.PENDING
        assert client.get_workflow("c").status is durable.WorkflowStatus.CANCELLED
        assert [s.step_seq for s in client.steps("cf")] == [0]  # copied before position 1
        assert app.ran("e") == [0, 1, 2] and app.ran("c") == [0, 1]  # the CLI ran nothing

        with worker(database_url, app):
            assert client.retrieve("e").result(timeout=10) == EXPECTED
            assert client.retrieve("cf").result(timeout=10) == EXPECTED
            assert app.ran("e") == [0, 1, 2, 2, 3]  # only the failed tick and the rest
            assert app.ran("c") == [0, 1, 1, 2, 3]  # the fork ran ticks 1 to 3
            assert client.get_workflow("c").status is durable.WorkflowStatus.CANCELLED

            out = cli(subprocess_env, "workflows", "resume", "c", *url)
            assert out.returncode == 0, out.stderr
            assert "resumed c" in out.stdout
            assert client.retrieve("c").result(timeout=10) == EXPECTED
            assert app.ran("c") == [0, 1, 1, 2, 3, 2, 3]  # resume ran ticks 2 and 3 only

        # A succeeded workflow is left as it is; refusals exit 1 and change nothing.
        done = cli(subprocess_env, "workflows", "resume", "e", *url)
        assert done.returncode == 0 and "already succeeded" in done.stdout
        taken = cli(
            subprocess_env, "workflows", "fork", "e", "--from-step", "0", "--new-id", "c", *url
        )
        assert taken.returncode == 1 and "'c' is taken" in taken.stderr
        missing = cli(subprocess_env, "workflows", "fork", "nope", "--from-step", "0", *url)
        assert missing.returncode == 1 and "'nope'" in missing.stderr
        assert sorted(w.workflow_id for w in client.list_workflows()) == ["c", "cf", "e"]
        assert all(w.status is durable.WorkflowStatus.SUCCESS for w in client.list_workflows())
