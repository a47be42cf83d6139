"""Methods as workflows, for the crash tests of named instances.

Two `Ledger` instances, "east" and "west", are created when the module is imported (as an
application creates its instances before its worker starts). Each has its own prefix, so
the `world` table shows which instance's state a step ran with; `marks` (UNIQUE) shows a
transaction method's write happened once. `post` is the plain-def workflow, `post_async`
its `async def` twin.
"""

from __future__ import annotations

from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncConnection

import durable
from tests.apps.counter_app import World

registry = durable.Registry()


class Ledger(durable.Instance):
    def __init__(self, name: str, prefix: str) -> None:
        super().__init__(name, registry=registry)
        self.prefix = prefix

    @durable.step(registry=registry)
    def note(self, run: str, i: int) -> str:
        World.record(run, f"{self.prefix}{i}")
        return f"{self.prefix}{i}"

    @durable.transaction(registry=registry)
    def mark(self, conn: Connection, run: str, i: int) -> int:
        World.record(run, f"{self.prefix}mark{i}")
        conn.execute(text("INSERT INTO marks (workflow_id, i) VALUES (:w, :i)"), {"w": run, "i": i})
        return i

    @durable.workflow(registry=registry)
    def post(self, run: str, n: int) -> list[str]:
        out = [self.note(run, i) for i in range(n)]
        self.mark(run, n)
        return [*out, self.note(run, n + 1)]

    @durable.step(registry=registry)
    async def note_async(self, run: str, i: int) -> str:
        World.record(run, f"{self.prefix}{i}")
        return f"{self.prefix}{i}"

    @durable.transaction(registry=registry)
    async def mark_async(self, conn: AsyncConnection, run: str, i: int) -> int:
        World.record(run, f"{self.prefix}mark{i}")
        await conn.execute(
            text("INSERT INTO marks (workflow_id, i) VALUES (:w, :i)"), {"w": run, "i": i}
        )
        return i

    @durable.workflow(registry=registry)
    async def post_async(self, run: str, n: int) -> list[str]:
        out = [await self.note_async(run, i) for i in range(n)]
        await self.mark_async(run, n)
        return [*out, await self.note_async(run, n + 1)]


east = Ledger("east", "E")
west = Ledger("west", "W")
