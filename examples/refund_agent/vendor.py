"""A fake payments vendor: a separate HTTP process with its own SQLite ledger.

POST /refunds {"order_id", "cents", "idempotency_key"} moves money, or, when the key was
seen before, returns the saved receipt (as Stripe does); GET /refunds/<key> looks a key up
(404 if it never landed); GET /moved lists every payment that really happened.

    python -m examples.refund_agent.vendor PORT LEDGER.sqlite
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Ledger:
    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.lock = threading.Lock()
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS moved (id INTEGER PRIMARY KEY, idempotency_key TEXT,"
            " order_id TEXT, cents INTEGER)"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS receipts (idempotency_key TEXT PRIMARY KEY,"
            " receipt TEXT, cents INTEGER)"
        )

    def refund(self, order_id: str, cents: int, key: str) -> dict[str, Any]:
        with self.lock:
            row = self.db.execute(
                "SELECT receipt, cents FROM receipts WHERE idempotency_key = ?", [key]
            ).fetchone()
            if row is not None:
                return {"id": row[0], "cents": row[1]}  # replay: no new money
            cur = self.db.execute(
                "INSERT INTO moved (idempotency_key, order_id, cents) VALUES (?, ?, ?)",
                [key, order_id, cents],
            )
            receipt = f"re_{cur.lastrowid}"
            self.db.execute("INSERT INTO receipts VALUES (?, ?, ?)", [key, receipt, cents])
            return {"id": receipt, "cents": cents}

    def lookup(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            row = self.db.execute(
                "SELECT receipt, cents FROM receipts WHERE idempotency_key = ?", [key]
            ).fetchone()
        return None if row is None else {"id": row[0], "cents": row[1]}

    def moved(self) -> list[int]:
        with self.lock:
            return [r[0] for r in self.db.execute("SELECT cents FROM moved ORDER BY id")]


def serve(port: int, path: str) -> None:
    ledger = Ledger(path)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._send(200, ledger.refund(body["order_id"], body["cents"], body["idempotency_key"]))

        def do_GET(self) -> None:
            if self.path == "/moved":
                self._send(200, ledger.moved())
            elif self.path.startswith("/refunds/"):
                found = ledger.lookup(self.path.removeprefix("/refunds/"))
                self._send(200 if found else 404, found)
            else:
                self._send(404, None)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


class Client:
    """What the workflow uses to talk to the vendor."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def refund(self, order_id: str, cents: int, idempotency_key: str) -> dict[str, Any]:
        data = json.dumps(
            {"order_id": order_id, "cents": cents, "idempotency_key": idempotency_key}
        ).encode()
        request = urllib.request.Request(
            f"{self.base_url}/refunds", data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return dict(json.loads(response.read()))

    def lookup(self, idempotency_key: str) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(
                f"{self.base_url}/refunds/{idempotency_key}", timeout=10
            ) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def moved(self) -> list[int]:
        with urllib.request.urlopen(f"{self.base_url}/moved", timeout=10) as response:
            return list(json.loads(response.read()))


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])
