"""The hosted `mcp` tool: a request names an MCP server; approvals pause and resume the turn."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import parse_sse
from spec import validate_event, validate_response
from test_mcp_manager import make_test_server, start_http_server


@pytest.fixture
async def hosted(nursery, start_gateway):
    mcp_url = await start_http_server(nursery, make_test_server())
    url = await start_gateway(mcp_allowed_urls="127.0.0.1")
    return url, mcp_url


def mcp_tool(server_url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "calc", "server_url": server_url, **extra}


async def test_tools_are_listed_and_run_without_approval(hosted, client):
    url, mcp_url = hosted
    r = await client.post(
        url + "/v1/responses",
        json={"model": "mcp-add", "input": "2+3?", "stream": True, "tools": [mcp_tool(mcp_url, require_approval="never")]},
    )
    frames = parse_sse(r.content)
    for event in frames[:-1]:
        validate_event(event)
    kinds = [f["type"] for f in frames[:-1]]
    assert kinds[2:6] == [
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
    ]
    final = frames[-2]["response"]
    validate_response(final)
    listing, call = final["output"][0], next(i for i in final["output"] if i["type"] == "mcp_call")
    assert listing["type"] == "mcp_list_tools" and "add" in [t["name"] for t in listing["tools"]]
    assert (call["server_label"], call["name"], call["output"]) == ("calc", "add", "5")
    assert final["output"][-1]["content"][0]["text"] == "Tool result: 5"


async def test_an_approval_request_ends_the_turn_and_an_approval_resumes_it(hosted, client, backend):
    url, mcp_url = hosted
    tools = [mcp_tool(mcp_url)]  # require_approval defaults to "always", as on OpenAI
    first = (await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "2+3?", "tools": tools})).json()
    ask = next(i for i in first["output"] if i["type"] == "mcp_approval_request")
    assert (ask["name"], ask["arguments"], first["status"]) == ("add", '{"a": 2, "b": 3}', "completed")
    assert not any(i["type"] == "mcp_call" for i in first["output"])
    calls_before = len(backend.chat_requests)
    second = (
        await client.post(
            url + "/v1/responses",
            json={
                "model": "mcp-add",
                "previous_response_id": first["id"],
                "tools": tools,
                "input": [{"type": "mcp_approval_response", "approval_request_id": ask["id"], "approve": True}],
            },
        )
    ).json()
    call = next(i for i in second["output"] if i["type"] == "mcp_call")
    assert (call["approval_request_id"], call["output"], call["status"]) == (ask["id"], "5", "completed")
    assert second["output"][-1]["content"][0]["text"] == "Tool result: 5"
    assert len(backend.chat_requests) == calls_before + 1
    messages = backend.chat_requests[-1]["messages"]
    assert messages[-2]["tool_calls"][0]["id"] == ask["id"] and messages[-1]["content"] == "5"


async def test_a_denied_call_is_not_run_and_the_model_is_told(hosted, client, backend):
    url, mcp_url = hosted
    tools = [mcp_tool(mcp_url)]
    first = (await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "2+3?", "tools": tools})).json()
    ask = next(i for i in first["output"] if i["type"] == "mcp_approval_request")
    second = (
        await client.post(
            url + "/v1/responses",
            json={
                "model": "mcp-add",
                "previous_response_id": first["id"],
                "tools": tools,
                "input": [{"type": "mcp_approval_response", "approval_request_id": ask["id"], "approve": False}],
            },
        )
    ).json()
    assert not any(i["type"] == "mcp_call" for i in second["output"])
    assert second["output"][-1]["content"][0]["text"].startswith("Tool result: The user did not approve")


async def test_loopback_and_private_servers_are_refused_unless_allowed(start_gateway, client, nursery):
    mcp_url = await start_http_server(nursery, make_test_server())
    url = await start_gateway()  # no allow-list
    for stream in (False, True):
        r = await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "x", "stream": stream, "tools": [mcp_tool(mcp_url)]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "mcp_server_not_allowed"
        assert r.json()["error"]["param"] == "tools[0].server_url"


async def test_allowed_tools_limit_what_is_offered(hosted, client, backend):
    url, mcp_url = hosted
    final = (
        await client.post(
            url + "/v1/responses",
            json={"model": "text", "input": "x", "tools": [mcp_tool(mcp_url, allowed_tools=["boom"], require_approval="never")]},
        )
    ).json()
    assert [t["name"] for t in final["output"][0]["tools"]] == ["boom"]
    assert [t["function"]["name"] for t in backend.chat_requests[-1]["tools"]] == ["boom"]


async def test_an_unreachable_server_is_reported_by_a_failed_listing(start_gateway, client):
    url = await start_gateway(mcp_allowed_urls="127.0.0.1")
    final = (
        await client.post(
            url + "/v1/responses", json={"model": "text", "input": "x", "tools": [mcp_tool("http://127.0.0.1:9/mcp", require_approval="never")]}
        )
    ).json()
    assert final["output"][0]["type"] == "mcp_list_tools" and final["output"][0]["error"]
    assert final["status"] == "completed" and final["output"][-1]["content"][0]["text"] == "Hello, world!"
