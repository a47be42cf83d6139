"""durable.patched() in one process, both drivers: a run suspended on the old code (at a
recv) resumes on the new code, registered under the same name, through the old branch;
a run started on the new code takes the new branch; deprecate_patch passes over the
marker of a run that took the patch. Every step call is counted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durable
from durable import errors

Calls = list[str]


def deploys(asynchronous: bool, calls: Calls) -> dict[str, tuple[durable.Registry, Any]]:
    """Three registries of the same workflow `patching.flow`: old code, patched, deprecated."""
    return {deploy: _deploy(deploy, asynchronous, calls) for deploy in DEPLOYS}


DEPLOYS = ("old", "patched", "deprecated")


def _deploy(deploy: str, asynchronous: bool, calls: Calls) -> tuple[durable.Registry, Any]:
    """One deploy's registry and workflow (a function of its own, so that each workflow's
    body calls its own deploy's steps)."""
    reg = durable.Registry()

    def make_step(name: str) -> Any:
        if asynchronous:

            @durable.step(registry=reg, name=f"patching.{name}")
            async def step_async() -> str:
                calls.append(f"{deploy}:{name}")
                return name

            return step_async

        @durable.step(registry=reg, name=f"patching.{name}")
        def step() -> str:
            calls.append(f"{deploy}:{name}")
            return name

        return step

    first, old, new, tail = (make_step(n) for n in ("first", "old", "new", "tail"))
    if asynchronous:

        @durable.workflow(registry=reg, name="patching.flow")
        async def flow_async(deploy: str = deploy) -> list[Any]:
            done = [await first()]
            if deploy == "old":
                done.append(await old())
            elif deploy == "patched":
                done.append(await (new() if await durable.patched_async("p") else old()))
            else:
                durable.deprecate_patch("p")
                done.append(await new())
            await durable.recv_async(timeout=60)  # the deploy changes while it waits
            return [*done, await tail()]

        return reg, flow_async
    else:

        @durable.workflow(registry=reg, name="patching.flow")
        def flow(deploy: str = deploy) -> list[Any]:
            done = [first()]
            if deploy == "old":
                done.append(old())
            elif deploy == "patched":
                done.append(new() if durable.patched("p") else old())
            else:
                durable.deprecate_patch("p")
                done.append(new())
            durable.recv(timeout=60)  # the deploy changes while it waits
            return [*done, tail()]

        return reg, flow


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_patch_under_suspended_runs(database_url: str, asynchronous: bool) -> None:
    calls: Calls = []
    regs = deploys(asynchronous, calls)

    def engine(deploy: str) -> durable.Engine:
        return durable.Engine(
            database_url, registry=regs[deploy][0], worker=True, poll_interval=0.05
        )

    # Runs on the old code and on the patched code, each past the patch point and waiting
    # for a message when the next deploy takes over.
    with engine("old") as old:
        old.submit(regs["old"][1], workflow_id="from-old")
        wait_for_status(old, "from-old", durable.WorkflowStatus.SUSPENDED)
    with engine("patched") as patched:
        patched.send("from-old", "go")
        assert patched.retrieve("from-old").result(timeout=30) == ["first", "old", "tail"]
        patched.submit(regs["patched"][1], workflow_id="from-patched")
        wait_for_status(patched, "from-patched", durable.WorkflowStatus.SUSPENDED)
    with engine("deprecated") as deprecated:
        deprecated.send("from-patched", "go")
        assert deprecated.retrieve("from-patched").result(timeout=30) == ["first", "new", "tail"]
        steps = [s.step_name for s in deprecated.steps("from-patched")]
        assert steps[:3] == ["patching.first", "patch:p", "patching.new"]
        deprecated.submit(regs["deprecated"][1], workflow_id="from-deprecated")
        deprecated.send("from-deprecated", "go")
        assert deprecated.retrieve("from-deprecated").result(timeout=30) == [
            "first",
            "new",
            "tail",
        ]
        assert "patch:p" not in [s.step_name for s in deprecated.steps("from-deprecated")]
    assert calls == [
        "old:first",
        "old:old",
        "patched:tail",  # replayed the old branch on the new code: no NondeterminismError
        "patched:first",
        "patched:new",
        "deprecated:tail",  # passed over the marker, replayed the new branch
        "deprecated:first",
        "deprecated:new",
        "deprecated:tail",
    ]


def test_a_patch_id_is_checked_and_patched_is_for_workflow_code(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="patching.bad")
    def bad() -> bool:
        return durable.patched("")

    with pytest.raises(errors.ConfigurationError, match="patch_id"):
        durable.patched("")
    with pytest.raises(errors.NoEngineError, match="from a workflow"):
        durable.patched("x")
    with pytest.raises(errors.NoEngineError, match="from a workflow"):
        durable.deprecate_patch("x")
    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(errors.WorkflowFailedError, match="patch_id"):
            engine.start(bad).result(timeout=10)

    async def main() -> None:
        with pytest.raises(errors.NoEngineError):
            await durable.patched_async("x")

    asyncio.run(main())


def wait_for_status(
    engine: durable.Engine, workflow_id: str, status: durable.WorkflowStatus
) -> None:
    import time

    deadline = time.monotonic() + 30
    while engine.get_workflow(workflow_id).status is not status:
        assert time.monotonic() < deadline, engine.get_workflow(workflow_id)
        time.sleep(0.05)


def test_code_that_does_not_match_the_journal_ends_error_without_undoing(
    database_url: str,
) -> None:
    """A NondeterminismError (a deploy without the patch, a move to the wrong version) is a
    mismatch of code, not a failure of the work: nothing is compensated, the run ends ERROR
    and is resumed once code that matches is deployed."""
    charged: list[str] = []
    refunded: list[str] = []

    def deploy(matching: bool) -> tuple[durable.Registry, Any]:
        reg = durable.Registry()

        @durable.effect(registry=reg, name="mismatch.charge", idempotent=True)
        def charge(*, idempotency_key: str) -> str:
            charged.append(idempotency_key)
            return "charged"

        @charge.compensation  # type: ignore[attr-defined]
        @durable.effect(registry=reg, name="mismatch.refund", idempotent=True)
        def refund(*, idempotency_key: str) -> None:
            refunded.append(idempotency_key)

        @durable.step(registry=reg, name="mismatch.other")
        def other() -> str:
            return "other"

        @durable.workflow(registry=reg, name="mismatch.flow")
        def flow() -> list[Any]:
            done: list[Any] = [charge()]
            if not matching:
                done.append(other())  # where the journal holds the recv's deadline
            done.append(durable.recv(timeout=60))
            return done

        return reg, flow

    def engine(reg: durable.Registry) -> durable.Engine:
        return durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05)

    good, good_flow = deploy(True)
    with engine(good) as first:
        first.submit(good_flow, workflow_id="m")
        wait_for_status(first, "m", durable.WorkflowStatus.SUSPENDED)
    wrong, _ = deploy(False)
    with engine(wrong) as second:
        second.send("m", "go")
        with pytest.raises(errors.WorkflowFailedError, match="NondeterminismError"):
            second.retrieve("m").result(timeout=30)
        assert second.get_workflow("m").status is durable.WorkflowStatus.ERROR
    assert refunded == []  # nothing undone
    with engine(good) as third:
        third.resume("m")
        assert third.retrieve("m").result(timeout=30) == ["charged", "go"]
    assert charged == ["m:0"]  # charged once, across all three
