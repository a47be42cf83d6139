"""What the two twins of a run's database I/O share: their helpers, what they need of
SystemDB, and the hooks where the sync and the async side genuinely differ.

The twins are `_io/runio_async.py` (the source, written once) and `_io/runio.py` (generated from
it by `tools/async_to_sync.py`). Everything here is hand-written and used by both, so it is
neither generated nor duplicated.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import ConnStatus, ExecStatus, TransactionStatus
from psycopg.pq.abc import PGresult
from psycopg_pool import PoolTimeout

from durable._core import ABORTED, CONFLICT_ATTEMPTS
from durable.errors import DatabaseUnavailableError

if TYPE_CHECKING:
    import sqlalchemy
    import sqlalchemy.ext.asyncio

    from durable._base.clock import Clock
    from durable._io.outage import Outage


@dataclass
class Counters:
    """Statements this SystemDB sent, for tests and benchmarks."""

    statements: int = 0
    conflicts: int = 0  # serialization failures and deadlocks retried
    # Workflows taken back from executors found dead or restarted (their leases cut short).
    takeovers: int = 0


# SQLSTATEs that mean "the server is going away or not taking connections": an outage.
_OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "58030"})
# "cannot execute ... in a read-only transaction": the server this connection reached was
# a primary and is now a standby (a switchover demoted it); another server takes writes.
_READ_ONLY = "25006"


_CONFLICT_STATES = frozenset({"40001", "40P01"})


def is_conflict(exc: BaseException | None) -> bool:
    """A serialization failure or a deadlock: the transaction rolled back whole, and the
    database asks its client to run it again."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate in _CONFLICT_STATES


def is_outage(exc: BaseException) -> bool:
    """Whether a database error means the database is unreachable (retry later), as
    opposed to a statement it refused (a timeout, a value too large, a constraint), which
    retrying would only repeat forever."""
    if isinstance(exc, PoolTimeout):
        return True
    if isinstance(exc, psycopg.Error) and exc.sqlstate == _READ_ONLY:
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _OUTAGE_STATES


def node_down(exc: BaseException | None) -> bool:
    """Whether `exc` is a Citus coordinator saying one of its worker nodes is unreachable:
    the statement needed that node's shards, the connection to the coordinator is sound, and
    statements on the other nodes' shards run. Unavailable (the caller retries it later), but
    not an outage of the system database: the other runs and the pool carry on."""
    if getattr(exc, "node_hung", False):
        return True  # a node that hangs (SystemDB.error)
    if isinstance(exc, DatabaseUnavailableError):
        exc = exc.__cause__
    return (
        isinstance(exc, psycopg.OperationalError)
        and exc.diag.message_primary is not None
        and exc.diag.message_primary.startswith("connection to the remote node ")
    )


def _spoils(exc: BaseException) -> bool:
    """Whether a connection that `exc` came through must not go back into its pool: an
    outage (a server that turned read-only would refuse it every later write), not one
    Citus worker node down (the coordinator it is connected to is fine)."""
    if node_down(exc):
        return False
    return isinstance(exc, DatabaseUnavailableError) or is_outage(exc)


# Above this many bytes of output and error per record on average, a batch goes as a
# pipeline of single-row statements in one transaction rather than as one statement over
# arrays: the server unnests large array elements slowly (ten 1 MB records: 156 ms as
# arrays, 62 ms pipelined; a hundred 100-byte ones: 3.2 ms as arrays, 4.8 ms pipelined).
_LARGE_RECORD_BYTES = 4096


def _large(rows: Sequence[dict[str, Any]]) -> bool:
    size = sum(len(r["output"] or "") + len(r["error"] or "") for r in rows)
    return size > _LARGE_RECORD_BYTES * len(rows)


class _Refused(Exception):
    """Rolls back a batch whose run's outcome the fence refused (its rows go with it)."""


def _batch_statements(
    rows: Sequence[dict[str, Any]], finish: dict[str, Any] | None, distributed: bool
) -> list[tuple[str, dict[str, Any]]]:
    """The statements that journal `rows` (with `finish`: the run's outcome too): one over
    arrays, or on a distributed schema one per run, each routed to its workflow's shard."""
    if finish is not None:
        return [("finish_with_steps", {**finish, **steps_params(rows)})]
    if not distributed:
        return [("record_steps", steps_params(rows))]
    return [("record_run_steps", params) for params in _by_run(rows)]


def _by_run(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """record_run_steps's parameters for each run among `rows`, in workflow id order (one
    lock order for concurrent batches)."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        runs.setdefault((r["workflow_id"], r["epoch"]), []).append(r)
    out = []
    for (workflow_id, epoch), mine in sorted(runs.items()):
        params: dict[str, Any] = {"workflow_id": workflow_id, "epoch": epoch}
        params.update(steps_params(mine))
        del params["workflow_ids"], params["epochs"]
        out.append(params)
    return out


def steps_params(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Step records as the column arrays `record_steps` unnests."""
    return {
        "workflow_ids": [r["workflow_id"] for r in rows],
        "epochs": [r["epoch"] for r in rows],
        "seqs": [r["step_seq"] for r in rows],
        "names": [r["step_name"] for r in rows],
        "kinds": [r["kind"] for r in rows],
        "outputs": [r["output"] for r in rows],
        "errors": [r["error"] for r in rows],
        "attempts": [r["attempts"] for r in rows],
        "started": [r["started_at"] for r in rows],
    }


# -- the lean path of the hottest statements ------------------------------------------------
#
# A step's record and a run's outcome are one autocommit statement each, sent once per step
# or run: through psycopg's cursor layers their client-side cost is about that of the rest
# of the step. They go instead as a statement prepared once per connection (server-side,
# its parameter types inferred by the server from the statement, as for psycopg's own
# untyped strings) and executed with the raw libpq connection: the same statement and the
# same values (as text), so the same rows; waited for through the connection's own `wait`
# (BoundedConnection's response_timeout) under the connection's lock. Any value this path
# does not convert, any connection not in a plain state, and a statement not prepared (a
# DEALLOCATE, a pool reset) go the ordinary way instead.

# The named statements sent this way (each a row count).
LEAN = frozenset({"record_step", "finish_workflow"})

_PLACEHOLDER = re.compile(rb"%\((\w+)\)([sbt])|%%")


@dataclass(frozen=True)
class LeanPlan:
    """A named statement as the server prepares it: `$n` placeholders, in `names` order."""

    statement: bytes  # the prepared statement's name on each connection
    query: bytes
    names: tuple[str, ...]


def lean_plan(name: str, query: bytes) -> LeanPlan | None:
    """`query` (psycopg's `%(name)s` placeholders) with `$n` ones; None when it holds a
    placeholder of another format (binary arrays go the ordinary way)."""
    names: list[str] = []
    refused = False

    def number(m: re.Match[bytes]) -> bytes:
        nonlocal refused
        if m.group(0) == b"%%":
            return b"%"
        if m.group(2) != b"s":
            refused = True
        key = m.group(1).decode()
        if key not in names:
            names.append(key)
        return b"$%d" % (names.index(key) + 1)

    converted = _PLACEHOLDER.sub(number, query)
    if refused:
        return None
    return LeanPlan(b"durable_" + name.encode(), converted, tuple(names))


def lean_values(plan: LeanPlan, params: dict[str, Any]) -> list[bytes | None] | None:
    """The parameters as text, as PostgreSQL reads them; None when one is of a type this
    path does not convert, or a string holds a NUL (psycopg refuses it with its error)."""
    out: list[bytes | None] = []
    for key in plan.names:
        v = params[key]
        kind = type(v)
        if kind is str:
            if "\x00" in v:
                return None
            out.append(v.encode())
        elif v is None:
            out.append(None)
        elif kind is int:
            out.append(b"%d" % v)
        elif kind is dt.datetime:
            out.append(v.isoformat().encode())
        else:
            return None
    return out


def lean_ready(conn: Any) -> bool:
    """Whether `conn` can take the lean path now: one of durable's pool (which keeps the
    statements it prepared), open, in no pipeline, and with psycopg's own cursors (a
    cursor factory of another's, such as OpenTelemetry's psycopg instrumentation, sees
    only what goes through a cursor: its spans would lose durable's journal writes)."""
    return (
        getattr(conn, "prepared", None) is not None
        and conn.pgconn.status == ConnStatus.OK
        and conn._pipeline is None
        and conn.cursor_factory in _PLAIN_CURSORS
    )


_PLAIN_CURSORS = (psycopg.Cursor, psycopg.AsyncCursor)


# The statement was never prepared on this connection (or no longer is: a DEALLOCATE).
_NOT_PREPARED = "26000"


def lean_count(conn: Any, plan: LeanPlan, results: list[PGresult]) -> int | None:
    """The row count of the lean path's answer; raises its error. None: the statement is
    not prepared on this connection after all (forgotten, so it is prepared again)."""
    res = results[-1]
    status = res.status
    if status == ExecStatus.COMMAND_OK or status == ExecStatus.TUPLES_OK:
        return res.command_tuples or 0
    error = pg_errors.error_from_result(res, encoding=conn.pgconn._encoding)
    if error.sqlstate == _NOT_PREPARED:
        conn.prepared.discard(plan.statement)
        return None
    raise error


def lean_prepared(conn: Any, plan: LeanPlan, results: list[PGresult]) -> bool:
    """After preparing `plan` on `conn`: whether it is prepared (else the ordinary way)."""
    res = results[-1]
    if res.status == ExecStatus.COMMAND_OK:
        conn.prepared.add(plan.statement)
        return True
    error = pg_errors.error_from_result(res, encoding=conn.pgconn._encoding)
    if error.sqlstate is not None and error.sqlstate.startswith("42"):
        return False  # a statement the server cannot prepare untyped: never mind
    raise error


# What the application connection's own state says before a step's record is sent (read
# locally, no round trip): no transaction open (None: the step's code sent COMMIT or
# ROLLBACK itself), or one in error (ABORTED: it caught a database error and went on).
_ENDED: dict[TransactionStatus, str | None] = {
    TransactionStatus.IDLE: None,
    TransactionStatus.INERROR: ABORTED,
}

# Set in an application connection's info by each statement SQLAlchemy runs on it: a step
# whose code ran none has no transaction open yet (SQLAlchemy begins on the first
# statement), which is not a transaction its code ended.
EXECUTED = "durable.ran_statements"


def watch_statements(engine: sqlalchemy.Engine) -> None:
    """Mark the connections of the application engine that run statements (see
    ended_by_code)."""
    from sqlalchemy import event

    event.listen(engine, "after_cursor_execute", _ran_statement)


def _ran_statement(conn: sqlalchemy.Connection, *_: Any) -> None:
    conn.info[EXECUTED] = True


def ended_by_code(status: TransactionStatus, info: dict[Any, Any]) -> bool:
    """Whether the application connection's state says the step's code ended (or broke)
    its transaction: in error, or idle after the code ran statements."""
    return status in _ENDED and (status is not TransactionStatus.IDLE or bool(info.get(EXECUTED)))


def _as_sqlalchemy(
    exc: psycopg.Error, statement: str, dialect: Any, invalidated: bool
) -> BaseException:
    """An error psycopg raised under a SQLAlchemy connection, wrapped the way SQLAlchemy
    wraps its own (IntegrityError, OperationalError, ...): the step's code and its callers
    catch one family of errors whichever statement failed."""
    import sqlalchemy.exc

    return sqlalchemy.exc.DBAPIError.instance(
        f"{statement}; COMMIT",
        None,
        exc,
        psycopg.Error,
        connection_invalidated=invalidated,
        dialect=dialect,
    )


class RunIOBase:
    """What the generated RunIO and its source AsyncRunIO use of the SystemDB they are mixed
    into (declared here so that each twin type-checks on its own), and the retry decision
    both sides and SystemDB.atomically share."""

    _queries: dict[str, bytes]
    # The lean path's plan of each LEAN statement (None: it goes the ordinary way).
    _lean_plans: dict[str, LeanPlan | None]
    _fake_clock: Clock | None
    counters: Counters
    distributed: bool
    outage: Outage

    def statement(self, name: str) -> str:
        raise NotImplementedError

    def error(self, name: str, exc: BaseException, conn: object = None) -> Exception:
        raise NotImplementedError

    def _again(
        self,
        exc: BaseException,
        attempt: int,
        conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None = None,
    ) -> bool:
        """Whether to run the statement or transaction that raised `exc` again: a
        serialization failure or deadlock, attempts left, and (for a statement on a run's
        connection, `conn`) no transaction of the caller's open around it."""
        if not is_conflict(exc) or attempt >= CONFLICT_ATTEMPTS:
            return False
        if conn is not None and not (
            conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
        ):
            return False
        self.counters.conflicts += 1
        return True

    # -- hooks: where the two sides differ beyond a mechanical translation -----------------

    def _default_connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A connection of the engine's pool, for write_steps(None, ...) (the durability
        modes' writer, which has no run's connection to write on)."""
        raise NotImplementedError
