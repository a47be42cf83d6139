"""Live progress in the terminal: `durable workflows watch ID` follows a workflow through a
wait to its end; `durable workflows list --watch` redraws until Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import psycopg
import psycopg.conninfo

import durable

reg = durable.Registry()


@durable.step(registry=reg, name="watch.fetch")
def fetch(order: str) -> dict[str, str]:
    return {"order": order}


@durable.workflow(registry=reg, name="watch.gated", budget=durable.Budget(dollars=5))
def gated(order: str) -> str:
    fetch(order)
    decision = durable.approval("ship", payload={"order": order}, timeout=3600)
    return "shipped" if decision.approved else "held"


class Lines:
    """A subprocess's stdout, line by line, with a deadline on each wait."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="160")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "durable.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.seen: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def until(self, text: str, count: int = 1, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while sum(text in line for line in self.seen) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} never printed; got:\n{''.join(self.seen)}"
            try:
                self.seen.append(self._lines.get(timeout=left))
            except queue.Empty:
                continue

    def finish(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        while not self._lines.empty():
            self.seen.append(self._lines.get())
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def test_watch_follows_a_workflow_through_its_wait_to_the_end(database_url: str) -> None:
    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(gated, "o-7", workflow_id="watch-1")
        out = Lines("workflows", "watch", "watch-1", "--database-url", database_url)
        try:
            out.until("waiting: approval 'ship'")
            out.until("budget: dollars 0.0/5.0")
            engine.decide("watch-1", "ship", True, decided_by="ops")
            code = out.finish()
        finally:
            out.close()
    text = "".join(out.seen)
    assert code == 0, text
    assert "#0 step watch.fetch" in text and '{"order":"o-7"}' in text.replace(" ", "")
    assert "#1 approval approval:ship" in text
    assert text.rstrip().splitlines()[-1].startswith('SUCCESS "shipped"')


def test_watch_of_an_unknown_workflow_fails(database_url: str) -> None:
    out = Lines("workflows", "watch", "nope", "--database-url", database_url)
    assert out.finish() == 1
    out.close()
    assert "nope" in "".join(out.seen)


def test_list_watch_redraws_until_interrupted(database_url: str) -> None:
    with durable.Client(database_url) as client:
        client.submit(gated, "o-1", workflow_id="listed-1")
        out = Lines(
            "workflows", "list", "--watch", "--interval", "0.2", "--database-url", database_url
        )
        try:
            out.until("listed-1", count=2)
            client.submit(gated, "o-2", workflow_id="listed-2")
            out.until("listed-2")
            out.proc.send_signal(signal.SIGINT)
            assert out.finish() == 0
        finally:
            out.close()


def _blocked_on_a_lock(database_url: str, conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    dbname = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
        [dbname],
    ).fetchone()
    return row is not None and row[0] > 0


def test_ctrl_c_during_a_look_ends_the_watch_after_that_look(database_url: str) -> None:
    """A Ctrl-C that lands while the watch reads (here: its query waits on a lock) does not
    tear that read apart (a KeyboardInterrupt inside the database or pool code is how a
    watch could hang on its way out): the watch ends, with 0, once the read is done. A
    second Ctrl-C ends it at once, read or not."""
    with durable.Client(database_url) as client:
        client.submit(gated, "o-1", workflow_id="listed-1")
    for second_ctrl_c in (False, True):
        out = Lines(
            "workflows", "list", "--watch", "--interval", "0.2", "--database-url", database_url
        )
        try:
            out.until("listed-1", count=2)
            with psycopg.connect(database_url, autocommit=True) as locker:
                locker.execute("BEGIN")
                locker.execute("LOCK TABLE durable.workflows IN ACCESS EXCLUSIVE MODE")
                with psycopg.connect(database_url, autocommit=True) as probe:
                    deadline = time.monotonic() + 30
                    while not _blocked_on_a_lock(database_url, probe):
                        assert time.monotonic() < deadline, "the watch never read again"
                        time.sleep(0.05)
                out.proc.send_signal(signal.SIGINT)
                if second_ctrl_c:
                    time.sleep(0.3)
                    out.proc.send_signal(signal.SIGINT)
                    assert out.finish(timeout=15) == 0
                else:
                    time.sleep(1.0)
                    assert out.proc.poll() is None, "the read in flight was torn apart"
                locker.execute("ROLLBACK")
            assert out.finish(timeout=15) == 0
        finally:
            out.close()


def test_ctrl_c_while_the_watch_connects_ends_it_with_0() -> None:
    """The handler is in place before the client connects (and until it is closed): a
    server that takes the connection and never answers holds the connect; the first Ctrl-C
    is taken at the watch's first wait, the second ends it at once, quietly, with 0."""
    accepted: queue.Queue[socket.socket] = queue.Queue()
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def take() -> None:
            with contextlib.suppress(OSError):  # the server closed: the test is done
                while True:
                    accepted.put(server.accept()[0])

        threading.Thread(target=take, daemon=True).start()
        for args in (["watch", "wf-1"], ["list", "--watch"]):
            url = f"postgresql://u@127.0.0.1:{port}/db"
            out = Lines("workflows", *args, "--database-url", url)
            try:
                conn = accepted.get(timeout=30)  # the watch is connecting
                time.sleep(0.3)  # python's own handler would end it here, with 1 ("Aborted!")
                out.proc.send_signal(signal.SIGINT)
                time.sleep(0.3)
                assert out.proc.poll() is None, "the first Ctrl-C did not wait for the watch"
                out.proc.send_signal(signal.SIGINT)
                assert out.finish(timeout=15) == 0, "".join(out.seen)
                assert "Traceback" not in "".join(out.seen)
                conn.close()
            finally:
                out.close()
