"""The command line says what went wrong: a failed workflow's traceback with the user's
frames first and durable's folded, a message to a finished workflow refused by name, stored
values as JSON values in --json, lists narrowed by id, parent and time with whole ids on
request, the running step and its time in `watch`, and shell completion."""

from __future__ import annotations

import datetime as dt
import inspect
import json
import os
import re
import subprocess
import sys
import threading

from click.testing import CliRunner, Result

import durable
from durable.cli import main
from tests.integration.test_cli_watch import Lines

reg = durable.Registry()


@durable.step(registry=reg, name="fail.charge")
def charge(cents: int) -> int:
    raise ValueError(f"card declined for {cents}")


@durable.workflow(registry=reg, name="fail.pay")
def pay(cents: int) -> int:
    return charge(cents)


@durable.step(registry=reg, name="fail.quote")
def quote(order: str) -> dict[str, object]:
    return {"order": order, "lines": [1, 2], "at": dt.datetime(2026, 3, 1, tzinfo=dt.UTC)}


@durable.workflow(registry=reg, name="fail.order")
def order(order_id: str, *, rush: bool = False) -> dict[str, object]:
    q = quote(order_id)
    return {"quoted": q["lines"], "rush": rush}


@durable.workflow(registry=reg, name="fail.forgiving")
def forgiving(cents: int) -> str:
    try:
        charge(cents)
    except ValueError:
        return "declined, and said so"
    return "charged"


@durable.workflow(registry=reg, name="fail.parent")
def parent() -> dict[str, object]:
    return order("o-child")


def _ended(handle: durable.WorkflowHandle) -> None:
    try:
        handle.result(timeout=10)
    except durable.errors.WorkflowFailedError:
        pass


def cli(*args: str, **env: str) -> Result:
    """`durable ARGS` in this process (click's runner), with these environment variables."""
    return CliRunner().invoke(main, list(args), env=env, prog_name="durable")


def test_show_prints_the_users_frames_before_durables_folded_ones(database_url: str) -> None:
    with durable.Engine(database_url, registry=reg) as engine:
        _ended(engine.start(pay, 300, workflow_id="pay-1"))
        engine.start(forgiving, 5, workflow_id="forgiving-1").result(timeout=10)
    shown = cli("workflows", "show", "pay-1", "--database-url", database_url)
    assert shown.exit_code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    raising = inspect.getsourcelines(charge)[1] + 2  # the `raise` in charge
    calling = inspect.getsourcelines(pay)[1] + 2  # the call of charge in pay
    user = [f'File "{__file__}", line {calling}, in pay', f'File "{__file__}", line {raising}']
    at = [next(i for i, line in enumerate(lines) if text in line) for text in user]
    folded = next(
        i for i, line in enumerate(lines) if re.search(r"… \d+ frames in durable …", line)
    )
    assert at[0] < at[1] < folded, shown.output
    assert "ValueError: card declined for 300" in lines[folded + 1]
    assert "durable/_run" not in shown.output  # durable's own frames are folded
    caught = cli("workflows", "show", "forgiving-1", "--database-url", database_url)
    assert caught.exit_code == 0, caught.output
    after = caught.stdout.split("step #0 fail.charge failed:", 1)[1]  # its error was caught
    assert after.index(f"line {raising}") < after.index("… 1 frame in durable …")
    whole = cli("workflows", "show", "pay-1", "--full", "--database-url", database_url)
    assert re.search(r"durable[/\\]_run[/\\]", whole.output), whole.output


def test_send_to_a_finished_workflow_is_an_error_naming_its_status(database_url: str) -> None:
    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(order, "o-1", workflow_id="done-1").result(timeout=10)
        _ended(engine.start(pay, 1, workflow_id="failed-1"))
    done = cli("send", "done-1", '{"go": true}', "--database-url", database_url)
    assert done.exit_code == 1
    assert "done-1" in done.stderr and "SUCCESS" in done.stderr
    failed = cli("send", "failed-1", "hi", "--database-url", database_url)
    assert failed.exit_code == 1 and "ERROR" in failed.stderr
    running = cli("send", "nobody-yet", "hi", "--before-start", "--database-url", database_url)
    assert running.exit_code == 0, running.stderr  # a message kept for a later start still goes


def test_json_carries_inputs_and_outputs_as_json_values(database_url: str) -> None:
    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(order, "o-7", rush=True, workflow_id="json-1").result(timeout=10)
    shown = cli("workflows", "show", "json-1", "--json", "--database-url", database_url)
    assert shown.exit_code == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["inputs"] == {"args": ["o-7"], "kwargs": {"rush": True}}
    assert data["output"] == {"quoted": [1, 2], "rush": True}
    step = data["steps"][0]["output"]
    assert step["order"] == "o-7" and step["lines"] == [1, 2]
    assert step["at"].startswith("2026-03-01")  # a datetime, as its ISO text


def test_list_by_id_prefix_and_time_with_whole_ids(database_url: str) -> None:
    long_id = "invoice-2026-03-customer-0042-" + "x" * 70 + "-end"
    with durable.Client(database_url) as client:
        for workflow_id in (long_id, "invoice-2", "refund-1"):
            client.submit(order, "o", workflow_id=workflow_id)

    def ids(*args: str) -> list[str]:
        done = cli("workflows", "list", *args, "--json", "--database-url", database_url)
        assert done.exit_code == 0, done.stderr
        return sorted(row["workflow_id"] for row in json.loads(done.stdout))

    assert ids("--id-prefix", "invoice-") == sorted([long_id, "invoice-2"])
    assert ids("--since", "1h") == sorted([long_id, "invoice-2", "refund-1"])
    assert ids("--until", "1h") == []
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    assert ids("--since", later) == [] and len(ids("--until", later)) == 3
    assert ids("--id-prefix", "refund", "--since", "2000-01-01") == ["refund-1"]
    assert ids("--since", "2000-03-01T00:00:00Z", "--until", "2000-03-02T00:00:00Z") == []
    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(parent, workflow_id="parent-1").result(timeout=10)
    children = ids("--parent", "parent-1")
    assert len(children) == 1 and children[0] != "parent-1"
    bad = cli("workflows", "list", "--since", "yesterday", "--database-url", database_url)
    assert bad.exit_code == 2 and "duration ago" in bad.stderr

    narrow = cli("workflows", "list", "--database-url", database_url, COLUMNS="100")
    assert long_id not in narrow.output  # shortened to fit the terminal
    for flag in ("--full-ids", "--wide"):
        wide = cli("workflows", "list", flag, "--database-url", database_url, COLUMNS="100")
        assert wide.exit_code == 0, wide.stderr
        row = next(line for line in wide.output.splitlines() if long_id in line)
        assert "PENDING" in row  # the whole id and the rest of its row, on one line


def test_watch_shows_the_running_step_and_how_long_it_has_run(database_url: str) -> None:
    release = threading.Event()
    slow = durable.Registry()

    @durable.step(registry=slow, name="slow.prepare")
    def prepare() -> int:
        return 1

    @durable.step(registry=slow, name="slow.wait")
    def wait_for_release() -> str:
        release.wait(60)
        return "released"

    @durable.workflow(registry=slow, name="slow.flow")
    def flow() -> str:
        prepare()
        return wait_for_release()

    with durable.Engine(database_url, registry=slow) as engine:
        handle = engine.start(flow, workflow_id="slow-1")
        out = Lines(
            "workflows", "watch", "slow-1", "--interval", "0.2", "--database-url", database_url
        )
        try:
            out.until("running: step #1")
            out.until("running: step #1", count=2)  # said again as its time passes
            release.set()
            assert handle.result(timeout=30) == "released"
            code = out.finish()
        finally:
            release.set()
            out.close()
    text = "".join(out.seen)
    assert code == 0, text
    assert re.search(r"running: step #1 \(after #0 slow\.prepare\), for \d+\.\ds", text), text


def test_shell_completion_scripts_are_produced() -> None:
    for shell, marker in (
        ("bash", "complete -o nosort -F _durable_completion durable"),
        ("zsh", "#compdef durable"),
        ("fish", "complete --no-files --command durable"),
    ):
        done = cli(_DURABLE_COMPLETE=f"{shell}_source")
        assert done.exit_code == 0, done.output
        assert marker in done.output, done.output
    words = cli(
        _DURABLE_COMPLETE="bash_complete", COMP_WORDS="durable workflows li", COMP_CWORD="2"
    )
    assert "plain,list" in words.output.split(), words.output
    # `python -m durable.cli` is completed as `durable` too
    module = subprocess.run(
        [sys.executable, "-m", "durable.cli"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "_DURABLE_COMPLETE": "bash_source"},
    )
    assert "complete -o nosort -F _durable_completion durable" in module.stdout, module.stderr
