"""Methods as workflows type-check as they run: an instance method, a classmethod and a
staticmethod keep their signatures under the durable decorators, and a @transaction
method's connection leaves its signature after `self` (not `self` in its place)."""

from __future__ import annotations

import pytest

from tests.unit.strict_mypy import GROUP, checked

SNIPPET = """
from sqlalchemy import Connection

import durable


class Account(durable.Instance):
    def __init__(self, name: str, rate: int) -> None:
        super().__init__(name)
        self.rate = rate

    @durable.step()
    def fee(self, cents: int) -> int:
        return cents * self.rate

    @durable.transaction()
    def book(self, conn: Connection, cents: int) -> int:
        return cents

    @durable.workflow()
    def charge(self, cents: int) -> int:
        return self.fee(cents) + self.book(cents) + self.total(1) + Account.double(cents)

    @durable.workflow()
    async def charge_async(self, cents: int) -> int:
        return cents

    @classmethod
    @durable.workflow()
    def total(cls, x: int) -> int:
        return x

    @staticmethod
    @durable.step()
    def double(x: int) -> int:
        return 2 * x


@durable.transaction()
def plain(conn: Connection, x: int) -> int:
    return x


async def main(engine: durable.Engine, client: durable.Client, a: Account) -> None:
    n: int = a.charge(1)
    engine.start(a.charge, 1)
    await engine.start_async(a.charge_async, 1)
    client.submit(Account.total, 2)
    m: int = plain(3) + a.book(2) + n
    print(m)
"""


@GROUP
def test_methods_under_durable_decorators_pass_strict_mypy(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    done = checked("methods", tmp_path_factory)
    assert done.errors == [], "\n".join(done.rows)
