"""The MCP server (durable.integrations.mcp, `durable mcp`) over a real database, through the
MCP SDK's own client: the tools it lists with and without the operator token, a failed
workflow found and read with its stored error, a cancel with the token that leaves its
audit row, the same cancel refused by name without it, and the command that
docs/operations.md gives a coding assistant, run as written over stdio."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import durable

mcp = pytest.importorskip("mcp")

import httpx2  # noqa: E402
from mcp import Client as MCPClient  # noqa: E402
from mcp import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from durable.integrations.mcp import GUARDED_TOOLS, READ_TOOLS, create_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
reg = durable.Registry()
elsewhere = durable.Registry()  # code no worker of these tests has: its runs stay PENDING


@durable.step(registry=reg)
def charge_card(amount: int) -> str:
    raise ValueError(f"card declined for {amount}")


@durable.workflow(registry=reg, name="mcp.checkout")
def checkout(amount: int) -> str:
    return charge_card(amount)


@durable.workflow(registry=elsewhere, name="mcp.idle")
def idle(n: int) -> int:
    return n


def _call(server: Any, tool: str, **arguments: Any) -> Any:
    async def go() -> Any:
        async with MCPClient(server) as session:
            return await session.call_tool(tool, arguments)

    return asyncio.run(go())


def _tools(server: Any) -> set[str]:
    async def go() -> set[str]:
        async with MCPClient(server) as session:
            return {t.name for t in (await session.list_tools()).tools}

    return asyncio.run(go())


def _data(result: Any) -> Any:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


def _failed_checkout(database_url: str) -> str:
    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(checkout, 42, workflow_id="mcp-failed", attributes={"shop": "s-1"})
        with pytest.raises(Exception, match="card declined"):
            handle.result(timeout=20)
    return handle.workflow_id


def test_reads_find_a_failed_workflow_and_its_traceback_without_the_token(
    database_url: str,
) -> None:
    failed = _failed_checkout(database_url)
    with durable.Client(database_url) as client:
        client.submit(idle, 1, workflow_id="mcp-idle")
        server = create_server(client)
        assert _tools(server) == set(READ_TOOLS)  # no operator action listed

        chosen = {"status": ["error"], "attributes": {"shop": "s-1"}}
        listed = _data(_call(server, "list_workflows", **chosen))
        assert [w["workflow_id"] for w in listed["workflows"]] == [failed]
        assert _data(_call(server, "list_workflows", where=["shop=s-2"]))["workflows"] == []
        pending = _data(_call(server, "list_workflows", status="PENDING"))["workflows"]
        assert [w["workflow_id"] for w in pending] == ["mcp-idle"]

        shown = _data(_call(server, "show_workflow", workflow_id=failed))
        assert shown["status"] == "ERROR" and shown["inputs"] == {"args": [42], "kwargs": {}}
        assert shown["error"]["type"].endswith("ValueError")
        assert "card declined for 42" in shown["error"]["message"]
        assert "charge_card" in shown["error"]["traceback"]

        error = _data(_call(server, "workflow_error", workflow_id=failed))
        assert error["failed_steps"][0]["step_name"].endswith("charge_card")
        steps = _data(_call(server, "workflow_steps", workflow_id=failed))["steps"]
        assert steps and steps[0]["error"]["message"] == "card declined for 42"

        # An operator action, unlisted, is refused by name; the workflow is untouched.
        refused = _call(server, "cancel_workflow", workflow_id="mcp-idle")
        assert refused.is_error and "--token" in refused.content[0].text
        assert client.get_workflow("mcp-idle").status is durable.WorkflowStatus.PENDING
        assert client.audit_log("mcp-idle") == []
        # Bad input is refused with its reason.
        unknown = _call(server, "show_workflow", workflow_id="no-such-run")
        assert unknown.is_error and "no-such-run" in unknown.content[0].text
        bad_limit = _call(server, "list_workflows", limit=0)
        assert bad_limit.is_error


def test_with_the_token_a_cancel_is_done_and_audited_as_the_server(database_url: str) -> None:
    with durable.Client(database_url) as client:
        client.submit(idle, 1, workflow_id="mcp-cancel")
        server = create_server(client, token="operator-token", actor="ana@ops via mcp")
        assert _tools(server) == set(READ_TOOLS) | set(GUARDED_TOOLS)
        done = _data(_call(server, "cancel_workflow", workflow_id="mcp-cancel", reason="dup"))
        assert done["status"] == "CANCELLED"
        assert client.get_workflow("mcp-cancel").status is durable.WorkflowStatus.CANCELLED
        rows = client.audit_log("mcp-cancel")
        assert [(r["action"], r["actor"]) for r in rows] == [("cancel", "ana@ops via mcp")]
        audited = _data(_call(server, "audit_log", workflow_id="mcp-cancel"))["audit"]
        assert audited[0]["action"] == "cancel"
        # The other actions go through the Client's audited methods too.
        _data(_call(server, "resume_workflow", workflow_id="mcp-cancel"))
        forked = _data(_call(server, "fork_workflow", workflow_id="mcp-cancel", from_step=0))
        assert client.get_workflow(forked["workflow_id"]).name == "mcp.idle"
        actions = [(r["action"], r["actor"]) for r in reversed(client.audit_log("mcp-cancel"))]
        assert [a for a, _ in actions] == ["cancel", "resume", "fork"]
        assert {who for _, who in actions} == {"ana@ops via mcp"}
        gate = _call(server, "decide_approval", workflow_id="mcp-cancel", name="ship", approve=True)
        assert gate.is_error and "ship" in gate.content[0].text  # no such gate, by name
        waiting = _data(_call(server, "show_workflow", workflow_id=forked["workflow_id"]))
        assert waiting["waiting_for_worker"] is True  # no live worker has mcp.idle's code


def _documented_server() -> dict[str, Any]:
    """The MCP server entry that docs/operations.md gives a coding assistant."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## MCP server", 1)[1]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None, "docs/operations.md: the MCP server's config block"
    entry: dict[str, Any] = json.loads(block.group(1))["mcpServers"]["durable"]
    return entry


def test_the_documented_command_serves_over_stdio(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    """`durable mcp` as docs/operations.md configures it, over stdio: reads offered, and
    with the token in its environment, a cancel recorded as `user@host via mcp`."""
    entry = _documented_server()
    assert entry["command"] == "durable"
    args = [database_url if a.startswith("postgresql://") else a for a in entry["args"]]
    with durable.Client(database_url) as client:
        client.submit(idle, 1, workflow_id="mcp-stdio")

    async def go(env: dict[str, str]) -> tuple[set[str], Any]:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "durable.cli", *args], env=env
        )
        async with MCPClient(params) as session:
            names = {t.name for t in (await session.list_tools()).tools}
            return names, await session.call_tool("cancel_workflow", {"workflow_id": "mcp-stdio"})

    env = {k: v for k, v in subprocess_env.items() if k != "DURABLE_UI_TOKEN"}
    names, refused = asyncio.run(go(env))
    assert names == set(READ_TOOLS) and refused.is_error
    names, done = asyncio.run(go(env | entry.get("env", {}) | {"DURABLE_UI_TOKEN": "t0ken"}))
    assert names == set(READ_TOOLS) | set(GUARDED_TOOLS)
    assert _data(done)["workflow_id"] == "mcp-stdio"
    with durable.Client(database_url) as client:
        rows = client.audit_log("mcp-stdio")
    assert [r["action"] for r in rows] == ["cancel"]
    assert rows[0]["actor"].endswith(" via mcp")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_over_http_every_request_needs_the_token(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    """`durable mcp --http` given a token answers only requests that present it: without
    it, 401 and nothing done; with it, the operator actions, audited as `via mcp`."""
    with durable.Client(database_url) as client:
        client.submit(idle, 1, workflow_id="mcp-http")
    port = _free_port()
    token = "http-operator-token"
    command = [sys.executable, "-m", "durable.cli", "mcp", "--http", "--port", str(port)]
    env = subprocess_env | {"DURABLE_UI_TOKEN": token, "DURABLE_DATABASE_URL": database_url}
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "durable mcp --http never listened"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"
        anonymous = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert anonymous.status_code == 401
        wrong = httpx2.post(url, headers={"Authorization": "Bearer nope"}, json={})
        assert wrong.status_code == 401

        async def go() -> tuple[set[str], Any]:
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx2.AsyncClient(headers=headers) as http:
                transport = streamable_http_client(url, http_client=http)
                async with MCPClient(transport) as session:
                    names = {t.name for t in (await session.list_tools()).tools}
                    arguments = {"workflow_id": "mcp-http"}
                    return names, await session.call_tool("cancel_workflow", arguments)

        names, done = asyncio.run(go())
        assert names == set(READ_TOOLS) | set(GUARDED_TOOLS)
        assert _data(done)["status"] == "CANCELLED"
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    with durable.Client(database_url) as client:
        rows = client.audit_log("mcp-http")
    assert [r["action"] for r in rows] == ["cancel"] and rows[0]["actor"].endswith(" via mcp")


def test_beyond_loopback_http_needs_a_strong_token() -> None:
    """`durable mcp --http --host 0.0.0.0` refuses to listen without a token (usage, exit
    2) or with a weak one (WeakTokenError, exit 1): every request would reach the tools.
    Refused before it connects (the database named here does not answer)."""
    from click.testing import CliRunner

    from durable.cli import main

    nowhere = "postgresql://postgres@127.0.0.1:1/none"
    base = ["mcp", "--http", "--host", "0.0.0.0", "--database-url", nowhere]
    bare = CliRunner().invoke(main, base, env={"DURABLE_UI_TOKEN": ""})
    assert bare.exit_code == 2 and "beyond loopback" in bare.output
    weak = CliRunner().invoke(main, [*base, "--token", "short"])
    assert weak.exit_code == 1 and "token_urlsafe" in weak.output
