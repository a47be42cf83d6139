"""The only module that executes SQL: the system database's and the application's.

Statements live in `_io/sql/queries.sql` (the app database's schema in
`_io/sql/app_migrations.sql`). They are rendered once per engine, with the schema
name quoted by `psycopg.sql.Identifier`, into bytes that psycopg prepares after a few uses.
Connections are autocommit: each journal write is one statement and therefore one commit,
with no BEGIN/COMMIT round trips and no pre-ping. Database errors are translated here, by
SQLSTATE, into durable's typed errors.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar, cast

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from durable._base.urls import _password, _scrub, check_url, redact
from durable._core import AppFault, Fault, conflict_backoff
from durable._io import citus as _citus
from durable._io import migrate as _migrate
from durable._io import shards as _shards
from durable._io.bounded import (
    DEFAULT_RESPONSE_TIMEOUT,
    AsyncBoundedConnection,
    BoundedConnection,
    NoAnswerError,
    connect_kwargs,
    unbounded,
)
from durable._io.finishes import FinishGroup, StepGroup
from durable._io.hung import SUSPECT_AFTER, HungNodes
from durable._io.outage import Outage
from durable._io.runio import RunIO
from durable._io.runio_async import AsyncRunIO
from durable._io.runio_base import _READ_ONLY, Counters, LeanPlan
from durable._io.runio_base import is_conflict as is_conflict

# Re-exported (as X as X): the rest of durable imports these from here.
from durable._io.runio_base import is_outage as is_outage
from durable._io.runio_base import node_down as node_down
from durable.errors import ConfigurationError, DatabaseUnavailableError, StatementError

if TYPE_CHECKING:
    import sqlalchemy

    from durable._base.clock import Clock

logger = logging.getLogger("durable.systemdb")

Row = dict[str, Any]
T = TypeVar("T")


def parse_queries(text: str) -> dict[str, str]:
    """Split queries.sql into {name: statement}; `-- name --` lines start a statement."""
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-- ") and stripped.endswith(" --") and len(stripped) > 6:
            if name is not None:
                queries[name] = "\n".join(lines).strip()
            name = stripped[3:-3].strip()
            lines = []
        elif name is not None and not stripped.startswith("--"):
            lines.append(line)
    if name is not None:
        queries[name] = "\n".join(lines).strip()
    return queries


def load_queries() -> dict[str, str]:
    text = resources.files("durable._io.sql").joinpath("queries.sql").read_text("utf-8")
    return parse_queries(text)


class SystemDB(RunIO, AsyncRunIO):
    """A connection pool to the system database plus the named statements.

    A run's I/O (checkout, run_on, write_steps, app_run, app_commit_with and their `_async`
    twins) comes from RunIO and AsyncRunIO: one source, `_io/runio_async.py`, of which the
    sync side is generated (see tools/async_to_sync.py)."""

    def __init__(
        self,
        url: str,
        schema: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        clock: Clock | None = None,
        listen: bool = True,
        claims: str = "auto",
        response_timeout: float | None = None,
    ) -> None:
        self.url = url
        # How long each statement waits for its answer (see _io/bounded.py); None: for ever.
        self.response_timeout = (
            DEFAULT_RESPONSE_TIMEOUT if response_timeout is None else response_timeout
        ) or None
        self.listen = listen
        self.claims = claims  # "auto" (the schema decides), "cas" or "skip-locked"
        # A fake clock is handed to SQL on every checkout (see _base/clock.py); the real one
        # costs nothing.
        self._fake_clock = clock if clock is not None and not clock.is_system else None
        self.schema = schema
        self.counters = Counters()
        # Told of every batch of claims (the worker's metrics: recoveries, dead letters).
        self.on_claims: Callable[[list[Row]], None] | None = None
        self.outage = Outage(url)
        # Whether the schema is distributed by Citus (then a run's batch of records goes
        # as one statement per workflow, each on its shard), and whether claims are
        # compare-and-set; both looked up when the pool opens.
        self.distributed = False
        self.cas_claims = False
        # Citus worker nodes found hanging (see _io/hung.py).
        self.hung = HungNodes(self)
        # On Citus, the shards the claim rounds read in turn (see _io/shards.py).
        self.shards = _shards.ShardRing(lambda: self.fetch_all("shard_keys", {}))
        # Outcomes, and sync-mode step records, of runs writing at the same moment share
        # one statement and one commit (see _finishes).
        self.finishes = FinishGroup(self)
        self.records = StepGroup(self)
        self._async_pools: dict[AsyncConnectionPool, asyncio.AbstractEventLoop] = {}
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Any] = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            # Named in pg_stat_activity (unless the URL names itself): who holds what.
            kwargs={
                "autocommit": True,
                "fallback_application_name": "durable",
                **connect_kwargs(url, self.response_timeout),
            },
            connection_class=BoundedConnection,
            open=False,
            name="durable-pool",
            configure=self._configure,
        )
        self._raw = load_queries()
        self._queries: dict[str, bytes] = {}
        self._lean_plans: dict[str, LeanPlan | None] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self, timeout: float = 15.0, *, create_database: bool = False) -> None:
        """Check the URL, connect once (so a wrong password or a missing database is said at
        once, not retried by the pool for `timeout` seconds), then open the pool. With
        `create_database`, a database that does not exist yet is created first."""
        check_url(self.url)
        secret = _password(self.url)
        connect_timeout = max(1, int(min(timeout, 10)))
        try:
            try:
                probe = psycopg.connect(self.url, connect_timeout=connect_timeout)
            except psycopg.OperationalError as exc:
                if not (create_database and _missing_database(exc)):
                    raise
                _create_database(self.url, connect_timeout)
                probe = psycopg.connect(self.url, connect_timeout=connect_timeout)
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailableError(
                f"cannot connect to the system database at {redact(self.url)}: "
                f"{_scrub(str(exc), secret).strip()}; check the URL and that PostgreSQL is "
                "running"
            ) from None
        except psycopg.Error as exc:
            raise ConfigurationError(
                f"cannot use the database URL {redact(self.url)}: {_scrub(str(exc), secret)}"
            ) from None
        probe.close()
        try:
            self._pool.open(wait=True, timeout=timeout)
        except PoolTimeout as exc:
            self._pool.close()
            raise DatabaseUnavailableError(
                f"cannot connect to the system database at {redact(self.url)} within "
                f"{timeout} s: check the URL and that PostgreSQL is running"
            ) from exc
        with self._pool.connection() as conn:
            ident = sql.Identifier(self.schema)
            for name, text in self._raw.items():
                composed = sql.SQL(text).format(schema=ident)
                self._queries[name] = composed.as_bytes(conn)
            self.distributed = self._is_distributed(conn)
            self.cas_claims = self._wants_cas_claims()
            if self.distributed:
                conn.execute(self._queries["citus_session"])

    def _is_distributed(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether the schema's `workflows` table is distributed by Citus."""
        row = conn.execute(
            "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"
        ).fetchone()
        if not row or not row[0]:
            return False
        # to_regclass, not a cast: before the first migration the schema does not exist.
        found = conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_dist_partition"
            " WHERE logicalrelid = to_regclass(%s)",
            [sql.Identifier(self.schema, "workflows").as_string(conn)],
        ).fetchone()
        return bool(found and found[0])

    def _wants_cas_claims(self) -> bool:
        """Claim without row locks (claim_batch_cas, dequeue_cas) on a Citus-distributed
        schema, or when the configuration asks for it (DURABLE_CLAIMS=cas)."""
        if self.claims != "auto":
            return self.claims == "cas"
        return self.distributed

    def claim_batch(self, params: dict[str, Any]) -> list[Row]:
        """Claim runnable workflows (FOR UPDATE SKIP LOCKED, or compare-and-set), and tell
        `on_claims` (the metrics) what was claimed. `queues` (default None: any): the
        queues whose entries may be claimed, besides work from no queue."""
        rows = self._claim_batch({"queues": None, **params})
        if self.on_claims is not None and rows:
            self.on_claims(rows)
        return rows

    def _claim_batch(self, params: dict[str, Any]) -> list[Row]:
        """On Citus, a round reads a few shards, one statement each (shards.claim_on_shards):
        a worker node that is down, or hangs, holds up the work of its own shards only.
        Claims of given ids go as one statement (to the shards of those ids)."""
        if params.get("workflow_ids") is None and self.distributed and self.cas_claims:
            return _shards.claim_on_shards(self, params)
        return self.fetch_all("claim_batch_cas" if self.cas_claims else "claim_batch", params)

    @property
    def fake_clock(self) -> Clock | None:
        """The fake clock handed to SQL, if any (reads on a worker node go by it too)."""
        return self._fake_clock

    def nodes_hung(self) -> bool:
        """Whether a Citus worker node was found hanging (asked again in the background once
        its time is up): the statements over every shard would wait for it, so they are not
        sent meanwhile."""
        return self.hung.any()

    @property
    def suspect_after(self) -> float | None:
        """How long a statement waits for its answer before the Citus worker nodes are
        probed (see _io/hung.py); None off Citus."""
        if not (self.distributed and self.response_timeout):
            return None
        return self.response_timeout * SUSPECT_AFTER

    def suspect(self) -> None:
        """A statement is slow to answer: probe the Citus worker nodes in the background."""
        self.hung.suspect()

    def probe_nodes(self, bound: float, node_answer: float) -> dict[int, tuple[str, bool]]:
        """Ask every Citus worker node at once, through the coordinator, on a connection of
        the probe's own (the pool's may all be waiting on the hung node), within `bound`
        seconds, each node within `node_answer`: {group id: (host:port, answers)}."""
        with BoundedConnection.connect(
            self.url,
            autocommit=True,
            fallback_application_name="durable-probe",
            **connect_kwargs(self.url, bound),
        ) as conn:
            conn.source = _Bound(bound)
            conn.execute(self._queries["citus_probe_session"], {"ms": int(node_answer * 1000)})
            rows = conn.execute(self._queries["citus_probe_nodes"]).fetchall()
        return {int(group): (str(node), bool(answers)) for group, node, answers in rows}

    def wake_due(self, workflow_ids: list[str] | None = None) -> int:
        """Make the sleepers whose time has come runnable (only among `workflow_ids` when
        given, on Citus). On Citus, a claim round wakes the sleepers of the shards it reads
        (shards.claim_on_shards), so this wakes only given ids there."""
        if self.distributed and self.cas_claims:
            if workflow_ids is None:
                return 0
            return self.execute("wake_due", {"workflow_ids": workflow_ids})
        return self.execute("wake_due", {"workflow_ids": None})

    def on_held(self, name: str, params: dict[str, Any], fetch: str = "all") -> tuple[Any, bool]:
        """A statement on the claims `params["held"]` (with their `epochs`): its rows
        (`fetch="all"`) or row count (`"count"`), and whether it reached all of them.

        On Citus such a statement touches the shards of every held workflow, and is refused
        whole while one worker node is down. It is then sent once per node, with that
        node's workflows: the leases and cancel requests of the runs on the nodes that
        answer are kept, and those of the node that is down are not (its runs are stuck
        on it anyway)."""
        run = self.fetch_all if fetch == "all" else self.execute
        if not self.nodes_hung():
            try:
                return run(name, params), True
            except DatabaseUnavailableError as exc:
                if not (self.distributed and node_down(exc)):
                    raise
        rows: list[Row] = []
        count = 0
        reached = True
        for group in self.fetch_all("nodes_of", params):
            if group["node"] in self.hung.groups:
                reached = False  # its runs wait for it
                continue
            part = {**params, "held": group["held"], "epochs": group["epochs"]}
            try:
                got = run(name, part)
            except DatabaseUnavailableError as exc:
                if not node_down(exc):
                    raise
                reached = False
                continue
            if isinstance(got, list):
                rows += got
            else:
                count += got
        return (rows if fetch == "all" else count), reached

    def close(self) -> None:
        self._pool.close()

    def migrate(self, progress: _migrate.MigrationProgress | None = None) -> list[int]:
        with unbounded(), self._pool.connection() as conn:
            return _migrate.migrate(cast("psycopg.Connection[object]", conn), self.schema, progress)

    def distribute_citus(self) -> int:
        """Distribute the migrated tables over Citus (durable/_io/citus.py's plan); tables
        already distributed are left as they are. Returns how many it distributed."""
        with unbounded(), self._translate("distribute_citus"), self.connection() as conn:
            # Installed files are not enough: Citus runs only when the server preloads it.
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'citus')"
                " AND (EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
                " OR 'citus' = ANY(string_to_array("
                "replace(current_setting('shared_preload_libraries'), ' ', ''), ',')))"
            ).fetchone()
            if not row or not row[0]:
                raise ConfigurationError(
                    f"the server at {redact(self.url)} has no citus extension loaded: run "
                    "`durable migrate --citus` against a Citus coordinator (a server with "
                    "shared_preload_libraries = 'citus'), or see the statements with "
                    "`durable migrate --citus --dry-run`"
                )
            done = 0
            for table, statement in _citus.plan(self.schema):
                if table is not None:
                    found = conn.execute(
                        "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = %s::regclass",
                        [table],
                    ).fetchone()
                    if found and found[0]:
                        continue
                    done += 1
                conn.execute(statement.encode())
            self.distributed = True
            self.cas_claims = self._wants_cas_claims()
            conn.execute(self._queries["citus_session"])
            return done

    def check_schema(self) -> None:
        with unbounded(), self._pool.connection() as conn:
            _migrate.check(cast("psycopg.Connection[object]", conn), self.schema, self.url)

    def statement(self, name: str) -> str:
        """The rendered text of a named statement (used inside the app's transaction)."""
        return self._queries[name].decode("utf-8")

    # -- execution ---------------------------------------------------------------------------

    def connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A connection of the engine's pool (RunIO._checkout)."""
        return self._checkout(self._pool)

    def _default_connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return self.connection()

    @contextmanager
    def _translate(self, name: str) -> Iterator[None]:
        try:
            yield
        except (psycopg.Error, PoolTimeout) as exc:
            raise self.error(name, exc) from exc

    def error(self, name: str, exc: BaseException, conn: object = None) -> Exception:
        """translate(), and an outage reported once (see Outage); `conn`: the connection
        the error came from, if known."""
        err = translate(name, exc)
        if node_down(exc):
            return err  # one Citus node, not the database: the others' shards still answer
        if self.distributed and isinstance(exc, NoAnswerError) and self.hung.find(exc.sent_at):
            # A node that hangs, not the coordinator: as node_down, without the outage.
            hung = DatabaseUnavailableError(
                f"a Citus worker node does not answer while running {name!r}: {exc}"
            )
            hung.node_hung = True  # type: ignore[attr-defined]
            return hung
        if isinstance(err, DatabaseUnavailableError) and self.outage.lost(exc, name, conn):
            # The pool's idle connections went down with the server: drop them now, so
            # that none is handed to a run after the database is back.
            check = threading.Thread(target=self._check_pool, name="durable-check", daemon=True)
            check.start()
        return err

    def _check_pool(self) -> None:
        with self._lock:
            async_pools = list(self._async_pools.items())
        for pool, loop in async_pools:
            # Each event loop's pool is checked on its own loop.
            try:
                asyncio.run_coroutine_threadsafe(pool.check(), loop)
            except RuntimeError:
                pass  # that loop is closing
        try:
            self._pool.check()
        except Exception:
            logger.debug("pool check failed", exc_info=True)

    def watch_async_pool(self, pool: AsyncConnectionPool, loop: asyncio.AbstractEventLoop) -> None:
        """An open pool of an event loop: checked too when an outage begins."""
        with self._lock:
            self._async_pools[pool] = loop

    def unwatch_async_pool(self, pool: AsyncConnectionPool) -> None:
        with self._lock:
            self._async_pools.pop(pool, None)

    def migrate_app(self, app_engine: sqlalchemy.Engine) -> None:
        """Create the application database's `transaction_outputs` (when it is not the
        system database), under the same advisory lock as the system migrations."""
        text = resources.files("durable._io.sql").joinpath("app_migrations.sql").read_text()
        with app_engine.begin() as conn:
            raw = conn.connection.driver_connection
            assert raw is not None
            rendered = sql.SQL(text).format(schema=sql.Identifier(self.schema))
            lock = {"key": _migrate.lock_key(self.schema)}
            conn.exec_driver_sql(self.statement("app_migration_lock"), lock)
            conn.exec_driver_sql(rendered.as_string(raw))

    def install_outbox(self, url: str) -> None:
        """Create the outbox (and the rest of app_migrations.sql) in the application
        database at `url`, under the same advisory lock as migrate_app."""
        text = resources.files("durable._io.sql").joinpath("app_migrations.sql").read_text()
        rendered = sql.SQL(text).format(schema=sql.Identifier(self.schema))
        with psycopg.connect(url, connect_timeout=15) as conn, conn.transaction():
            conn.execute(
                self._queries["app_migration_lock"], {"key": _migrate.lock_key(self.schema)}
            )
            conn.execute(rendered)

    def dequeue(self, params: dict[str, Any]) -> list[Row]:
        """Take what a queue's limits allow under its lock; [] if another worker holds it.
        A queue with partition limits is taken by dequeue_partitioned, on one server as
        on Citus (its ranking of each partition's entries is no statement to lock rows in)."""
        params = {"partition_rate_count": None, "partition_rate_period": 0.0, **params}
        partitioned = (
            params.get("partition_concurrency") is not None
            or params["partition_rate_count"] is not None
        )

        # Compare-and-set: a queue without limits is taken with no lock and no count (its
        # entries are taken once each all the same).
        unlimited = self.cas_claims and all(
            params.get(k) is None for k in ("concurrency", "worker_concurrency", "rate_count")
        )
        if self.distributed and (partitioned or not unlimited) and self.nodes_hung():
            return []  # its limits count over every node: it waits for the hung one
        if self.distributed and self.cas_claims and not partitioned:
            if params.get("workflow_ids") is None:
                # On Citus, the entries of a few shards (one statement each), taken by id.
                ids = _shards.enqueued_on_shards(self, params)
                if not ids:
                    return []
                params = {**params, "workflow_ids": ids}

        def take(tx: Tx) -> list[Row]:
            if unlimited and not partitioned:
                return tx.fetch_all("dequeue_cas", {**params, "allowed": params["limit"]})
            if self.distributed:
                tx.execute("make_queue_lock", params)
                if tx.fetch_one("lock_queue_row", params) is None:
                    return []
            else:
                locked = tx.fetch_one("lock_queue", params)
                if locked is None or not locked["locked"]:
                    return []
            if not self.cas_claims and not partitioned:
                return tx.fetch_all("dequeue", params)
            allowance = tx.fetch_one("queue_allowance", params)
            allowed = int(allowance["n"]) if allowance is not None else 0
            if allowed <= 0:
                return []
            name = "dequeue_partitioned" if partitioned else "dequeue_cas"
            return tx.fetch_all(name, {**params, "allowed": allowed})

        try:
            return self.atomically(take, "dequeue")
        except DatabaseUnavailableError as exc:
            if not (self.distributed and node_down(exc)):
                raise
            return []  # a node is down: this queue waits for it, the next ones go on

    def execute(self, name: str, params: dict[str, Any]) -> int:
        """Run a statement, return its row count (0 means a fence refused the write)."""
        return int(self.atomically(lambda tx: tx.execute(name, params), name, single=True))

    def fetch_one(self, name: str, params: dict[str, Any]) -> Row | None:
        row: Row | None = self.atomically(lambda tx: tx.fetch_one(name, params), name, single=True)
        return row

    def fetch_all(self, name: str, params: dict[str, Any]) -> list[Row]:
        rows: list[Row] = self.atomically(lambda tx: tx.fetch_all(name, params), name, single=True)
        return rows

    def fetch_rows(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Every row of a statement as a tuple, in its columns' order: for reads of many
        rows (a batch of journals), where a dict per row costs more than the read."""
        rows: list[tuple[Any, ...]] = self.atomically(
            lambda tx: tx.fetch_rows(name, params), name, single=True
        )
        return rows

    def fork(self, params: dict[str, Any], then: Callable[[Tx], None] | None = None) -> bool:
        """Create a fork and copy what lies before its fork point, in one transaction; False
        when the original does not exist. Each copy reads the original's shard and writes
        the fork's (on Citus they may be two), for the positions fork_seqs read once, so a
        step the original's run records meanwhile is left behind with all that is its.
        `then(tx)` writes more in the same transaction (its audit rows)."""

        def work(tx: Tx) -> bool:
            if not tx.execute("fork_workflow", params):
                return False
            copied = [int(r["step_seq"]) for r in tx.fetch_all("fork_seqs", params)]
            for name in _FORK_COPIES:
                tx.execute(name, {**params, "copied": copied})
            if then is not None:
                then(tx)
            return True

        return self.atomically(work, "fork_workflow")

    def execute_many_in_transaction(self, ops: Sequence[tuple[str, dict[str, Any]]]) -> list[int]:
        """Run several statements in one transaction; returns each row count."""
        return self.atomically(lambda tx: [tx.execute(n, p) for n, p in ops], ops[0][0])

    def atomically(
        self, work: Callable[[Tx], T], name: str = "transaction", *, single: bool = False
    ) -> T:
        """`work(tx)` in one transaction on a pooled connection, committed on success; run
        again from the start when the database reports a serialization failure or a
        deadlock (SQLSTATE 40001, 40P01: under SERIALIZABLE isolation, or on CockroachDB,
        a transaction that collided with another must be retried by its client). `single`:
        the work is one statement, which autocommit makes its own transaction."""
        attempt = 0
        while True:
            attempt += 1
            used: psycopg.Connection[Any] | None = None
            try:
                with self.connection() as conn:
                    used = conn
                    if single:
                        return work(Tx(self, conn, raw=True))
                    with conn.transaction():
                        return work(Tx(self, conn, raw=True))
            except (psycopg.Error, PoolTimeout) as exc:
                if self._again(exc, attempt):
                    time.sleep(conflict_backoff(attempt))
                    continue
                raise self.error(name, exc, used) from exc

    # -- the async driver's side: the same statements on psycopg's AsyncConnection ------------

    def async_pool(self, max_size: int) -> AsyncConnectionPool:
        """A pool for one event loop (opened, used and closed on that loop)."""
        return AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=max_size,
            kwargs={
                "autocommit": True,
                "fallback_application_name": "durable-async",
                **connect_kwargs(self.url, self.response_timeout),
            },
            connection_class=AsyncBoundedConnection,
            open=False,
            name="durable-async-pool",
            configure=self._configure_async,
        )

    def async_connection(
        self, pool: AsyncConnectionPool
    ) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """connection(), from an event loop's pool: the same checkout, the same errors,
        and a connection an outage came through closed in the same way (it is the same
        code: AsyncRunIO._checkout_async, of which RunIO._checkout is generated)."""
        return self._checkout_async(pool)

    def listen_connection(self, *channels: str) -> psycopg.Connection[Any] | None:
        """A dedicated autocommit connection LISTENing on `channels` (not from the pool);
        None when notifications are off (the caller polls)."""
        if not self.listen:
            return None
        conn = psycopg.connect(
            self.url,
            autocommit=True,
            fallback_application_name="durable-listen",
            **{"connect_timeout": 10, **connect_kwargs(self.url, self.response_timeout)},
        )
        try:
            for channel in channels:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        except BaseException:
            conn.close()
            raise
        self.outage.seen(conn)
        return conn


class _Bound:
    """The source of the probe's connection: its own bound (see BoundedConnection)."""

    def __init__(self, response_timeout: float) -> None:
        self.response_timeout = response_timeout


# What a fork copies from its original, after the fork's row (SystemDB.fork).
_FORK_COPIES = (
    "fork_steps",
    "fork_tool_calls",
    "fork_charges",
    "fork_streams",
    "fork_events",
    "fork_gates",
    "fork_messages",
)

# Raised by {schema}.fence_lost (migration 0016): a run's record inside its @transaction
# step's own transaction found that the run no longer owns the workflow.
FENCE_LOST = "UD001"


def translate(name: str, exc: BaseException) -> Exception:
    """A database error as durable's: an outage (DatabaseUnavailableError: interrupted,
    retried), a unique violation as it is (callers look at its constraint), or anything
    else as StatementError (the call fails with it)."""
    if node_down(exc):
        return DatabaseUnavailableError(
            f"a Citus worker node is unreachable while running {name!r}: {exc}"
        )
    if is_outage(exc):
        return DatabaseUnavailableError(f"lost the system database while running {name!r}: {exc}")
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return exc
    state = exc.sqlstate if isinstance(exc, psycopg.Error) else None
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StatementError(name, state, first_line)


def _missing_database(exc: psycopg.OperationalError) -> bool:
    # libpq reports a missing database before any SQLSTATE reaches psycopg in some
    # versions; both forms are recognised.
    return exc.sqlstate == "3D000" or ("database" in str(exc) and "does not exist" in str(exc))


def _create_database(url: str, connect_timeout: int) -> None:
    """Create the database `url` names, connecting to the server's `postgres` database.
    Two processes doing it at once are fine: the loser sees it exists."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    name = str(info.get("dbname") or info.get("user") or "")
    admin = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True, connect_timeout=connect_timeout) as conn:
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            pass
    logger.info("created database %s", name)


def is_unique_violation(exc: BaseException | None, constraint: str | None) -> bool:
    """Whether `exc` is a unique violation of `constraint` (by SQLSTATE, not message); of
    any constraint with None."""
    return isinstance(exc, psycopg.errors.UniqueViolation) and (
        constraint is None or exc.diag.constraint_name == constraint
    )


def refused_data(exc: BaseException | None) -> str | None:
    """What PostgreSQL refused in the values a statement was given, in its words, with the
    table, column or constraint and the key it names: a data exception (SQLSTATE class 22,
    a value its column's type cannot take) or an integrity violation (class 23: a missing
    value, a broken reference, a duplicate key, a failed check). None for any other error,
    which is not about the values (an outage, a timeout)."""
    if not isinstance(exc, psycopg.Error) or (exc.sqlstate or "")[:2] not in ("22", "23"):
        return None
    diag = exc.diag
    named = (
        ("table", diag.table_name),
        ("column", diag.column_name),
        ("constraint", diag.constraint_name),
    )
    where = ", ".join(f"{what} {value}" for what, value in named if value)
    said = diag.message_primary or type(exc).__name__
    detail = f" ({diag.message_detail})" if diag.message_detail else ""
    return f"{said}{detail}" + (f" [{where}]" if where else "")


class Tx:
    """Named statements inside one transaction of a SystemDB (see atomically)."""

    def __init__(self, db: SystemDB, conn: psycopg.Connection[Any], raw: bool = False) -> None:
        self._db = db
        self._conn = conn
        # Inside `atomically`, errors reach it untranslated (it retries conflicts).
        self._run = db.raw_run if raw else db.run_on

    def execute(self, name: str, params: dict[str, Any]) -> int:
        return int(self._run(self._conn, name, params, "count"))

    def fetch_one(self, name: str, params: dict[str, Any]) -> Row | None:
        row: Row | None = self._run(self._conn, name, params, "one")
        return row

    def fetch_all(self, name: str, params: dict[str, Any]) -> list[Row]:
        rows: list[Row] = self._run(self._conn, name, params, "all")
        return rows

    def fetch_rows(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """The rows as tuples (see SystemDB.fetch_rows)."""
        rows = self._conn.execute(self._db._queries[name], params).fetchall()
        self._db.counters.statements += 1
        return rows


_LOST = AppFault(Fault.LOST)
_FENCE = AppFault(Fault.FENCE)
_CONFLICT = AppFault(Fault.CONFLICT)
_READ_ONLY_FAULT = AppFault(Fault.READ_ONLY)


def app_error_fault(exc: BaseException) -> AppFault | None:
    """How an error from the application database looks to the protocol (an AppFault):
    LOST (the connection), FENCE (the run lost its workflow: fence_lost), CONFLICT (retry
    the transaction), UNIQUE with the violated constraint, READ_ONLY (a write refused:
    the server is a standby, or the transaction was made read-only), or None. The error
    may be psycopg's or SQLAlchemy's wrapping of it."""
    import sqlalchemy.exc

    orig: BaseException | None = exc
    invalidated = False
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        orig, invalidated = exc.orig, exc.connection_invalidated
    if isinstance(orig, psycopg.Error):
        if orig.sqlstate == FENCE_LOST:
            return _FENCE
        if orig.sqlstate == _READ_ONLY:
            return _READ_ONLY_FAULT
        if isinstance(orig, psycopg.errors.UniqueViolation):
            return AppFault(Fault.UNIQUE, orig.diag.constraint_name)
        if invalidated or is_outage(orig):
            return _LOST
        return _CONFLICT if is_conflict(orig) else None
    if invalidated:
        return _LOST
    return _CONFLICT if is_conflict(exc) else None


def write_outbox(conn: Any, schema: str, params: dict[str, Any], channel: str) -> None:
    """An application's message to a PostgresOutbox trigger (durable.triggers), on the
    application's own connection, SQLAlchemy's or psycopg's, inside its transaction: the
    message commits with the data it is about, and its consumers are woken by that commit
    (they poll too)."""
    for name, values in (
        ("outbox_write", params),
        ("outbox_notify", {"channel": channel, "topic": params["topic"]}),
    ):
        statement = sql.SQL(_loaded()[name]).format(schema=sql.Identifier(schema))
        if isinstance(conn, psycopg.Connection):
            conn.execute(statement, values)
        else:  # a SQLAlchemy Connection: through it, so that it begins its transaction
            conn.exec_driver_sql(statement.as_string(conn.connection.driver_connection), values)


@functools.cache
def _loaded() -> dict[str, str]:
    return load_queries()
