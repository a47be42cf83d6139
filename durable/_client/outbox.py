"""The outbox: starts, enqueues and messages made with `conn=` in the transaction of an
application database that is not the system database, moved into the system database.

A write in the application's transaction cannot reach another database atomically, so it
lands in that database's `{schema}.outbox` table (made by `durable outbox install`), and
commits or rolls back with the application's rows. A drain (each round of a worker whose
engine has `outbox_url=`, or `durable outbox drain`) then, in one transaction of the
application database:

1. takes the oldest rows, locked (FOR UPDATE SKIP LOCKED: drainers share the work);
2. runs each row's statement in the system database, each committed there on its own:
   a workflow's insert (ON CONFLICT DO NOTHING on the id the row names) or a message's
   (ON CONFLICT DO NOTHING on its message id);
3. deletes the rows and commits.

A drainer killed between 2 and 3 leaves its rows in the outbox, unlocked once its
connection is gone; the next drain runs their statements again, which write nothing new
(the ids exist), and deletes them. So each start and each message happens once.

A message to a workflow that is not (yet) in the system database stays in the outbox and
is tried again at each drain (its start may be on its way in another drainer's round).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from typing import TYPE_CHECKING, Any

import psycopg

from durable.errors import StatementError

if TYPE_CHECKING:
    from collections.abc import Callable

    from durable._io.systemdb import SystemDB

logger = logging.getLogger("durable.outbox")


class Outbox:
    """Drains the outbox of one application database into the system database."""

    def __init__(
        self,
        db: SystemDB,
        url: str,
        notify: Callable[[str], None],
        crash_points: dict[str, int] | None = None,
    ) -> None:
        self.db, self.url, self.notify = db, url, notify
        self._crash_points = crash_points or {}
        self._crash_counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None

    def drain(self, limit: int = 100) -> int:
        """Move up to `limit` outbox rows into the system database; how many were moved."""
        with self._lock:
            conn = self._connection()
            try:
                moved = self._drain(conn, limit)
            except BaseException:
                self.close()  # its transaction (and locks) end with it
                raise
        for workflow_id in moved:
            self.notify(workflow_id)
        return len(moved)

    def _drain(self, app: psycopg.Connection[Any], limit: int) -> list[str]:
        rows = self.db.in_app_transaction(app, "app_outbox_take", {"limit": limit}, "all")
        done: list[str] = []
        moved: list[str] = []
        for row in rows:
            if self._apply(row["statement"], json.loads(row["params"])):
                done.append(row["outbox_id"])
                moved.append(json.loads(row["params"])["workflow_id"])
        self._crash_point("outbox_before_done")
        if done:
            self.db.in_app_transaction(app, "app_outbox_done", {"outbox_ids": done}, "count")
        app.commit()
        return moved

    def _apply(self, statement: str, params: dict[str, Any]) -> bool:
        """Run one row's statement in the system database; False to keep the row for a
        later drain (a message whose workflow is not there yet)."""
        if statement == "insert_workflow_pending":
            self.db.fetch_one("insert_workflow_pending", params)
        elif statement == "enqueue_workflow":
            self.db.fetch_one("enqueue_workflow", params)
        elif statement == "send_message":
            try:
                self.db.execute("send_message", params)
            except StatementError as exc:
                if exc.sqlstate != "23503":  # foreign_key_violation
                    raise
                logger.warning(
                    "outbox: a message to workflow %s waits for that workflow",
                    params["workflow_id"],
                    extra={"event": "outbox_message_waits", "workflow_id": params["workflow_id"]},
                )
                return False
        else:
            raise StatementError(statement, None, "an outbox row this release cannot run")
        return True

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(_libpq(self.url), connect_timeout=15)
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _crash_point(self, name: str) -> None:
        """SIGKILL this process the n-th time `name` is reached, if DURABLE_CRASH_POINTS arms
        it (as Runner.crash_point)."""
        if name not in self._crash_points:
            return
        count = self._crash_counts[name] = self._crash_counts.get(name, 0) + 1
        if count == self._crash_points[name]:
            os.kill(os.getpid(), signal.SIGKILL)


def _libpq(url: str) -> str:
    """psycopg does not read SQLAlchemy's `postgresql+psycopg://` prefix."""
    if url.startswith("postgresql+"):
        return "postgresql://" + url.split("://", 1)[1]
    return url
