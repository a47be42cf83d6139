"""The system database's connections, the same through both drivers' checkouts
(SystemDB.connection for sync runs, SystemDB.async_connection for an event loop's): a
checkout that cannot be had is an outage, and a connection an outage came through is
closed rather than handed to the next run."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from durable import errors
from durable._systemdb import SystemDB


def test_a_checkout_from_a_closed_pool_is_an_outage_in_both_drivers(database_url: str) -> None:
    db = SystemDB(database_url, "durable")
    db.open()
    db.close()
    with pytest.raises(errors.DatabaseUnavailableError, match="checkout"):
        with db.connection():
            pass

    async def checkout() -> None:
        pool = db.async_pool(2)
        await pool.open(wait=True)
        await pool.close()
        async with db.async_connection(pool):
            pass

    with pytest.raises(errors.DatabaseUnavailableError, match="checkout"):
        asyncio.run(checkout())


def test_a_write_refused_by_a_read_only_server_closes_the_connection_in_both_drivers(
    database_url: str,
) -> None:
    """A server that turned read-only refuses every later write on the connections made
    to it: as raised by psycopg (an `atomically` block) or as translated, the error closes
    the connection it came through."""
    db = SystemDB(database_url, "durable")
    db.open()
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            with db.connection() as conn:
                conn.execute("SET default_transaction_read_only = on")
                conn.execute("CREATE TABLE refused ()")
        assert conn.closed

        async def refused() -> bool:
            pool = db.async_pool(2)
            await pool.open(wait=True)
            try:
                with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                    async with db.async_connection(pool) as aconn:
                        await aconn.execute("SET default_transaction_read_only = on")
                        await aconn.execute("CREATE TABLE refused ()")
                return aconn.closed  # (before the pool's close closes every connection)
            finally:
                await pool.close()

        assert asyncio.run(refused())
    finally:
        db.close()
