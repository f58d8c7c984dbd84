"""The tool loop with a real MCP server: the example server over stdio, configured by file."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
import trio

from conftest import parse_sse
from spec import validate_event, validate_response

EXAMPLE = pathlib.Path(__file__).parent.parent / "examples" / "mcp_server.py"


@pytest.fixture
async def mcp_gateway(start_gateway, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"example": {"command": sys.executable, "args": [str(EXAMPLE)]}}}))
    url = await start_gateway(mcp_servers_config_path=str(config))
    return url


async def wait_tools(client, url: str, backend) -> None:
    """The server connects in the background; wait until the gateway offers its tools."""
    with trio.fail_after(30):
        while True:
            await client.post(url + "/v1/responses", json={"model": "text", "input": "ping"})
            if any(t["function"]["name"] == "add" for t in backend.chat_requests[-1].get("tools", [])):
                return
            await trio.sleep(0.05)  # the MCP server's start-up is outside the test's control


async def test_the_example_mcp_servers_tool_runs_in_the_loop(mcp_gateway, client, backend):
    await wait_tools(client, mcp_gateway, backend)
    r = await client.post(mcp_gateway + "/v1/responses", json={"model": "mcp-add", "input": "2+3?", "stream": True})
    frames = parse_sse(r.content)
    for event in frames[:-1]:
        validate_event(event)
    final = frames[-2]["response"]
    validate_response(final)
    call = next(item for item in final["output"] if item["type"] == "mcp_call")
    assert (call["server_label"], call["name"], call["output"], call["status"]) == ("example", "add", "5", "completed")
    assert final["output"][-1]["content"][0]["text"] == "Tool result: 5"


async def test_a_failing_mcp_tool_is_reported_to_the_model(mcp_gateway, client, backend):
    await wait_tools(client, mcp_gateway, backend)
    final = (await client.post(mcp_gateway + "/v1/responses", json={"model": "mcp-fail", "input": "x"})).json()
    call = next(item for item in final["output"] if item["type"] == "mcp_call")
    assert call["status"] == "failed" and "boom" in call["error"]
    assert final["status"] == "completed" and "boom" in final["output"][-1]["content"][0]["text"]


async def test_chat_completions_use_the_mcp_server_too(mcp_gateway, client, backend):
    await wait_tools(client, mcp_gateway, backend)
    body = (
        await client.post(mcp_gateway + "/v1/chat/completions", json={"model": "mcp-parallel", "messages": [{"role": "user", "content": "x"}]})
    ).json()
    assert body["choices"][0]["message"]["content"].endswith("Tool result: hi")
    tool_messages = [m for m in backend.chat_requests[-1]["messages"] if m["role"] == "tool"]
    assert sorted(m["content"] for m in tool_messages) == ["3", "hi"]


async def test_a_hosted_mcp_tool_may_name_a_configured_server_by_its_label(mcp_gateway, client, backend):
    await wait_tools(client, mcp_gateway, backend)
    final = (
        await client.post(
            mcp_gateway + "/v1/responses",
            json={
                "model": "mcp-add",
                "input": "2+3?",
                "tools": [{"type": "mcp", "server_label": "example", "require_approval": "never"}],
            },
        )
    ).json()
    assert final["output"][0]["type"] == "mcp_list_tools" and final["output"][0]["server_label"] == "example"
    call = next(item for item in final["output"] if item["type"] == "mcp_call")
    assert (call["server_label"], call["output"]) == ("example", "5")
    r = await client.post(
        mcp_gateway + "/v1/responses", json={"model": "text", "input": "x", "tools": [{"type": "mcp", "server_label": "nope"}]}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].server_url"
