"""The `durable` command: migrate the schema, inspect workflows, manage the embedded server.

Every command takes --database-url (or DURABLE_DATABASE_URL); without either it uses this
project's database on the embedded server (the project: DURABLE_PROJECT_DIR, else found up
from the working directory). Each says on stderr which database it uses. Tables are
printed for people; --json prints data for scripts. Exit codes:
0 success, 1 a durable error (message on stderr), 2 bad usage.

The commands live in modules by group (`_workflows` with `_bulk`, `_worker`, `_approvals`,
`_schedules`, `_database`, `_ui`, `_audit`, `_callbacks`, `_outbox`, `_mcp`, `_init`), with
what they share in `_options` and `_common`; this module makes the `main` group (the
`durable` console script) and attaches them.
"""

from __future__ import annotations

import click

from durable.cli._approvals import approvals
from durable.cli._audit import audit
from durable.cli._bulk import bulk
from durable.cli._callbacks import callbacks
from durable.cli._database import db, migrate, prune
from durable.cli._init import init
from durable.cli._mcp import mcp
from durable.cli._outbox import outbox
from durable.cli._schedules import queues, schedules
from durable.cli._ui import ui
from durable.cli._worker import executors, worker
from durable.cli._workflows import send, workflows

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="durable-pg", prog_name="durable")
def main() -> None:
    """durable: durable workflows journaled in PostgreSQL."""


for _command in (
    migrate,
    workflows,
    executors,
    queues,
    worker,
    send,
    prune,
    approvals,
    schedules,
    ui,
    db,
    audit,
    callbacks,
    outbox,
    mcp,
    init,
):
    main.add_command(_command)
workflows.add_command(bulk)
