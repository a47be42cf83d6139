"""Completing a wait through its callback URL: what a POST to `/callbacks/<token>` does,
whoever serves it (the console, `durable callbacks serve`; the HTTP side is
durable/ui/_callbacks.py).

The token is the credential: no operator token is asked for. It is looked up by its sha256
(the database holds nothing else of it), and the hash found is compared again in constant
time. One transaction spends it and delivers what was posted: a message on its topic (its
id derived from the token, so it is one message whatever retries it), or the decision of
its gate (with an audit row naming the callback and the caller's address). So a wait is
completed at most once, and a second POST, here or on a server started since, answers
409 with the first outcome, read back from the row.

The answers: 200 (done, with the outcome), 404 (no such token: the same answer whether or
not any workflow exists), 409 (spent: the first outcome; or the gate was already decided
by someone else), 410 (expired, or the workflow has ended or is gone), 400 (a body that
does not fit the wait), 503 with Retry-After (the workflow has not asked for that decision
yet: nothing was spent, POST again).
"""

from __future__ import annotations

import hmac
import json
import re
from dataclasses import dataclass
from typing import Any

from durable._base import labels
from durable._base.models import ApprovalStatus, WorkflowStatus
from durable._base.names import check_text
from durable._client import audit
from durable._client.client import Client
from durable._core import token_hash
from durable._io.systemdb import Tx
from durable.errors import InvalidNameError, PayloadTooLargeError, SerializationError
from durable.serialization import dumps_checked

# A token as durable.callback_url() makes them: 43 URL-safe base64 characters. Anything
# else is refused before the database is asked.
TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")
# Seconds a caller is told to wait when the gate it decides has not been asked yet.
RETRY_SECONDS = 5


@dataclass(frozen=True)
class Answer:
    """What to answer a POST: an HTTP status and a JSON body (and a Retry-After)."""

    status: int
    body: dict[str, Any]
    retry_after: int | None = None


NOT_FOUND = Answer(404, {"error": "no such callback"})


class _Refused(Exception):
    """Roll the transaction back and answer this."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.status)
        self.answer = answer


def _decision(value: Any) -> tuple[bool, str | None, str | None]:
    """(approved, comment, by) of an approval's body: {"approved": bool, "comment": str,
    "by": str} (the last two optional)."""
    if not isinstance(value, dict) or not isinstance(value.get("approved"), bool):
        raise _Refused(
            Answer(
                400,
                {
                    "error": 'an approval\'s body is {"approved": true|false, "comment": '
                    '"...", "by": "..."} (comment and by optional)'
                },
            )
        )
    extra = set(value) - {"approved", "comment", "by"}
    if extra:
        raise _Refused(Answer(400, {"error": f"unknown fields: {sorted(extra)}"}))
    comment, by = value.get("comment"), value.get("by")
    try:
        check_text("comment", comment)
        check_text("by", by)
    except InvalidNameError as exc:
        raise _Refused(Answer(400, {"error": str(exc)})) from None
    return value["approved"], comment, by


def _spent(row: dict[str, Any]) -> Answer:
    """The answer to a token already used, or expired."""
    if row["used_at"] is not None:
        return Answer(
            409,
            {
                "error": "this callback was already used",
                "outcome": json.loads(row["outcome"] or "null"),
                "used_at": row["used_at"].isoformat(),
            },
        )
    return Answer(410, {"error": "this callback has expired"})


def complete(client: Client, token: str, value: Any, address: str = "unknown") -> Answer:
    """Complete the wait that `token` was minted for with `value` (the posted JSON), as
    the module's docstring says, and wake its workflow."""
    if not TOKEN.fullmatch(token):
        return NOT_FOUND
    hashed = token_hash(token)

    def work(tx: Tx) -> tuple[Answer, str]:
        found = tx.fetch_one("find_callback", {"token_hash": hashed})
        if found is None or not hmac.compare_digest(str(found["token_hash"]), hashed):
            raise _Refused(NOT_FOUND)
        if found["used_at"] is not None or found["expired"]:
            raise _Refused(_spent(found))
        workflow_id, target = str(found["workflow_id"]), str(found["target"])
        if found["kind"] == "approval":
            approved, comment, by = _decision(value)
            status = ApprovalStatus.APPROVED if approved else ApprovalStatus.DENIED
            outcome: dict[str, Any] = {"status": status.value}
        else:
            try:
                payload = dumps_checked(
                    client.serializer, value, "the posted body", client.max_payload_bytes
                )
            except PayloadTooLargeError as exc:
                raise _Refused(Answer(413, {"error": str(exc)})) from None
            except SerializationError as exc:
                raise _Refused(Answer(400, {"error": str(exc)})) from None
            outcome = {"status": "delivered"}
        used = tx.fetch_one("use_callback", {"token_hash": hashed, "outcome": json.dumps(outcome)})
        if used is None:  # spent or expired since it was read: answer as it is now
            again = tx.fetch_one("find_callback", {"token_hash": hashed})
            raise _Refused(NOT_FOUND if again is None else _spent(again))
        row = tx.fetch_one("get_workflow_status", {"workflow_id": workflow_id})
        if row is None or WorkflowStatus(row["status"]).is_terminal:
            raise _Refused(Answer(410, {"error": "the workflow this callback was for has ended"}))
        if found["kind"] == "approval":
            _decide(tx, workflow_id, target, status, comment, by, address)
        else:
            message = {
                "workflow_id": workflow_id,
                "message_id": labels.callback_message_id(hashed),
                "topic": target,
                "payload": payload,
                "sender_id": None,
                "sender_seq": None,
            }
            tx.execute("send_message", message)
        body = {"ok": True, "outcome": outcome, "used_at": used["used_at"].isoformat()}
        return Answer(200, body), workflow_id

    try:
        answer, workflow_id = client.db.atomically(work, "complete_callback")
    except _Refused as refused:
        return refused.answer
    client.notify_work(workflow_id)
    return answer


def _decide(
    tx: Tx,
    workflow_id: str,
    name: str,
    status: ApprovalStatus,
    comment: str | None,
    by: str | None,
    address: str,
) -> None:
    """Decide the gate, with its audit row; refused when it is not waiting."""
    params = {
        "workflow_id": workflow_id,
        "name": name,
        "status": status.value,
        "comment": comment,
        "decided_by": by or "callback",
    }
    row = tx.fetch_one("decide_approval", params)
    if row is not None and row["decided"]:
        action = "approve" if status is ApprovalStatus.APPROVED else "deny"
        audit.record(tx, f"callback {address}", [(workflow_id, action, name, comment)])
        return
    gate = tx.fetch_one("get_approval", {"workflow_id": workflow_id, "name": name})
    if gate is None:
        raise _Refused(
            Answer(
                503,
                {"error": "the workflow does not wait for this decision yet: POST it again"},
                RETRY_SECONDS,
            )
        )
    raise _Refused(
        Answer(
            409,
            {"error": "the gate was already decided", "outcome": {"status": gate["status"]}},
        )
    )
