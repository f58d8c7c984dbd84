"""One turn engine under every transport: SSE, JSON, WebSocket and background behave alike.

Behaviours that drifted apart while each transport assembled responses on
its own: hosted MCP tools over WebSocket and in background responses, a
log line for every turn, heartbeats while hosted servers connect, and
configured MCP servers that are connected before the first request.
"""

from __future__ import annotations

import json
import logging
import pathlib
import sys
from typing import Any

import httpx2
import orjson
import trio

from conftest import parse_sse
from test_http_responses import check_stream
from test_mcp_bounds import serve_silently
from test_mcp_manager import make_test_server, start_http_server
from test_websocket import aconnect_ws, turn, ws_url

EXAMPLE_SERVER = pathlib.Path(__file__).resolve().parent.parent / "examples" / "mcp_server.py"


def comparable(response: dict[str, Any]) -> dict[str, Any]:
    """A final response without what differs between two runs (ids)."""
    out = {k: v for k, v in response.items() if k not in ("id", "created_at", "completed_at", "background")}
    out["output"] = [{k: v for k, v in item.items() if k != "id"} for item in response["output"]]
    return out


async def follow(client: httpx2.AsyncClient, url: str, response_id: str) -> list[Any]:
    r = await client.get(f"{url}/v1/responses/{response_id}", params={"stream": "true"})
    return parse_sse(r.content)


async def test_every_transport_runs_the_same_turn_and_logs_one_line_for_it(gateway_url, client, caplog):
    caplog.set_level(logging.INFO, logger="gateway")
    body = {"model": "reasoning", "input": "2+2?"}
    with trio.fail_after(20):
        streamed = check_stream(parse_sse((await client.post(gateway_url + "/v1/responses", json={**body, "stream": True})).content))
        plain = (await client.post(gateway_url + "/v1/responses", json=body)).json()
        async with aconnect_ws(ws_url(gateway_url)) as ws:
            over_ws = (await turn(ws, **body))[-1]["response"]
        queued = (await client.post(gateway_url + "/v1/responses", json={**body, "background": True})).json()
        background = check_stream(await follow(client, gateway_url, queued["id"]))
    assert comparable(streamed) == comparable(plain) == comparable(over_ws) == comparable(background)
    assert streamed["status"] == "completed"
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway" and " transport=" in r.getMessage()]
    assert sorted(line.split(" transport=")[1].split()[0] for line in lines) == ["background", "json", "sse", "websocket"]
    assert all(" status=completed " in line for line in lines)


async def hosted(nursery: trio.Nursery, start_gateway: Any, **settings: Any) -> tuple[str, dict[str, Any]]:
    mcp_url = await start_http_server(nursery, make_test_server())
    url = await start_gateway(mcp_allowed_urls="127.0.0.1", **settings)
    return url, {"type": "mcp", "server_label": "calc", "server_url": mcp_url, "require_approval": "never"}


async def test_hosted_mcp_tools_work_over_websocket(nursery, start_gateway):
    url, tool = await hosted(nursery, start_gateway)
    async with aconnect_ws(ws_url(url)) as ws:
        events = await turn(ws, model="mcp-add", input="2+3?", tools=[tool])
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]][:2] == ["mcp_list_tools", "message"]
    call = next(i for i in final["output"] if i["type"] == "mcp_call")
    assert (call["name"], call["output"]) == ("add", "5")


async def test_hosted_mcp_tools_work_in_background_responses(nursery, start_gateway, client):
    url, tool = await hosted(nursery, start_gateway)
    queued = await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "2+3?", "tools": [tool], "background": True})
    assert queued.status_code == 200 and queued.json()["status"] == "queued"
    with trio.fail_after(20):
        final = check_stream(await follow(client, url, queued.json()["id"]))
    assert final["status"] == "completed"
    call = next(i for i in final["output"] if i["type"] == "mcp_call")
    assert call["output"] == "5"
    assert final["output"][-1]["content"][0]["text"] == "Tool result: 5"


async def test_heartbeats_flow_while_a_hosted_server_is_still_connecting(nursery, start_gateway, client):
    silent = await nursery.start(serve_silently)
    url = await start_gateway(mcp_allowed_urls="127.0.0.1", mcp_connect_timeout=2.0, heartbeat_interval=0.4)
    tool = {"type": "mcp", "server_label": "mute", "server_url": silent, "require_approval": "never"}
    raw = b""
    with trio.fail_after(20):
        async with client.stream(
            "POST", url + "/v1/responses", json={"model": "text", "input": "hi", "stream": True, "tools": [tool]}
        ) as r:
            assert r.status_code == 200
            async for data in r.aiter_raw():
                raw += data
    # The client heard from the gateway (the response was created, keep-alives
    # came) while the server it named was still not answering.
    listing_failed = raw.index(b"response.mcp_list_tools.failed")
    assert raw.index(b"response.created") < listing_failed
    assert raw[:listing_failed].count(b": keep-alive\n\n") >= 2
    assert check_stream(parse_sse(raw))["status"] == "completed"


async def test_configured_servers_are_connected_before_the_first_request_is_served(start_gateway, client, tmp_path):
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"example": {"command": sys.executable, "args": [str(EXAMPLE_SERVER)]}}}))
    url = await start_gateway(mcp_servers_config_path=str(config))
    # The very first request: no waiting, no retry.
    r = await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "2+3?"})
    final = r.json()
    assert r.status_code == 200 and final["status"] == "completed"
    call = next(i for i in final["output"] if i["type"] == "mcp_call")
    assert (call["server_label"], call["output"]) == ("example", "5")


async def test_a_hosted_server_the_gateway_may_not_reach_is_refused_before_any_stream(start_gateway, client):
    url = await start_gateway()
    tool = {"type": "mcp", "server_label": "meta", "server_url": "http://169.254.169.254/mcp"}
    for extra in ({"stream": True}, {"background": True}, {}):
        r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi", "tools": [tool], **extra})
        assert r.status_code == 400 and r.json()["error"]["code"] == "mcp_server_not_allowed"
    async with aconnect_ws(ws_url(url)) as ws:
        events = await turn(ws, model="text", input="hi", tools=[tool])
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "mcp_server_not_allowed"
    assert orjson.dumps(events)
