"""What a Client or an Engine is configured with, resolved once: the arguments given, then
the environment, then the defaults, checked together.

Before, the environment was read in five modules, each at its own moment (the database URL
when first connecting, the claims mode when the pool opened, crash points when the runner
was made), and each argument was checked where it was stored. Now `Config.resolve` is the
one place that reads `DURABLE_*` variables and refuses a bad value, and the frozen result
is passed down: to the SystemDB (claims mode, LISTEN), the runner (crash points, limits)
and the worker (intervals). Nothing below reads the environment.

The variables:
  DURABLE_DATABASE_URL   the system database when no URL is given (else the embedded one)
  DURABLE_LISTEN=0       poll instead of LISTEN/NOTIFY (a pooler in transaction mode, or
                         a distributed PostgreSQL without LISTEN)
  DURABLE_CLAIMS         "cas" (compare-and-set claims) or "skip-locked" (row locks); by
                         default the schema decides (cas on a Citus-distributed one)
  DURABLE_FAKE_CLOCK     a FakeClock's file: real worker processes on a test's fake time
  DURABLE_RESPONSE_TIMEOUT  seconds a statement waits for the database to answer (default
                         5; 0: for ever), past which it counts as unreachable
  DURABLE_CRASH_POINTS   crash tests: "point[:nth],..." where the process SIGKILLs itself
  DURABLE_QUEUES         "a,b": the queues an engine takes work from, when `queues=` is not
                         given (unset: every queue of its registry)
  DURABLE_DATA_DIR       the embedded server's data directory (else the user data dir)
  DURABLE_PROJECT_DIR    the project whose embedded database is used (else the nearest
                         directory up from the working one with a pyproject.toml or .git)
  DURABLE_CALLBACK_SECRET  the key callback URLs' tokens are derived with (the same on
                         every worker; 32 characters or more): durable.callback_url()
  DURABLE_CALLBACK_BASE_URL  where callback URLs point when the call names no base_url
  DURABLE_LOG_LEVEL      `durable worker`'s log level (read through click's envvar=, as the
                         worker's process number and its supervisor's pipe are)

Outside this module only `durable/testing.py` reads the environment (the test database,
as a test suite's conftest would); `tests/unit/test_config.py` checks it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from durable._base.clock import Clock, FakeClock, SystemClock
from durable._base.names import check_name
from durable._base.urls import redact
from durable.errors import ConfigurationError
from durable.serialization import JSONSerializer, Serializer

if TYPE_CHECKING:
    from durable._embedded.projects import Project
    from durable._io.retention import RetentionPolicy

Claims = Literal["auto", "cas", "skip-locked"]
Durability = Literal["sync", "async", "exit"]


def _no_crash_points() -> dict[str, int]:
    return {}


@dataclass(frozen=True)
class Config:
    """A Client's or an Engine's settings (see their docstrings for each one's meaning).
    Build it with `Config.resolve`; the Client and Engine arguments are its fields."""

    database_url: str | None = None  # None: the embedded server's (found at connect)
    schema: str = "durable"
    migrate: bool = False
    serializer: Serializer = field(default_factory=JSONSerializer)
    max_payload_bytes: int = 2_000_000
    connect_timeout: float = 15.0
    # None: the default (5 s), 0: wait for ever (see _io/bounded.py).
    response_timeout: float | None = None
    clock: Clock = field(default_factory=SystemClock)
    listen: bool = True
    claims: Claims = "auto"
    # The application database whose outbox is drained (conn= on another database).
    outbox_url: str | None = None
    # The Engine's.
    app_database_url: str | None = None
    lease_seconds: float = 30.0
    max_recovery_attempts: int = 10
    max_workers: int = 8
    max_async: int = 1000
    durability: Durability = "sync"
    executor_id: str = ""
    explicit_id: bool = False  # the executor id was given (a stable identity)
    worker: bool = False
    poll_interval: float = 1.0
    grace_seconds: float = 30.0
    retention: RetentionPolicy | None = None
    create_database: bool | None = None
    crash_points: dict[str, int] = field(default_factory=_no_crash_points)
    # The embedded server's data directory (None: the user data directory).
    data_dir: str | None = None
    # The project whose embedded database is used (None: found from the working directory).
    project_dir: str | None = None
    # durable.callback_url(): the key its tokens are derived with, and where its URLs point.
    callback_secret: bytes | None = field(default=None, repr=False)
    callback_base_url: str | None = None
    # The queues whose entries this engine runs (None: every queue of its registry); work
    # that came from no queue is run whatever they are (see Claims).
    queues: tuple[str, ...] | None = None

    @property
    def cancel_poll_interval(self) -> float:
        """How often a worker reads cancel requests for its runs: often enough that a
        cancel lands well within a lease."""
        return min(0.5, self.lease_seconds / 3)

    @property
    def live_seconds(self) -> float:
        """How recent an executor's heartbeat must be for it to count as live, where the
        code it has decides whether a workflow waits for a worker: several of its beats
        (one every third of a lease), so that a slow beat does not make work look
        stranded, and at least two minutes."""
        return max(120.0, 4 * self.lease_seconds)

    @classmethod
    def resolve(
        cls,
        *,
        environ: Mapping[str, str] | None = None,
        database_url: str | None = None,
        schema: str = "durable",
        migrate: bool = False,
        serializer: Serializer | None = None,
        max_payload_bytes: int = 2_000_000,
        connect_timeout: float = 15.0,
        response_timeout: float | None = None,
        clock: Clock | None = None,
        listen: bool | None = None,
        outbox_url: str | None = None,
        app_database_url: str | None = None,
        lease_seconds: float = 30.0,
        max_recovery_attempts: int = 10,
        max_workers: int = 8,
        max_async: int = 1000,
        durability: str = "sync",
        executor_id: str | None = None,
        worker: bool = False,
        poll_interval: float = 1.0,
        grace_seconds: float = 30.0,
        retention: RetentionPolicy | None = None,
        create_database: bool | None = None,
        queues: Iterable[str] | None = None,
    ) -> Config:
        """The settings from these arguments and the environment (`environ`, default
        os.environ); ConfigurationError naming the first bad one and how to fix it."""
        from durable._io.retention import RetentionPolicy

        env = os.environ if environ is None else environ
        check_schema(schema)
        if max_payload_bytes <= 0:
            raise ConfigurationError(f"max_payload_bytes={max_payload_bytes!r}: use > 0")
        if lease_seconds <= 0:
            raise ConfigurationError(f"lease_seconds={lease_seconds!r}: use a positive number")
        if max_workers < 1:
            raise ConfigurationError(f"max_workers={max_workers!r}: use at least 1")
        if max_async < 1:
            raise ConfigurationError(f"max_async={max_async!r}: use at least 1")
        if durability not in ("sync", "async", "exit"):
            raise ConfigurationError(f"durability={durability!r}: use 'sync', 'async' or 'exit'")
        if retention is not None and not isinstance(retention, RetentionPolicy):
            raise ConfigurationError(
                f"retention={retention!r}: give durable.RetentionPolicy(finished_after=..., "
                "effects_after=...)"
            )
        claims = env.get("DURABLE_CLAIMS", "")
        if claims not in ("", "cas", "skip-locked"):
            raise ConfigurationError(
                f"DURABLE_CLAIMS={claims!r}: use 'cas' (compare-and-set claims) or "
                "'skip-locked' (the default on one server)"
            )
        fake_clock = env.get("DURABLE_FAKE_CLOCK")
        secret = env.get("DURABLE_CALLBACK_SECRET") or None
        if secret is not None and (len(secret) < 32 or len(set(secret)) < 10):
            raise ConfigurationError(
                "DURABLE_CALLBACK_SECRET is too weak to derive callback tokens from: give 32 "
                "characters or more, e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'"
            )
        routed = _queues(queues, env.get("DURABLE_QUEUES"))
        answer = _response_timeout(response_timeout, env.get("DURABLE_RESPONSE_TIMEOUT"))
        return cls(
            database_url=database_url or env.get("DURABLE_DATABASE_URL") or None,
            schema=schema,
            migrate=migrate,
            serializer=serializer if serializer is not None else JSONSerializer(),
            max_payload_bytes=max_payload_bytes,
            connect_timeout=connect_timeout,
            response_timeout=answer,
            clock=(
                clock
                if clock is not None
                else (FakeClock(path=fake_clock) if fake_clock else SystemClock())
            ),
            listen=listen if listen is not None else env.get("DURABLE_LISTEN", "1") != "0",
            claims="cas" if claims == "cas" else "skip-locked" if claims else "auto",
            outbox_url=outbox_url,
            app_database_url=app_database_url,
            lease_seconds=float(lease_seconds),
            max_recovery_attempts=max_recovery_attempts,
            max_workers=max_workers,
            max_async=max_async,
            durability=cast("Durability", durability),
            executor_id=executor_id or str(uuid.uuid4()),
            explicit_id=executor_id is not None,
            worker=worker,
            poll_interval=poll_interval,
            grace_seconds=grace_seconds,
            retention=retention,
            create_database=create_database,
            crash_points=crash_points(env.get("DURABLE_CRASH_POINTS", "")),
            data_dir=env.get("DURABLE_DATA_DIR") or None,
            project_dir=env.get("DURABLE_PROJECT_DIR") or None,
            callback_secret=None if secret is None else secret.encode("utf-8"),
            callback_base_url=env.get("DURABLE_CALLBACK_BASE_URL") or None,
            queues=routed,
        )

    def embedded_data_dir(self) -> Path | None:
        """Where the embedded server keeps its data (None: its default, see _embedded)."""
        return None if self.data_dir is None else Path(self.data_dir)

    def embedded_project(self) -> Project:
        """The project whose embedded database is used, and how it was chosen (pinned by
        DURABLE_PROJECT_DIR, found by its pyproject.toml or .git, or guessed)."""
        from durable._embedded.projects import find_project

        return find_project(pinned=self.project_dir)

    def describe_database(self) -> str:
        """The database these settings use, for a person: its URL without the password,
        or "the embedded database of project <dir>". Connects to nothing."""
        if self.database_url:
            return f"the database at {redact(self.database_url)}"
        return self.embedded_project().describe()


def describe_database(url: str | None = None, *, environ: Mapping[str, str] | None = None) -> str:
    """The database in use, for a person (a console's header, a notice on stderr): `url`
    (else DURABLE_DATABASE_URL) without its password, or "the embedded database of project
    <dir>" when there is none, or when `url` is a project's embedded database this process
    opened. Connects to nothing."""
    if url:
        from durable._embedded.projects import describe_url

        return describe_url(url)
    return Config.resolve(environ=environ).describe_database()


def _queues(given: Iterable[str] | None, env: str | None) -> tuple[str, ...] | None:
    """queues= (else DURABLE_QUEUES, comma-separated): the names, checked and without
    repeats, in the order given; None when neither is given (every queue). An empty list
    is kept: an engine that takes no queue's entries (it only enqueues)."""
    if given is None:
        if not env or not env.strip():
            return None
        names = [n.strip() for n in env.split(",")]
        if not all(names):
            raise ConfigurationError(
                f"DURABLE_QUEUES={env!r}: give queue names separated by commas, e.g. 'a,b'"
            )
        given = names
    if isinstance(given, str | bytes):
        raise ConfigurationError(
            f"queues={given!r}: give a list of queue names, e.g. queues=[{given!r}]"
        )
    try:
        names = list(given)
    except TypeError:
        raise ConfigurationError(
            f"queues={given!r}: give a list of queue names, or None for every queue"
        ) from None
    for name in names:
        check_name("queue name", name)
    return tuple(dict.fromkeys(names))


def _response_timeout(given: float | None, env: str | None) -> float | None:
    """response_timeout= (else DURABLE_RESPONSE_TIMEOUT); None when neither is given (the
    default: see SystemDB), 0 for no bound."""
    if given is None and env:
        try:
            given = float(env)
        except ValueError:
            given = -1.0
        if given < 0:
            raise ConfigurationError(
                f"DURABLE_RESPONSE_TIMEOUT={env!r}: give seconds (0 waits for ever)"
            )
    if given is None:
        return None
    if given < 0:
        raise ConfigurationError(f"response_timeout={given!r}: give seconds (0 waits for ever)")
    return float(given)


MAX_SCHEMA_BYTES = 58


def check_schema(schema: object) -> None:
    """ConfigurationError unless `schema` can name durable's schema (what Client and
    `durable migrate --citus --dry-run` accept alike)."""
    if not isinstance(schema, str) or not schema:
        raise ConfigurationError(f"schema={schema!r}: give a non-empty schema name")
    check_name("schema", schema)
    if len(schema.encode("utf-8")) > MAX_SCHEMA_BYTES:
        # PostgreSQL truncates identifiers to 63 bytes; the work channel is "<schema>_work".
        raise ConfigurationError(
            f"schema={schema!r} is {len(schema.encode('utf-8'))} bytes: give at most "
            f"{MAX_SCHEMA_BYTES} (PostgreSQL names are at most 63 bytes, and the "
            "notification channel adds '_work')"
        )


def crash_points(spec: str) -> dict[str, int]:
    """DURABLE_CRASH_POINTS ("point[:nth],..."): each point and at which pass it fires."""
    points: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, nth = part.partition(":")
        try:
            points[name] = int(nth or "1")
        except ValueError:
            raise ConfigurationError(
                f"DURABLE_CRASH_POINTS={spec!r}: write each point as name or name:n"
            ) from None
    return points
