"""Polling-only mode (listen=False, or DURABLE_LISTEN=0): for a pooler in transaction mode
or a distributed PostgreSQL, where LISTEN does not work. Nothing LISTENs, and waiting still
works: a worker picks up submitted work, a message wakes a waiting workflow, a stream
reader follows a stream. (CI also runs the waiting suites with DURABLE_LISTEN=0.)"""

from __future__ import annotations

import threading

import psycopg
import pytest

import durable


def _listeners(url: str) -> int:
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query LIKE 'LISTEN%%'"
            " AND pid <> pg_backend_pid()",
            [dbname],
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("listen", [False, True])
def test_waiting_works_with_and_without_listen(database_url: str, listen: bool) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="talker")
    def talker() -> str:
        message = durable.recv("go", timeout=60)
        durable.write_stream("out", f"got {message}")
        durable.close_stream("out")
        return str(message)

    seen: list[int] = []
    with durable.Client(database_url, migrate=True, listen=listen) as client:
        client.submit(talker, workflow_id="talker-1")
        with durable.Engine(
            database_url, registry=reg, worker=True, poll_interval=0.1, listen=listen
        ):
            values: list[object] = []
            reader = threading.Thread(
                target=lambda: values.extend(
                    client.read_stream("talker-1", "out", poll_interval=0.1)
                )
            )
            reader.start()
            client.send("talker-1", "hello", topic="go")
            assert client.retrieve("talker-1").result(timeout=30) == "hello"
            seen.append(_listeners(database_url))
            reader.join(timeout=30)
        assert values == ["got hello"]
    # A worker listens for work unless told not to; with listen=False nothing does.
    assert (seen[0] == 0) is (not listen)
