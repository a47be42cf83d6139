# Generated from durable/_client/in_txn_async.py by tools/async_to_sync.py: do not edit.
# Edit the source, then run `python tools/async_to_sync.py`
# (tests/unit/test_generated_sync.py fails while this file is out of date).
"""Writes made in the application's own transaction: `conn=` of a start, an enqueue and a
send, so that a workflow (or a message) commits with the application's rows or not at all.

`conn=` takes the application's connection or session with its transaction open:
psycopg's Connection, SQLAlchemy's Connection or Session (and, for the awaited calls,
psycopg's AsyncConnection, SQLAlchemy's AsyncConnection or AsyncSession), over psycopg.

- On durable's own database, the row goes on that connection: the workflow's row as
  PENDING, owned by nobody (the statement of Client.submit, or enqueue's), a message with
  send's statement, and a NOTIFY to the workers, which PostgreSQL delivers at the commit
  (and drops with a rollback). Nobody can claim the row before the commit, since nobody
  sees it; after it, any worker, or the keeper of the engine that started it, claims it.
- On another database, the row goes in that database's outbox (`durable outbox install`,
  Engine.install_outbox), when the engine or client is given that database as
  `outbox_url=`; a worker drains the outbox into durable's database (`_client/outbox.py`).
  Without an outbox, OutboxRequiredError says to install one.

Which database a connection is on is asked of it once (`database_identity`: the database,
the port and when the server started) and compared with the system database's answer.

The awaited forms are written here; `_client/in_txn.py` is generated from this module by
tools/async_to_sync.py.
"""

from __future__ import annotations

import json
import weakref
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from durable._run.acompat import to_thread
from durable._run.context import workflow_code_run
from durable.errors import ConfigurationError, NoOpenTransactionError, OutboxRequiredError

if TYPE_CHECKING:
    from durable._io.config import Config
    from durable._io.systemdb import SystemDB

# What the system database answered to database_identity, per SystemDB (asked once, and
# again when a connection's answer differs: the server may have restarted).
_identities: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()

# Whether a psycopg connection of the application is on the system database.
_same_database: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

# libpq's PQTRANS_IDLE (no transaction open) and PQTRANS_INERROR (one failed).
_IDLE, _INERROR = 0, 3

_KINDS = "psycopg.Connection, SQLAlchemy Connection or Session"
_OTHER = "start_async / enqueue_async / send_async"


class Writer(Protocol):
    """What writing in the application's transaction needs of a client."""

    config: Config

    @property
    def db(self) -> SystemDB: ...

    @property
    def _notify_channel(self) -> str: ...


class AppTransaction:
    """The application's transaction a conn= names: where a row is written in it."""

    def __init__(self, db: SystemDB, conn: Any, sqlalchemy: bool, same: bool) -> None:
        self.db, self.conn, self.sqlalchemy = db, conn, sqlalchemy
        #: On durable's own database (else the row goes in the outbox).
        self.same = same

    @classmethod
    def open(cls, client: Writer, conn: Any) -> AppTransaction:
        """The transaction of `conn` (ConfigurationError for anything else; from workflow
        code, where a start is journaled as a child, conn= is refused too)."""
        if workflow_code_run() is not None:
            raise ConfigurationError(
                "conn= in workflow code: a start there is journaled as a child of the "
                "workflow already; call it without conn= (or from a @transaction step)"
            )
        db = client.db
        sa_conn, raw = _unwrap(conn)
        status = raw.info.transaction_status
        # Idle outside autocommit is fine: the first statement opens the transaction
        # (SQLAlchemy's autobegin, or psycopg's implicit BEGIN).
        if status == _INERROR or (status == _IDLE and raw.autocommit):
            raise NoOpenTransactionError(
                "conn= has no open transaction (an autocommit connection, or a transaction "
                "in error): the row would commit at once, whatever the application does. "
                "Open one first (`with conn.transaction():`, `with session.begin():`)"
            )
        app = cls(db, sa_conn if sa_conn is not None else raw, sa_conn is not None, False)
        same = _same_database.get(raw)
        if same is None:
            # Asked once per connection (one that outlives a server restart is a new one).
            theirs = app.fetch("database_identity")
            mine = _identities.get(db)
            if mine is None or not _same(mine, theirs):
                answer = to_thread(db.fetch_one, "database_identity", {})
                mine = _identities[db] = answer or {}
            same = _same_database[raw] = _same(mine, theirs)
        app.same = same
        if not app.same and client.config.outbox_url is None:
            raise OutboxRequiredError()
        return app

    def fetch(self, name: str, params: dict[str, Any] | None = None, fetch: str = "one") -> Any:
        """One named statement in the application's transaction: its first row (or None),
        or its row count (fetch="count")."""
        return self.db.in_app_transaction(self.conn, name, params or {}, fetch)

    def write(
        self,
        client: Writer,
        statement: str,
        params: dict[str, Any],
        outbox_id: str,
        fetch: str = "one",
    ) -> tuple[bool, Any]:
        """Write `statement` (insert_workflow_pending, enqueue_workflow, send_message) in
        the application's transaction: (True, its row) on durable's database, where the
        workers are notified at the commit; (False, None) once it is in the outbox."""
        if self.same:
            row = self.fetch(statement, params, fetch)
            if row is not None:
                notify = {"channel": client._notify_channel, "payload": params["workflow_id"]}
                self.fetch("notify_work", notify)
            return True, row
        put = {"outbox_id": outbox_id, "statement": statement, "params": json.dumps(params)}
        try:
            self.fetch("app_outbox_put", put, "count")
        except Exception as exc:
            if _missing_table(exc):
                raise OutboxRequiredError(
                    "conn= is on a database with no outbox: install it there "
                    "(`durable outbox install --url APP_URL`, or Engine.install_outbox); "
                    "the application's transaction is now in error: roll it back"
                ) from exc
            raise
        return False, None


def _unwrap(conn: Any) -> tuple[Any, Any]:
    """(the SQLAlchemy connection, or None; the psycopg connection under it)."""
    if isinstance(conn, psycopg.Connection):
        return None, conn
    if type(conn).__module__.startswith("sqlalchemy"):
        from sqlalchemy import Connection
        from sqlalchemy.orm import Session

        if isinstance(conn, Session):
            conn = conn.connection()
        if isinstance(conn, Connection):
            raw = conn.connection.driver_connection
            if isinstance(raw, psycopg.Connection):
                return conn, raw
            raise _not_psycopg(raw)
    raise ConfigurationError(
        f"conn={conn!r}: give the application's {_KINDS} (for the other kind: {_OTHER})"
    )


def _not_psycopg(raw: Any) -> ConfigurationError:
    return ConfigurationError(
        f"conn= runs on {type(raw).__module__}: durable writes in the application's "
        "transaction over psycopg (3); use a `postgresql+psycopg://` SQLAlchemy URL"
    )


def _same(mine: dict[str, Any], theirs: dict[str, Any]) -> bool:
    return all(mine.get(k) == theirs.get(k) for k in ("dbname", "port", "started"))


def _missing_table(exc: BaseException) -> bool:
    """The outbox table is not there (UndefinedTable, SQLSTATE 42P01), maybe under
    SQLAlchemy's wrapper."""
    cause = getattr(exc, "orig", None) or exc
    return getattr(cause, "sqlstate", None) == "42P01"


def new_outbox_id(kind: str, *parts: str) -> str:
    """An outbox row's id: what it starts or sends, so that the same start twice is one
    row and a drain run again writes nothing new ("workflow:<id>", "message:<id>:<key>")."""
    return ":".join((kind, *parts))
