"""Callback URLs: a single-use URL that a third party POSTs to, to complete one wait.

durable.callback_url() mints the URL once, as a journaled call: a replay hands out the
same URL, and a second token is never minted. The token is never stored in clear, not in
the callbacks table (which holds its sha256) and not in the journal: the journal holds a
random nonce, and the token is the HMAC-SHA256 of that nonce under the workers' secret
(DURABLE_CALLBACK_SECRET), so a replay derives the same token again while the database
alone cannot. A replay whose derived token does not hash to the journaled hash was given
another secret: it stops, naming the fix, rather than hand out a URL that answers 404.

The callbacks row is written before the call's journal row: a run that loses its claim in
between leaves a token row nobody was ever given (it expires unused); the journal row is
written through a barrier before the URL is returned, so a URL that workflow code may send
on is journaled, whatever the durability mode.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
from typing import Any

from durable._base import labels
from durable._base.models import StepKind
from durable._core.journal import barrier, record
from durable._core.ops import Execute, Gen
from durable._core.run import Run, check_interrupt
from durable.errors import ConfigurationError

# The path under a console (or `durable callbacks serve`) that callback URLs name.
PATH = "/callbacks/"
KINDS = ("message", "approval")


def token_of(secret: bytes, nonce: str) -> str:
    """The token a journaled nonce stands for under `secret` (43 URL-safe characters)."""
    mac = hmac.new(secret, b"durable callback\x00" + nonce.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


def token_hash(token: str) -> str:
    """What the database keeps of a token: its sha256, in hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def url_of(base_url: str, token: str) -> str:
    return f"{base_url.rstrip('/')}{PATH}{token}"


def callback_url(
    run: Run,
    kind: str,
    target: str,
    base_url: str | None,
    seconds: float,
    nonce: str,
) -> Gen[str]:
    """Mint (or, on replay, derive again) the URL that completes a wait of `kind` on
    `target` (a topic, "" the default one; or a gate's name), valid for `seconds`.
    `nonce`: fresh randomness from the caller, used only when the call is new."""
    secret = run.settings.callback_secret
    if not secret:
        raise ConfigurationError(
            "durable.callback_url() needs a secret to derive its tokens from: set "
            "DURABLE_CALLBACK_SECRET (32 characters or more, the same on every worker) where "
            "the workers run"
        )
    seq, found = run.journal.next_call(labels.callback(kind, target))
    if found is not None:
        stored: dict[str, Any] = run.loads(found.output)
        token = token_of(secret, stored["nonce"])
        if not hmac.compare_digest(token_hash(token), stored["token_hash"]):
            raise ConfigurationError(
                f"the callback URL journaled at step {seq} of {run.workflow_id} was derived "
                "with another DURABLE_CALLBACK_SECRET: give the workers the secret they had "
                "when it was minted"
            )
        return url_of(stored["base_url"], token)
    base = base_url or run.settings.callback_base_url
    if not base:
        raise ConfigurationError(
            "durable.callback_url() needs the address its POSTs reach: give base_url=... (the "
            "console's, or `durable callbacks serve`'s) or set DURABLE_CALLBACK_BASE_URL"
        )
    check_base_url(base)
    check_interrupt(run)
    token = token_of(secret, nonce)
    hashed = token_hash(token)
    expires_at = run.settings.clock.now() + dt.timedelta(seconds=seconds)
    row = {
        "token_hash": hashed,
        "workflow_id": run.workflow_id,
        "kind": kind,
        "target": target,
        "expires_at": expires_at,
    }
    yield Execute("insert_callback", row)
    stored = {
        "nonce": nonce,
        "token_hash": hashed,
        "base_url": base,
        "kind": kind,
        "target": target,
        "expires_at": expires_at.isoformat(),
    }
    output = run.settings.serializer.dumps(stored)
    yield from record(run, seq, labels.callback(kind, target), StepKind.STEP, output)
    yield from barrier(run)  # the URL may leave the workflow next: journal it first
    return url_of(base, token)


def check_base_url(base_url: object) -> None:
    """ConfigurationError unless `base_url` is an http(s) address with no query."""
    if (
        not isinstance(base_url, str)
        or not base_url.startswith(("http://", "https://"))
        or any(c in base_url for c in "?# \t\r\n")
        or len(base_url) > 2000
    ):
        raise ConfigurationError(
            f"base_url={base_url!r}: give the http(s) address the console or `durable "
            "callbacks serve` is reached at, e.g. 'https://hooks.example.com/durable'"
        )
