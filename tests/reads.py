"""The tests' own reads of a database, on one kept connection per database.

A test that waits for the world to change polls it, often every 50 ms. With a new
connection per look, each look costs the server a backend's start (about 6 ms of CPU here,
more than the query) and the client a handshake: over the suite, tens of thousands of them,
a good part of what its runs spend. Here a look reuses the connection its database already
has. The connection is at READ COMMITTED whatever the database's default (under
DURABLE_TEST_ISOLATION=serializable even a read can be refused with 40001), autocommit, so
each look sees what is committed at once and holds no snapshot or lock.

The connections are closed after each test (tests/conftest.py), and before its database is
recycled, whose check wants no session left on it. One that broke (a server restarted, a
proxy cut) is replaced once; if a new one fails too, the error is the test's, as it was
when every look connected."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

_lock = threading.Lock()
_kept: dict[str, psycopg.Connection[tuple[Any, ...]]] = {}


def _connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(
        url, autocommit=True, options="-c default_transaction_isolation=read\\ committed"
    )


def rows(url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """All rows of `query` on the database at `url`."""
    with _lock:
        conn = _kept.get(url)
        if conn is not None and not conn.closed:
            try:
                return conn.execute(query, params).fetchall()
            except psycopg.OperationalError:
                # A query cancelled, timed out or deadlocked leaves the connection good:
                # that error is the test's. Only a connection psycopg found broken is
                # replaced.
                if not conn.closed:
                    raise
        conn = _kept[url] = _connect(url)
        return conn.execute(query, params).fetchall()


def scalar(url: str, query: str, params: Any = None) -> Any:
    """The first column of the first row of `query` (None when there is no row)."""
    found = rows(url, query, params)
    return found[0][0] if found else None


def close(url: str | None = None) -> None:
    """Close the kept connection to `url` (to every database when None)."""
    with _lock:
        urls = [url] if url is not None else list(_kept)
        for each in urls:
            conn = _kept.pop(each, None)
            if conn is not None:
                conn.close()
