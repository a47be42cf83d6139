"""A client's settings and its connection to the system database: the part of a Client
(and, through it, of an Engine) that the readers, the operator actions and the messages
build on.

The pool is opened by `connect()` (an Engine opens it, larger, at launch); the one LISTEN
connection is opened by the first stream reader, watcher or worker that waits for a
notification (see `_io/listen.py`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from durable._base.clock import Clock
from durable._client import audit as _audit
from durable._client.inputs import Inputs
from durable._io.config import Config
from durable._io.listen import Listener, Subscription
from durable._io.migrate import MigrationProgress
from durable._io.systemdb import SystemDB
from durable.errors import DatabaseUnavailableError, EngineNotRunningError
from durable.serialization import Serializer

if TYPE_CHECKING:
    from durable._base.registry import Registry

    pass

logger = logging.getLogger("durable.client")


def libpq_url(url: str) -> str:
    """psycopg does not understand SQLAlchemy's `postgresql+psycopg://` prefix."""
    if url.startswith("postgresql+"):
        return "postgresql://" + url.split("://", 1)[1]
    return url


class ClientBase:
    """Settings, the system database's pool and the shared LISTEN connection."""

    config: Config
    actor: str | None = None  # who operator actions are recorded as (see _client/audit.py)

    def _configure(self, config: Config) -> None:
        """Take the resolved settings (the environment was read there, once)."""
        self.config = config
        self._database_url = config.database_url
        self.schema = config.schema
        self.migrate_on_launch = config.migrate
        self.serializer: Serializer = config.serializer
        # How workflow calls are stored (their inputs checked, encoded, read back).
        self.inputs = Inputs(config.serializer, config.max_payload_bytes)
        self.max_payload_bytes = config.max_payload_bytes
        self.connect_timeout = config.connect_timeout
        self.clock: Clock = config.clock
        # LISTEN/NOTIFY wake-ups (workers, stream readers, watchers). Off (listen=False, or
        # DURABLE_LISTEN=0) everything polls: for a pooler in transaction mode, or a
        # distributed PostgreSQL without LISTEN.
        self.listen = config.listen
        self._db: SystemDB | None = None
        self._borrowed = False  # the pool is an Engine's (see _adopt)
        self._listen_on: Listener | None = None
        self._listen_on_lock = threading.Lock()
        # Versions of the migrations this client applied when it connected (migrate=True),
        # and who hears of each as it is applied (`durable migrate` shows them).
        self.applied_migrations: list[int] = []
        self._migration_progress: MigrationProgress | None = None
        # Told of cancel requests for runs in flight: an Engine's own runs see them at once
        # (others at their next poll).
        self.on_cancel_requested: Callable[[list[tuple[str, int]], str], None] | None = None
        # Told of a pause asked (True) or withdrawn (False) of a run in flight, at its epoch.
        self.on_pause_requested: Callable[[str, int, bool], None] | None = None
        # Where the code of the workflows this client records is looked up when only a
        # name is given (a schedule's backfill or trigger): an Engine's registry for its
        # client, else the default one.
        self.registry: Registry | None = None

    def acting_as(self, actor: str) -> AbstractContextManager[None]:
        """Record the operator actions called in this block (this thread or task) as
        `actor`'s in the audit log, e.g. `with client.acting_as("ana via deploy-bot"):`."""
        return _audit.acting_as(actor)

    # -- connection --------------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        if self._database_url is None:
            from durable import _embedded

            # This project's own database on the shared embedded server.
            self._database_url = _embedded.project_url(
                data_dir=self.config.embedded_data_dir(), project=self.config.embedded_project()
            )
        return libpq_url(self._database_url)

    @property
    def db(self) -> SystemDB:
        if self._db is None:
            raise EngineNotRunningError()
        return self._db

    @property
    def running(self) -> bool:
        return self._db is not None

    def _open_db(self, max_size: int, create_database: bool = False) -> SystemDB:
        db = SystemDB(
            self.database_url,
            self.schema,
            max_size=max_size,
            clock=self.clock,
            listen=self.listen,
            claims=self.config.claims,
            response_timeout=self.config.response_timeout,
        )
        db.open(timeout=self.connect_timeout, create_database=create_database)
        try:
            if self.migrate_on_launch:
                self.applied_migrations = db.migrate(self._migration_progress)
            else:
                db.check_schema()
        except BaseException:
            db.close()
            raise
        return db

    def connect(self) -> None:
        """Open the pool and check (or, with migrate=True, apply) the schema."""
        if self._db is None:
            self._db = self._open_db(max_size=4)

    def _adopt(self, db: SystemDB | None) -> None:
        """Read and write through `db` (an Engine's pool, opened at its launch), or through
        nothing (None: at its shutdown, which closes the pool itself). A borrowed pool is
        not this client's to close: `with engine.client:` leaves the engine running."""
        self._db = db
        self._borrowed = db is not None
        self._close_outbox()

    # The Outbox this client drains (`_client.Client.drain_outbox`), holding a connection
    # to the application database.
    _outbox: Any = None

    def _close_outbox(self) -> None:
        outbox, self._outbox = self._outbox, None
        if outbox is not None:
            outbox.close()

    def close(self) -> None:
        self._close_outbox()
        if self._db is not None and not self._borrowed:
            self._close_listener()
            self._db.close()
            self._db = None

    @property
    def _listener(self) -> Listener:
        """This client's one LISTEN connection, shared by its stream readers, watchers and
        worker (see _io/listen.py); opened by the first of them to wait."""
        db = self.db
        with self._listen_on_lock:
            if self._listen_on is None or self._listen_on.db is not db:
                self._listen_on = Listener(db, (self._notify_channel, self._stream_channel))
            return self._listen_on

    def _close_listener(self) -> None:
        with self._listen_on_lock:
            listener, self._listen_on = self._listen_on, None
        if listener is not None:
            listener.close()

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def notify_work(self, payload: str = "") -> None:
        """Wake idle workers (they also poll, so a lost notification only delays)."""
        try:
            self.db.execute("notify_work", {"channel": self._notify_channel, "payload": payload})
        except DatabaseUnavailableError:
            pass

    @property
    def _notify_channel(self) -> str:
        return f"{self.schema}_work"

    @contextmanager
    def _notifications(self) -> Iterator[Subscription]:
        """For watchers: LISTEN on the work channel (the client's shared listener), yielding
        the subscription: its `wait(seconds)` returns the payloads (mostly workflow ids:
        woken, decided, sent to, cancelled, resumed) notified since the last call, waiting
        up to `seconds` for one, [] when none came; `woken(seconds)` says whether one came.
        Journal writes send no notification (a step costs one round trip), so watchers poll
        too; without a LISTEN connection they only sleep."""
        subscription = self._listener.subscribe(self._notify_channel)
        try:
            yield subscription
        finally:
            subscription.close()

    @property
    def _stream_channel(self) -> str:
        return f"{self.schema}_streams"
