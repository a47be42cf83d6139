"""The command line against hostile input: text stored by a workflow (ids, names, errors,
payloads) reaches the operator's terminal visible and inert, never as escape sequences it
obeys; an option given an impossible value (a number or id it cannot use) is a usage
error naming the option; a COLUMNS that is not a number is ignored."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

import durable
from durable.cli import main

# What a hostile value may hold: clear the screen, set the window title (ended by BEL),
# an OSC 8 hyperlink whose text hides its target (ended by ST), a C1 CSI (one character,
# U+009B), a carriage return and a backspace that overwrite what came before, a newline
# that forges a line of output, and a right-to-left override that reorders it.
EVIL = (
    "\x1b[2J"
    "\x1b]0;owned\x07"
    "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"
    "\x9b31m"
    "\r\x08"
    "\nSUCCESS"
    "\u202e"
)
# Control characters other than the newlines that end the CLI's own lines (C0, DEL,
# C1), and the bidirectional controls that reorder a line on screen.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")

reg = durable.Registry()
QUEUE = durable.Queue("hq" + EVIL, registry=reg)


@durable.step(registry=reg, name="hostile.step" + EVIL)
def failing(text: str) -> str:
    raise ValueError("refused" + text)


@durable.workflow(registry=reg, name="hostile.flow" + EVIL)
def flow(text: str) -> str:
    durable.set_event("stage" + EVIL, text)
    return failing(text)


@durable.workflow(registry=reg, name="hostile.gated" + EVIL)
def gated(text: str) -> bool:
    return durable.approval("gate" + EVIL, payload={"note": text}, timeout=3600).approved


@durable.scheduled("0 0 1 1 *", name="hs" + EVIL, registry=reg)
@durable.workflow(registry=reg, name="hostile.yearly" + EVIL)
def yearly(tick: object) -> None:
    """Fires once a year: stored, never run by this test."""


def cli(*args: str, columns: str = "400") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS=columns)
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def cli_here(*args: str, columns: str = "400") -> subprocess.CompletedProcess[str]:
    """`durable ARGS` in this process (click's runner): for what the option parsing alone
    decides, which a process of its own would only make slower. What reaches the terminal
    from stored text goes through `cli`, a real process, whose every stream is checked."""
    done = CliRunner().invoke(main, list(args), env={"COLUMNS": columns}, prog_name="durable")
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception
    return subprocess.CompletedProcess(args, done.exit_code, done.stdout, done.stderr)


def assert_inert(done: subprocess.CompletedProcess[str]) -> None:
    for stream, text in (("stdout", done.stdout), ("stderr", done.stderr)):
        raw = sorted({repr(c) for c in RAW.findall(text)})
        assert not raw, f"{stream} holds raw control characters {raw}:\n{text!r}"
    assert "Traceback" not in done.stderr, done.stderr


def test_stored_escape_sequences_are_printed_escaped_by_every_command(database_url: str) -> None:
    failed_id = "w" + EVIL
    with durable.Engine(
        database_url, registry=reg, executor_id="ex" + EVIL, worker=False
    ) as engine:
        with pytest.raises(durable.errors.WorkflowFailedError):
            engine.start(flow, EVIL, workflow_id=failed_id).result(timeout=20)
        engine.start(gated, EVIL, workflow_id="g" + EVIL)
        engine.enqueue(QUEUE, flow, "later", workflow_id="q" + EVIL)
        url = ("--database-url", database_url)
        commands = {
            "list": cli("workflows", "list", *url),
            "show": cli("workflows", "show", failed_id, "--full", *url),
            "show gated": cli("workflows", "show", "g" + EVIL, "--full", *url),
            "watch": cli("workflows", "watch", failed_id, *url),
            "executors": cli("executors", "list", *url),
            "queues": cli("queues", "list", *url),
            "approvals": cli("approvals", "list", *url),
            "schedules": cli("schedules", "list", *url),
            "cancel": cli("workflows", "cancel", "g" + EVIL, *url),
        }
    for what, done in commands.items():
        assert done.returncode in (0, 1), f"{what}: {done.stderr}"
        assert_inert(done)
    # Escaped means visible: the operator sees what the value holds.
    assert "w\\x1b[2J\\x1b]0;owned\\x07" in commands["list"].stdout
    shown = commands["show"].stdout
    assert "hostile.step\\x1b[2J" in shown
    assert "refused\\x1b[2J\\x1b]0;owned\\x07\\x1b]8;;http://evil.example/" in shown
    assert "\\x9b31m\\r\\x08\\nSUCCESS\\u202e" in shown
    assert commands["watch"].returncode == 1
    assert "hostile.flow\\x1b[2J" in commands["watch"].stdout
    assert "ex\\x1b[2J" in commands["executors"].stdout
    assert "hq\\x1b[2J" in commands["queues"].stdout
    assert "gate\\x1b[2J" in commands["approvals"].stdout
    assert "hs\\x1b[2J" in commands["schedules"].stdout


def test_an_error_message_on_stderr_is_printed_escaped(database_url: str) -> None:
    # A database URL from the environment (a script, a CI secret) names a database with
    # an escape sequence; the server's "does not exist" quotes it back.
    bad = database_url.rsplit("/", 1)[0] + "/no\x1b]0;owned\x07db"
    done = cli("workflows", "list", "--database-url", bad)
    assert done.returncode == 1, done.stderr
    assert_inert(done)
    assert "no\\x1b]0;owned\\x07db" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("prune", "--finished-after", "nan"),
        ("prune", "--finished-after", "inf"),
        ("prune", "--finished-after", "-inf"),
        ("prune", "--finished-after", "1e400d"),
        ("prune", "--finished-after", "1e12d"),
        ("prune", "--finished-after", "1e8d"),
        ("prune", "--effects-after", "nan"),
        ("prune", "--effects-after", "1e12d"),
        ("prune", "--batch-size", "9223372036854775808"),
        ("executors", "list", "--stale", "inf"),
        ("executors", "list", "--stale", "1e9d"),
        ("executors", "prune", "--stale", "nan"),
        ("executors", "prune", "--stale", "1e8d"),
        ("workflows", "list", "--watch", "--interval", "nan"),
        ("workflows", "list", "--watch", "--interval", "inf"),
        ("workflows", "watch", "some-id", "--interval", "nan"),
        ("workflows", "watch", "some-id", "--interval", "1e10"),
        ("workflows", "raise-budget", "some-id", "--dollars", "nan"),
        ("workflows", "raise-budget", "some-id", "--dollars", "inf"),
        ("workflows", "raise-budget", "some-id", "--tokens", "9223372036854775808"),
        ("workflows", "raise-budget", "some-id", "--steps", "2147483648"),
        ("worker", "--app", "nowhere", "--lease-seconds", "nan"),
        ("worker", "--app", "nowhere", "--lease-seconds", "1e12"),
        ("worker", "--app", "nowhere", "--poll-interval", "inf"),
        ("worker", "--app", "nowhere", "--grace-seconds", "nan"),
        ("worker", "--app", "nowhere", "--concurrency", "99999999999999999999"),
        ("worker", "--app", "nowhere", "--prune-finished-after", "inf"),
        ("worker", "--app", "nowhere", "--prune-interval", "inf"),
        ("worker", "--app", "nowhere", "--executor-id", ""),
        ("worker", "--app", "nowhere", "--executor-id", "x" * 513),
    ],
    ids=lambda args: " ".join(args)[:60],
)
def test_an_impossible_option_value_is_a_usage_error_naming_the_option(
    database_url: str, args: tuple[str, ...]
) -> None:
    done = cli_here(*args, "--database-url", database_url)
    option = next(a for a in reversed(args) if a.startswith("--") and a != "--watch")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"Invalid value for '{option}'" in done.stderr, done.stderr


@pytest.mark.parametrize("value", ["0", "1e-9", "36500d", "1_000s", " 7D "])
def test_a_possible_duration_is_taken(database_url: str, value: str) -> None:
    done = cli_here("prune", "--dry-run", "--finished-after", value, "--database-url", database_url)
    assert done.returncode == 0, done.stderr
    assert "would delete 0 finished workflows" in done.stdout


@pytest.mark.parametrize("columns", ["abc", "", "-5", "0"])
def test_a_terminal_width_that_is_not_a_number_is_ignored(database_url: str, columns: str) -> None:
    done = cli_here("workflows", "list", "--database-url", database_url, columns=columns)
    assert done.returncode == 0, done.stderr
    assert "status" in done.stdout
