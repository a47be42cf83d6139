"""Database URLs: whether one names this machine or the same database as another, whether
libpq can read it, and how to show it (or an error that quotes it) without its password.

Pure text and libpq's parser: nothing here connects. The SystemDB checks its URL with
these before it connects; the runner (the application database's URL), the engine and the
outage log read and redact URLs with them too, without a SystemDB.
"""

from __future__ import annotations

import re

import psycopg

from durable.errors import ConfigurationError


def is_local(url: str) -> bool:
    """Whether `url` names a server on this machine (loopback or a Unix socket)."""
    try:
        host = str(psycopg.conninfo.conninfo_to_dict(url).get("host") or "")
    except psycopg.ProgrammingError:
        return False
    return all(
        h in ("", "localhost", "127.0.0.1", "::1") or h.startswith("/") for h in host.split(",")
    )


def _password(url: str) -> str | None:
    try:
        value = psycopg.conninfo.conninfo_to_dict(url).get("password")
    except psycopg.ProgrammingError:
        value = None
    if value is None and "://" in url and "@" in url:
        userinfo = url.split("://", 1)[1].rsplit("@", 1)[0]
        value = userinfo.split(":", 1)[1] if ":" in userinfo else None
    return None if value is None else str(value)


def _scrub(text: str, secret: str | None) -> str:
    """`text` with the password (and its percent-encoded form) masked."""
    if secret:
        from urllib.parse import quote

        for form in {secret, quote(secret, safe="")}:
            text = text.replace(form, "***")
    return text


def check_url(url: str) -> None:
    """Raise ConfigurationError (naming no password) unless libpq can parse `url`, and
    unless its password is percent-encoded (a raw '@' or '/' in it makes libpq read part
    of the password as the host, which would then appear in its error messages)."""
    if "://" in url:
        rest = url.split("://", 1)[1].split("?", 1)[0]
        if rest.count("@") > 1 or ("@" in rest and "/" in rest.rsplit("@", 1)[0]):
            raise ConfigurationError(
                f"the database URL {redact(url)} has a raw '@' or '/' before its host: "
                "percent-encode them in the user and password (@ as %40, / as %2F)"
            )
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(
            f"the database URL {redact(url)} cannot be parsed ({_scrub(str(exc), _password(url))})"
            ": write it as postgresql://user:password@host:port/dbname, with special "
            "characters in the password percent-encoded (/ as %2F, @ as %40)"
        ) from None


def redact(url: str) -> str:
    """The URL without its password, for messages and logs (also when it cannot be parsed,
    e.g. a password with a raw '/' in it)."""
    if "://" in url:
        scheme, rest = url.split("://", 1)
        if "@" in rest.split("?", 1)[0]:
            userinfo, host = rest.rsplit("@", 1)
            user = userinfo.split(":", 1)[0]
            rest = f"{user}:***@{host}" if ":" in userinfo else rest
        # A password may also ride in the query (?password=..., ?sslpassword=...).
        return re.sub(r"((?:^|[?&])(?:ssl)?password=)[^&]*", r"\1***", f"{scheme}://{rest}")
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable url>"
    if "password" in info:
        info["password"] = "***"
    return psycopg.conninfo.make_conninfo("", **{k: str(v) for k, v in info.items()})


def same_database(url_a: str, url_b: str) -> bool:
    """Whether two URLs name the same database on the same server."""

    def key(url: str) -> tuple[str, str, str]:
        info = psycopg.conninfo.conninfo_to_dict(url)
        host = str(info.get("host") or "localhost")
        if host in ("127.0.0.1", "::1"):
            host = "localhost"
        return host, str(info.get("port") or "5432"), str(info.get("dbname") or "")

    return key(url_a) == key(url_b)
