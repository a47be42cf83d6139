# Generated from durable/_io/runio_async.py by tools/async_to_sync.py: do not edit.
# Edit the source, then run `python tools/async_to_sync.py`
# (tests/unit/test_generated_sync.py fails while this file is out of date).
"""A run's database I/O: checkout, named statements on a run's connection, batches of step
records, and the application's transaction (AsyncAppTransaction) and statements inside it.

One source for both sides: `_io/runio_async.py` (AsyncRunIO, on psycopg's and SQLAlchemy's
async connections) is written by hand, and `_io/runio.py` (RunIO) is generated from it by
`tools/async_to_sync.py`, so that the two cannot drift apart; SystemDB mixes both in. What
the two sides do differently beyond that mechanical translation is a hook in
`_io/runio_base.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import generators
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from durable._core import ABORTED, conflict_backoff
from durable._io.bounded import BoundedConnection
from durable._io.runio_base import (
    _ENDED,
    EXECUTED,
    LEAN,
    RunIOBase,
    _as_sqlalchemy,
    _batch_statements,
    _large,
    _Refused,
    _spoils,
    ended_by_code,
    is_outage,
    lean_count,
    lean_plan,
    lean_prepared,
    lean_ready,
    lean_values,
)
from durable.errors import DatabaseUnavailableError

if TYPE_CHECKING:
    import sqlalchemy

    from durable._core import AppExecute


class RunIO(RunIOBase):
    """The statements a run sends on its own connection, and its checkout."""

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """A pool's new connection (the pool's `configure`), before its first use."""
        # A new connection is the proof that a server answers again (a checkout is
        # not: an idle connection to a dead server looks fine until it is used).
        self.outage.seen(conn)
        if isinstance(conn, BoundedConnection):
            conn.source = self
            conn.prepared = set()
            conn.cursors = []
            conn.dict_cursors = []
        if self.distributed:
            conn.execute(self._queries["citus_session"])

    @contextmanager
    def _checkout(self, pool: ConnectionPool) -> Iterator[psycopg.Connection[Any]]:
        """A connection of `pool`, with the fake clock handed to SQL when there is one. A
        failed checkout is an outage (the run is interrupted, not failed), and a connection
        an outage came through is closed rather than put back into the pool.

        The pool's getconn and putconn, without its `connection()` block: that block also
        ends the connection's transaction, which an autocommit connection has none of (the
        pool rolls back one left open when it is put back)."""
        try:
            conn = pool.getconn()  # checkout
        except (psycopg.Error, PoolTimeout) as exc:
            # No connection to be had (an outage, or a pool exhausted for its whole
            # timeout): the run is interrupted, not failed.
            raise self.error("checkout", exc) from exc
        try:
            if self._fake_clock is not None:
                try:
                    conn.execute(
                        "SELECT set_config('durable.fake_now', %s, false)",
                        [self._fake_clock.now().isoformat()],
                    )
                except psycopg.Error as exc:  # a connection lost at once: as above
                    raise self.error("checkout", exc) from exc
            yield conn
        except (DatabaseUnavailableError, psycopg.Error) as exc:
            if _spoils(exc):
                conn.close()
            raise
        finally:
            pool.putconn(conn)

    def run_on(
        self, conn: psycopg.Connection[Any], name: str, params: dict[str, Any], fetch: str
    ) -> Any:
        """A named statement on a run's own connection: the row count ("count"), the first
        row ("one") or every row ("all"), as dicts. The drivers' one way to the database.
        A statement that is its own transaction (autocommit, none open) is run again after
        a serialization failure or deadlock; inside a transaction the caller retries."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return self.raw_run(conn, name, params, fetch)
            except (psycopg.Error, PoolTimeout) as exc:
                if self._again(exc, attempt, conn):
                    time.sleep(conflict_backoff(attempt))
                    continue
                raise self.error(name, exc, conn) from exc

    def raw_run(
        self, conn: psycopg.Connection[Any], name: str, params: dict[str, Any], fetch: str
    ) -> Any:
        """The statement of run_on without translation or retries (inside `atomically`)."""
        query = self._queries[name]
        if fetch == "count":
            if name in LEAN and lean_ready(conn):
                count = self._lean(conn, name, params)
                if count is not None:
                    self.counters.statements += 1
                    return count
            # A cursor of the connection's used again (a new one per statement costs about
            # a sixth of a step); taken off its list while in use, so never shared.
            idle = getattr(conn, "cursors", None)
            cur = idle.pop() if idle else conn.cursor()
            cur.execute(query, params)
            self.counters.statements += 1
            count = cur.rowcount
            if idle is not None:
                idle.append(cur)
            return count
        idle = getattr(conn, "dict_cursors", None)
        dcur = idle.pop() if idle else conn.cursor(row_factory=dict_row)
        dcur.execute(query, params)
        self.counters.statements += 1
        rows = dcur.fetchone() if fetch == "one" else dcur.fetchall()
        if idle is not None:
            idle.append(dcur)
        return rows

    def _lean(self, conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> int | None:
        """A LEAN statement's row count, sent prepared on the raw connection (see
        runio_base.LEAN); None: it goes the ordinary way instead."""
        if name not in self._lean_plans:
            self._lean_plans[name] = lean_plan(name, self._queries[name])
        plan = self._lean_plans[name]
        if plan is None:
            return None
        values = lean_values(plan, params)
        if values is None:
            return None
        pgconn = conn.pgconn
        with conn.lock:
            if plan.statement not in conn.prepared:  # type: ignore[attr-defined]
                pgconn.send_prepare(plan.statement, plan.query)
                if not lean_prepared(conn, plan, conn.wait(generators.execute(pgconn))):
                    self._lean_plans[name] = None
                    return None
            pgconn.send_query_prepared(plan.statement, values)
            return lean_count(conn, plan, conn.wait(generators.execute(pgconn)))

    def write_steps(
        self,
        conn: psycopg.Connection[Any] | None,
        rows: Sequence[dict[str, Any]],
        finish: dict[str, Any] | None = None,
    ) -> list[str]:
        """Journal many step records in one statement; returns the workflow id of each row
        written (rows of runs that lost ownership are refused by the fence). With `finish`
        (finish_workflow's parameters; the rows are that run's), the run's outcome is
        written in the same transaction, and nothing at all if the run lost ownership.
        Without `conn`, on a connection of the engine's pool."""
        attempt = 0
        while True:
            attempt += 1
            try:
                if conn is not None:
                    return self._write_steps(conn, rows, finish)
                with self._default_connection() as pooled:
                    return self._write_steps(pooled, rows, finish)
            except _Refused:
                return []
            except (psycopg.Error, PoolTimeout) as exc:
                # One statement, or one transaction that rolled back whole: run it again.
                if self._again(exc, attempt):
                    time.sleep(conflict_backoff(attempt))
                    continue
                raise self.error("record_steps", exc, conn) from exc

    def _write_steps(
        self,
        conn: psycopg.Connection[Any],
        rows: Sequence[dict[str, Any]],
        finish: dict[str, Any] | None,
    ) -> list[str]:
        if not _large(rows):
            batch = _batch_statements(rows, finish, self.distributed)
            if len(batch) == 1:
                name, params = batch[0]
                cur = conn.execute(self._queries[name], params)
                self.counters.statements += 1
                return [str(r[0]) for r in cur.fetchall()]
            # Several runs' records on a distributed schema: one statement per run, in one
            # transaction (a failed batch rolls back whole and can be sent again).
            with conn.transaction():
                cur = conn.cursor()
                cur.executemany(
                    self._queries["record_run_steps"], [p for _, p in batch], returning=True
                )
                self.counters.statements += len(batch)
                return _returned(cur)
        with conn.transaction():
            cur = conn.cursor()
            cur.executemany(self._queries["record_step"], rows, returning=True)
            self.counters.statements += len(rows)
            written = _returned(cur)
            if finish is not None and len(written) == len(rows):
                self.counters.statements += 1
                done = conn.execute(self._queries["finish_workflow"], finish)
                if done.rowcount != 1:
                    raise _Refused()
            return written

    def app_run(
        self,
        conn: sqlalchemy.Connection,
        name: str,
        params: dict[str, Any],
        fetch: str,
    ) -> Any:
        """A named statement inside the application's transaction (SQLAlchemy connection)."""
        result = conn.exec_driver_sql(self.statement(name), params)
        self.counters.statements += 1
        if fetch == "count":
            return result.rowcount
        rows = [dict(r._mapping) for r in result]
        return (rows[0] if rows else None) if fetch == "one" else rows

    def in_app_transaction(self, conn: Any, name: str, params: dict[str, Any], fetch: str) -> Any:
        """A named statement on the application's own connection, inside its transaction
        (`conn=` of a start, an enqueue or a send): a psycopg connection, or SQLAlchemy's
        (through it, so that its transaction is the one that commits). What run_on
        returns, with nothing translated or retried: the transaction is the
        application's to retry."""
        if isinstance(conn, psycopg.Connection):
            return self.raw_run(conn, name, params, fetch)
        return self.app_run(conn, name, params, fetch)

    def app_commit_with(
        self, conn: sqlalchemy.Connection, name: str, params: dict[str, Any]
    ) -> int | str | None:
        """Run a named statement and COMMIT the application transaction in one pipeline
        (one round trip). If the statement fails, the COMMIT is skipped by the server and
        the error is raised, the transaction left aborted for the caller's rollback.
        Returns the statement's row count; sends nothing and returns None or ABORTED when
        the connection has no transaction open or one in error (see _ENDED)."""
        # The psycopg connection under SQLAlchemy's: its sync Connection hands it out as an
        # attribute, its AsyncConnection by an awaited call.
        raw = conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        status = raw.info.transaction_status
        if ended_by_code(status, conn.info):
            return _ENDED[status]
        try:
            with raw.pipeline():  # one Sync, at the block's end: one round trip
                cursor = raw.execute(self._queries[name], params)
                # Not raw.commit(): in a pipeline it syncs at once, and the block's exit
                # syncs again (two round trips).
                raw.execute(b"COMMIT")
        except psycopg.Error as exc:
            lost = raw.closed or is_outage(exc)
            if lost:
                conn.invalidate()  # SQLAlchemy must not hand this connection out again
            raise _as_sqlalchemy(exc, self.statement(name), conn.dialect, lost) from exc
        self.counters.statements += 1
        return cursor.rowcount


class AppTransaction:
    """The application transaction a @transaction step holds open across operations (from
    its driver's AppBegin to its AppEnd), on a connection of `cm` (the host's
    app_connection); `db` runs the statement that may go with the COMMIT."""

    def __init__(
        self,
        db: RunIO,
        cm: AbstractContextManager[sqlalchemy.Connection],
    ) -> None:
        self._db = db
        self._cm = cm
        self.conn: sqlalchemy.Connection | None = None
        self._tx: sqlalchemy.Transaction | None = None

    def begin(self) -> None:
        """Check out the connection and begin; on failure, give the connection back."""
        self.conn = self._cm.__enter__()
        self.conn.info[EXECUTED] = False  # (the info outlives a checkout)
        try:
            self._tx = self.conn.begin()
        except BaseException:
            self._cm.__exit__(None, None, None)
            raise

    def end(self, commit: bool, last: AppExecute | None = None) -> int | str | None:
        """Commit or roll back; with `last`, that statement and the COMMIT go in one
        pipeline (its row count is returned; see AppEnd for None and "aborted"). Always
        gives the connection back."""
        try:
            written: int | str | None = None
            tx = self._tx
            if tx is not None and tx.is_active:
                if commit:
                    if last is not None:
                        assert self.conn is not None
                        written = self._db.app_commit_with(self.conn, last.name, last.params)
                    if written == ABORTED:
                        tx.rollback()
                    else:
                        tx.commit()  # after the pipeline's COMMIT: SQLAlchemy's books
                else:
                    tx.rollback()
            return written
        finally:
            self._cm.__exit__(None, None, None)


def _returned(cur: psycopg.Cursor[Any]) -> list[str]:
    """The workflow ids an executemany(returning=True) of single-row inserts wrote."""
    written: list[str] = []
    while True:
        written += [str(r[0]) for r in cur.fetchall()]
        if not cur.nextset():
            return written
