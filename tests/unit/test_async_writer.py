"""The async durability mode's writer: a run waits at its barrier until its records are
written, and is told, not left waiting, when the writer can write them no more."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from durable._io.durability import AsyncWriter
from durable.errors import DatabaseUnavailableError


class Down(BaseException):
    """What goes through the writer's thread when its process goes down (SystemExit)."""


class DB:
    """write_steps as the system database answers it: every row written, or `fail`."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail
        self.rows: list[dict[str, Any]] = []

    def write_steps(self, conn: Any, rows: list[dict[str, Any]]) -> list[str]:
        if self.fail is not None:
            raise self.fail
        self.rows += rows
        return [r["workflow_id"] for r in rows]


def row(seq: int) -> dict[str, Any]:
    return {"workflow_id": "w", "epoch": 1, "step_seq": seq}


def quietly(args: threading.ExceptHookArgs) -> None:
    if not isinstance(args.exc_value, Down):
        threading.__excepthook__(args)


def test_a_barrier_waits_for_the_run_s_records_to_be_written() -> None:
    db = DB()
    writer = AsyncWriter(db)  # type: ignore[arg-type]
    writer.put(row(1))
    writer.put(row(2))
    writer.wait("w", 1)
    assert [r["step_seq"] for r in db.rows] == [1, 2]
    writer.stop()


def test_a_writer_gone_down_interrupts_its_waiters_instead_of_holding_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its thread ended (a BaseException went through it) with a record of the run unwritten:
    # the run's barrier, a flush and a later record are told the writer stopped (the run is
    # interrupted, as by an outage, and recovered), and none of them waits forever.
    monkeypatch.setattr(threading, "excepthook", quietly)
    writer = AsyncWriter(DB(fail=Down()))  # type: ignore[arg-type]
    writer.put(row(1))
    writer.put({**row(1), "workflow_id": "v"})
    writer._thread.join(5)
    assert not writer._thread.is_alive()
    done: list[BaseException] = []

    def barrier() -> None:
        try:
            writer.wait("w", 1)
        except BaseException as exc:
            done.append(exc)

    waiter = threading.Thread(target=barrier, daemon=True)
    waiter.start()
    waiter.join(5)
    assert not waiter.is_alive(), "the run waits forever for a writer that is gone"
    assert isinstance(done[0], DatabaseUnavailableError)
    with pytest.raises(DatabaseUnavailableError):
        writer.flush()  # the other run's record
    with pytest.raises(DatabaseUnavailableError):
        writer.put(row(2))
    writer.stop(flush=True)  # a clean shutdown does not wait for it either
