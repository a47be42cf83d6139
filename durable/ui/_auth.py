"""Who may act: the operator token, presented once at sign-in and then carried by a session
cookie, or sent with each request by a script (the X-Durable-Token header, as a Bearer
token, or as the password of Basic authentication).

A session cookie is opaque and bound to the token: `issued.nonce.mac`, where the MAC is an
HMAC-SHA256, keyed by a hash of the token, of the time it was issued and a random nonce. It
holds nothing secret, needs no server-side store (so it survives a restart of the console,
and works across the processes of a mounted app), and a console given another token cannot
verify it: changing the token signs every session out. It expires after SESSION_SECONDS;
signing out deletes it in the browser and revokes it in this process.

A wrong token is a guess: the Throttle counts them per client address and in all, and past
its limits the console answers 429 (Retry-After) without looking at the token, the right one
included, until the window has passed. A session cookie is not throttled: its MAC cannot be
guessed, and signed-in operators keep working while someone else is locked out.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import secrets
import time
from collections import deque
from collections.abc import Callable

from starlette.requests import Request

from durable.errors import WeakTokenError

TOKEN_HEADER = "X-Durable-Token"
SESSION_COOKIE = "durable_session"
SESSION_SECONDS = 12 * 3600
# Failed token attempts allowed in a sliding window, from one client address and from all
# of them together (the second stops a guesser spread over many addresses; a signed-in
# session keeps working through it).
FAILURES_PER_ADDRESS = 10
FAILURES_OVERALL = 100
FAILURE_WINDOW_SECONDS = 60.0
# A token that guards a console beyond loopback: this long, with this many different
# characters (secrets.token_urlsafe(32) gives 43 characters, 256 random bits).
STRONG_TOKEN_LENGTH = 32
STRONG_TOKEN_DISTINCT = 10


def weakness(token: str) -> str | None:
    """Why `token` is too short or too repetitive to guard a console that others can reach
    (anyone who reaches it may guess), or None when it is strong."""
    if len(token) < STRONG_TOKEN_LENGTH:
        return f"it has {len(token)} characters, fewer than {STRONG_TOKEN_LENGTH}"
    if len(set(token)) < STRONG_TOKEN_DISTINCT:
        return f"it uses {len(set(token))} different characters, fewer than {STRONG_TOKEN_DISTINCT}"
    return None


def check_strong(token: str) -> None:
    """WeakTokenError when `token` is weak (see weakness): refused where others can reach
    the console. A console given a weak token anyway (create_app, mounted) answers to
    loopback clients only (_Console.refusal)."""
    why = weakness(token)
    if why is not None:
        raise WeakTokenError(why)


def bearer_token(header: str | None) -> bytes | None:
    """The token of a Bearer Authorization header."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip().encode("latin-1")


def basic_password(header: str | None) -> bytes | None:
    """The password of a Basic Authorization header (the user name is ignored)."""
    scheme, _, encoded = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    _, colon, password = decoded.partition(b":")
    return password if colon else None


class Sessions:
    """Issues and checks the session cookies of one token (see the module's docstring)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self._key = hashlib.sha256(b"durable console session\x00" + self._token).digest()
        self._revoked: set[str] = set()

    def is_token(self, given: bytes) -> bool:
        """Whether `given` is the token, compared in constant time."""
        return hmac.compare_digest(given, self._token)

    def _mac(self, issued: str, nonce: str) -> str:
        message = f"{issued}.{nonce}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def issue(self) -> str:
        """A new session's cookie value (only ever after the token was presented)."""
        issued, nonce = str(int(time.time())), secrets.token_urlsafe(18)
        return f"{issued}.{nonce}.{self._mac(issued, nonce)}"

    def valid(self, cookie: str | None) -> bool:
        """Whether a cookie is a live session of this token: its MAC checks out (compared in
        constant time), it has not expired, and it was not signed out here."""
        issued, _, rest = (cookie or "").partition(".")
        nonce, _, mac = rest.partition(".")
        if not (issued.isdigit() and nonce and mac) or nonce in self._revoked:
            return False
        if not hmac.compare_digest(mac.encode(), self._mac(issued, nonce).encode()):
            return False
        return 0 <= time.time() - int(issued) < SESSION_SECONDS

    def revoke(self, cookie: str | None) -> None:
        """Sign a session out in this process (the browser deletes its cookie too)."""
        if self.valid(cookie):
            self._revoked.add((cookie or "").split(".")[1])

    def nonce(self, cookie: str | None) -> str | None:
        """A live session's nonce (not secret: it names the session, the MAC proves it)."""
        return (cookie or "").split(".")[1] if self.valid(cookie) else None


def credential(request: Request) -> bytes | None:
    """The token a request presents: the X-Durable-Token header, else a Bearer token or a
    Basic password; None when it presents none (a session cookie may still sign it in)."""
    header = request.headers.get(TOKEN_HEADER)
    if header is not None:
        return header.encode("latin-1")
    authorization = request.headers.get("authorization")
    return bearer_token(authorization) or basic_password(authorization)


class Throttle:
    """Failed token attempts, per client address and in all, in a sliding window of
    `window` seconds (see the module's docstring). Bounded: once `overall` failures are in
    the window no more are recorded, so it holds at most that many."""

    def __init__(
        self,
        per_address: int = FAILURES_PER_ADDRESS,
        overall: int = FAILURES_OVERALL,
        window: float = FAILURE_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_address = per_address
        self.overall = overall
        self.window = window
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._all: deque[float] = deque()

    def _expire(self, now: float) -> None:
        while self._all and self._all[0] <= now - self.window:
            self._all.popleft()
        for address in list(self._failures):
            times = self._failures[address]
            while times and times[0] <= now - self.window:
                times.popleft()
            if not times:
                del self._failures[address]

    def wait(self, address: str) -> int:
        """Seconds before `address` may present a token again (0: it may now)."""
        now = self.clock()
        self._expire(now)
        waits = []
        times = self._failures.get(address)
        if times is not None and len(times) >= self.per_address:
            waits.append(times[-self.per_address] + self.window - now)
        if len(self._all) >= self.overall:
            waits.append(self._all[-self.overall] + self.window - now)
        return max(1, math.ceil(max(waits))) if waits else 0

    def failed(self, address: str) -> None:
        now = self.clock()
        self._failures.setdefault(address, deque()).append(now)
        self._all.append(now)

    def succeeded(self, address: str) -> None:
        """The right token from `address`: its own count starts again."""
        self._failures.pop(address, None)
