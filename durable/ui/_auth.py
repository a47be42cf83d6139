"""Who may act: the operator token, presented once at sign-in and then carried by a session
cookie, or sent with each request by a script (the X-Durable-Token header, or as the
password of Basic authentication).

A session cookie is opaque and bound to the token: `issued.nonce.mac`, where the MAC is an
HMAC-SHA256, keyed by a hash of the token, of the time it was issued and a random nonce. It
holds nothing secret, needs no server-side store (so it survives a restart of the console,
and works across the processes of a mounted app), and a console given another token cannot
verify it: changing the token signs every session out. It expires after SESSION_SECONDS;
signing out deletes it in the browser and revokes it in this process.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time

from starlette.requests import Request

TOKEN_HEADER = "X-Durable-Token"
SESSION_COOKIE = "durable_session"
SESSION_SECONDS = 12 * 3600


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

    def presented(self, request: Request) -> bool:
        """Whether a request carries the token: in the header, as a Basic password, or by a
        live session cookie."""
        header = request.headers.get(TOKEN_HEADER)
        if header is not None:
            return self.is_token(header.encode("latin-1"))
        password = basic_password(request.headers.get("authorization"))
        if password is not None:
            return self.is_token(password)
        return self.valid(request.cookies.get(SESSION_COOKIE))
