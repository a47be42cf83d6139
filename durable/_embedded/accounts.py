"""The account that runs the embedded server, and what it can reach.

PostgreSQL refuses to run as root, so as root initdb and the server run as an existing
unprivileged account. Which account, whether it can enter a directory, and the root-only
base directory under /var/lib are one concern, apart from the files and programs that
depend on the answer.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from durable.errors import EmbeddedServerError

if TYPE_CHECKING:
    import pwd


def _root_fallback_base() -> Path:
    # A fixed, persistent place rather than $TMPDIR, so that every process finds the same
    # server and a reboot does not wipe the journals. Only root uses it.
    return Path("/var/lib") / "durable-embedded"


def _make_private_base(base: Path) -> None:
    """The root-only base directory: created 0755, refused if someone else made it."""
    created = not base.exists()
    base.mkdir(parents=True, exist_ok=True)
    if created:
        base.chmod(0o755)
    st = base.lstat()
    if (
        not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise EmbeddedServerError(
            f"{base} is not a directory owned by us and writable only by us (someone else "
            "may have made it): remove it, or set DURABLE_DATA_DIR"
        )


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _server_user(data_dir: Path) -> pwd.struct_passwd | None:
    """The account to run initdb and the server as; None to run them as ourselves.

    As root: the owner of an existing data directory (a directory made by a normal user stays
    theirs), else `postgres`, else `nobody`. We never create an account.
    """
    if not _is_root():
        return None
    import pwd

    with contextlib.suppress(FileNotFoundError):
        owner = data_dir.stat().st_uid
        if owner == 0 and (data_dir / "PG_VERSION").exists():
            raise EmbeddedServerError(
                f"the data directory {data_dir} belongs to root, and PostgreSQL refuses to run "
                "as root: `chown -R postgres: <dir>` it (or to another unprivileged user), or "
                "set DURABLE_DATA_DIR to a new directory"
            )
        if owner != 0 and (data_dir / "PG_VERSION").exists():
            try:
                return pwd.getpwuid(owner)
            except KeyError:
                raise EmbeddedServerError(
                    f"the data directory {data_dir} belongs to uid {owner}, which has no "
                    "account: chown it to an existing user, or set DURABLE_DATA_DIR"
                ) from None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise EmbeddedServerError(
        "running as root and no unprivileged 'postgres' or 'nobody' account exists to run the "
        "embedded server (PostgreSQL refuses root): run as a normal user, or pass a database URL"
    )


def _permits(st: os.stat_result, user: pwd.struct_passwd, groups: set[int], bits: int) -> bool:
    """Whether a file's mode grants `user` the `bits` (4 read, 2 write, 1 execute; ACLs aside)."""
    if st.st_uid == user.pw_uid:
        shift = 6
    elif st.st_gid in groups:
        shift = 3
    else:
        shift = 0
    return (st.st_mode >> shift) & bits == bits


def _can_reach(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether `user` may traverse every existing ancestor of `path` (ACLs aside)."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for ancestor in reversed(path.parents):
        try:
            st = ancestor.stat()
        except FileNotFoundError:
            return True  # the rest is created by us, world-traversable
        if not _permits(st, user, groups, 1):
            return False
    return True


def _make_parent(data_dir: Path, user: pwd.struct_passwd | None) -> None:
    """Create the data directory's parents; as root make sure `user` can reach it."""
    parent = data_dir.parent
    created = [p for p in (parent, *parent.parents) if not p.exists()]
    parent.mkdir(parents=True, exist_ok=True)
    if user is None:
        return
    for path in created:  # only directories we have just made; the umask may be 077
        path.chmod(0o755)
    if parent == _root_fallback_base():
        _make_private_base(parent)
    if not _can_reach(data_dir, user):
        raise EmbeddedServerError(
            f"running as root, the embedded server runs as the unprivileged user "
            f"{user.pw_name!r} (PostgreSQL refuses root), who cannot reach {data_dir}: set "
            "DURABLE_DATA_DIR (or pass data_dir) to a directory whose parents that user can "
            "enter, e.g. under /tmp or /var/lib"
        )
