"""A @transaction step whose code fights its transaction: ends it itself, makes it
read-only, or leaves a deferred constraint that fails at COMMIT. Each gets a clear error
of a known family, journaled as the step's failure; nothing is recorded as a success
that did not commit with its record, and nothing hangs as an outage."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import sqlalchemy
import sqlalchemy.exc
from sqlalchemy import text

import durable
from durable import errors

MODES = ["sync", "async"]


def ledger(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT what FROM ledger ORDER BY what")]


def make_app(url: str, mode: str, body: str) -> tuple[durable.Registry, Any, list[int]]:
    """A workflow around one transaction step that inserts a ledger row, then does `body`
    to its connection; `calls` counts the step's runs."""
    reg = durable.Registry()
    calls: list[int] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (what text)")

    if mode == "sync":

        @durable.transaction(registry=reg, name="write")
        def write(conn: sqlalchemy.Connection) -> str:
            calls.append(1)
            if body.startswith("read_only"):
                conn.execute(text("SET TRANSACTION READ ONLY"))
                if body == "read_only_write":
                    conn.execute(text("INSERT INTO ledger VALUES ('x')"))
                return "read"
            conn.execute(text("INSERT INTO ledger VALUES ('x')"))
            if body.startswith("sql_"):  # COMMIT or ROLLBACK as a statement of its own
                conn.exec_driver_sql(body[4:].upper())
            elif body == "swallow":
                try:
                    conn.execute(text("SELECT 1 / 0"))
                except sqlalchemy.exc.DBAPIError:
                    pass  # and carry on, in an aborted transaction
            else:
                getattr(conn, body)()
            return "wrote"

        @durable.workflow(registry=reg, name="flow")
        def flow() -> str:
            return write()

    else:

        @durable.transaction(registry=reg, name="write")
        async def write_async(conn: Any) -> str:
            calls.append(1)
            if body.startswith("read_only"):
                await conn.execute(text("SET TRANSACTION READ ONLY"))
                if body == "read_only_write":
                    await conn.execute(text("INSERT INTO ledger VALUES ('x')"))
                return "read"
            await conn.execute(text("INSERT INTO ledger VALUES ('x')"))
            if body.startswith("sql_"):
                await conn.exec_driver_sql(body[4:].upper())
            elif body == "swallow":
                try:
                    await conn.execute(text("SELECT 1 / 0"))
                except sqlalchemy.exc.DBAPIError:
                    pass
            else:
                await getattr(conn, body)()
            return "wrote"

        @durable.workflow(registry=reg, name="flow")
        async def flow_async() -> str:
            return await write_async()

        flow = flow_async
    return reg, flow, calls


def run_to_failure(url: str, reg: durable.Registry, flow: Any, mode: str) -> Any:
    """Run the workflow to its failure; return the failure and the journal."""

    async def main() -> Any:
        async with durable.Engine(url, registry=reg) as engine:
            handle = await engine.start_async(flow, workflow_id="w")
            with pytest.raises(errors.WorkflowFailedError) as failed:
                await handle.result(timeout=20)
            return failed.value, engine.steps("w")

    if mode == "async":
        return asyncio.run(main())
    with durable.Engine(url, registry=reg) as engine:
        with pytest.raises(errors.WorkflowFailedError) as failed:
            engine.start(flow, workflow_id="w").result(timeout=20)
        return failed.value, engine.steps("w")


def journaled_failure(steps: Any) -> str:
    """The one step's journaled error: a failure, never a success."""
    (step,) = steps
    assert step.output is None and step.error is not None
    return str(step.error)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("body", ["commit", "rollback", "close", "sql_commit", "sql_rollback"])
def test_a_step_that_ends_its_own_transaction_fails_with_a_clear_error(
    database_url: str, mode: str, body: str
) -> None:
    reg, flow, calls = make_app(database_url, mode, body)
    failure, steps = run_to_failure(database_url, reg, flow, mode)
    assert failure.error_type.endswith("TransactionStepError")
    assert "ended the transaction itself" in failure.error_message
    assert "leave the connection open" in failure.error_message
    # Journaled as the step's failure, so a replay raises it instead of running it again.
    assert "TransactionStepError" in journaled_failure(steps) and calls == [1]
    # What the step's code committed itself stays committed; nothing else does.
    assert ledger(database_url) == (["x"] if body.endswith("commit") else [])


@pytest.mark.parametrize("mode", MODES)
def test_a_step_that_makes_its_transaction_read_only_fails_not_waits(
    database_url: str, mode: str
) -> None:
    reg, flow, calls = make_app(database_url, mode, "read_only")
    failure, steps = run_to_failure(database_url, reg, flow, mode)
    assert failure.error_type.endswith("TransactionStepError")
    assert "READ ONLY" in failure.error_message and "@step" in failure.error_message
    assert "TransactionStepError" in journaled_failure(steps) and calls == [1]


@pytest.mark.parametrize("mode", MODES)
def test_a_write_refused_by_the_steps_read_only_transaction_is_its_error(
    database_url: str, mode: str
) -> None:
    """The server refuses it as it would refuse any write on a standby, but the server is
    no standby: the step failed, the database did not go away."""
    reg, flow, calls = make_app(database_url, mode, "read_only_write")
    failure, steps = run_to_failure(database_url, reg, flow, mode)
    assert failure.error_type.endswith("InternalError")
    assert "read-only transaction" in failure.error_message
    assert "read-only transaction" in journaled_failure(steps) and calls == [1]


@pytest.mark.parametrize("mode", MODES)
def test_a_deferred_constraint_failing_at_commit_raises_sqlalchemys_integrity_error(
    database_url: str, mode: str
) -> None:
    """The record and the COMMIT go in one pipeline below SQLAlchemy; an error at COMMIT
    still reaches the workflow as SQLAlchemy's own IntegrityError, as it would from
    `conn.commit()`."""
    reg = durable.Registry()
    calls: list[int] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE parents (id int PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED)"
        )
    orphan = text("INSERT INTO children VALUES (42)")

    if mode == "sync":

        @durable.transaction(registry=reg, name="adopt")
        def adopt(conn: sqlalchemy.Connection) -> str:
            calls.append(1)
            conn.execute(orphan)  # checked at COMMIT, not here
            return "adopted"

        @durable.workflow(registry=reg, name="family")
        def family() -> str:
            try:
                return adopt()
            except sqlalchemy.exc.IntegrityError as exc:
                return f"refused: {type(exc.orig).__name__}"

        with durable.Engine(database_url, registry=reg) as engine:
            assert engine.start(family, workflow_id="f").result(timeout=20) == (
                "refused: ForeignKeyViolation"
            )
            (step,) = engine.steps("f")
    else:

        @durable.transaction(registry=reg, name="adopt")
        async def adopt_async(conn: Any) -> str:
            calls.append(1)
            await conn.execute(orphan)
            return "adopted"

        @durable.workflow(registry=reg, name="family")
        async def family_async() -> str:
            try:
                return await adopt_async()
            except sqlalchemy.exc.IntegrityError as exc:
                return f"refused: {type(exc.orig).__name__}"

        async def main() -> Any:
            async with durable.Engine(database_url, registry=reg) as engine:
                handle = await engine.start_async(family_async, workflow_id="f")
                assert await handle.result(timeout=20) == "refused: ForeignKeyViolation"
                return engine.steps("f")

        (step,) = asyncio.run(main())
    assert step.error is not None and calls == [1]
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM children").fetchone() == (0,)


@pytest.mark.parametrize("mode", MODES)
def test_a_step_that_swallows_a_database_error_fails_with_a_clear_error(
    database_url: str, mode: str
) -> None:
    reg, flow, calls = make_app(database_url, mode, "swallow")
    failure, steps = run_to_failure(database_url, reg, flow, mode)
    assert failure.error_type.endswith("TransactionStepError")
    assert "caught a database error" in failure.error_message
    assert "begin_nested" in failure.error_message
    assert "TransactionStepError" in journaled_failure(steps) and calls == [1]
    assert ledger(database_url) == []


@pytest.mark.parametrize("mode", MODES)
def test_a_session_made_read_only_by_a_step_is_not_an_outage(database_url: str, mode: str) -> None:
    """`SET SESSION CHARACTERISTICS` outlives its step on the pooled connection: the next
    step's write is refused as a standby would refuse it. The database itself takes
    writes, so that step fails (journaled) instead of waiting forever for a failover."""
    reg = durable.Registry()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (what text)")
    poison = text("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    write = text("INSERT INTO ledger VALUES ('b')")
    if mode == "sync":

        @durable.transaction(registry=reg, name="a")
        def a(conn: sqlalchemy.Connection) -> None:
            conn.execute(poison)

        @durable.transaction(registry=reg, name="b")
        def b(conn: sqlalchemy.Connection) -> None:
            conn.execute(write)

        @durable.workflow(registry=reg, name="flow")
        def flow() -> None:
            a()
            b()

    else:

        @durable.transaction(registry=reg, name="a")
        async def a_async(conn: Any) -> None:
            await conn.execute(poison)

        @durable.transaction(registry=reg, name="b")
        async def b_async(conn: Any) -> None:
            await conn.execute(write)

        @durable.workflow(registry=reg, name="flow")
        async def flow_async() -> None:
            await a_async()
            await b_async()

        flow = flow_async  # type: ignore[assignment]
    # b gets the connection a poisoned: the only one the application pool has opened.
    with durable.Engine(database_url, registry=reg) as engine:
        if mode == "sync":
            with pytest.raises(errors.WorkflowFailedError) as failed:
                engine.start(flow, workflow_id="w").result(timeout=20)
        else:

            async def main() -> None:
                handle = await engine.start_async(flow, workflow_id="w")
                await handle.result(timeout=20)

            with pytest.raises(errors.WorkflowFailedError) as failed:
                asyncio.run(main())
        assert "read-only transaction" in failed.value.error_message
        steps = engine.steps("w")
    assert [s.step_name for s in steps] == ["a", "b"] and steps[1].error is not None


@pytest.mark.parametrize("mode", MODES)
def test_a_transaction_step_that_runs_no_statement_commits_its_record(
    database_url: str, mode: str
) -> None:
    """SQLAlchemy opens the transaction at the first statement: a step that (this time)
    runs none has nothing open, which is not a transaction its code ended."""
    reg = durable.Registry()
    if mode == "sync":

        @durable.transaction(registry=reg, name="maybe")
        def maybe(conn: sqlalchemy.Connection, write: bool) -> str:
            if write:
                conn.execute(text("SELECT 1"))
            return "done"

        @durable.workflow(registry=reg, name="flow")
        def flow() -> list[str]:
            return [maybe(False), maybe(True), maybe(False)]

    else:

        @durable.transaction(registry=reg, name="maybe")
        async def maybe(conn: Any, write: bool) -> str:
            if write:
                await conn.execute(text("SELECT 1"))
            return "done"

        @durable.workflow(registry=reg, name="flow")
        async def flow() -> list[str]:
            return [await maybe(False), await maybe(True), await maybe(False)]

    async def main() -> Any:
        async with durable.Engine(database_url, registry=reg) as engine:
            handle = await engine.start_async(flow, workflow_id="w")
            return await handle.result(timeout=30), engine.steps("w")

    result, steps = asyncio.run(main())
    assert result == ["done", "done", "done"]
    assert [s.output for s in steps] == ['"done"'] * 3
