"""MCP servers that accept a connection and never answer cannot hold a request or the gateway.

The hosted `mcp` tool's server and configured servers each get
`MCP_CONNECT_TIMEOUT` to connect, initialise and list their tools.
"""

from __future__ import annotations

import functools
from typing import Any

import trio

from conftest import parse_sse
from gateway.mcp import MCPManager, ServerConfig
from spec import validate_event, validate_response


async def serve_silently(*, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """A TCP server that accepts, reads whatever comes, and never answers."""

    async def swallow(stream: trio.SocketStream) -> None:
        async with stream:
            while await stream.receive_some():
                pass

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(trio.serve_listeners, swallow, listeners))
        task_status.started(f"http://127.0.0.1:{port}/mcp")
        await trio.sleep_forever()


async def test_a_hosted_mcp_server_that_never_answers_is_reported_within_the_connect_timeout(
    nursery: trio.Nursery, start_gateway: Any, client: Any
) -> None:
    silent = await nursery.start(serve_silently)
    url = await start_gateway(mcp_allowed_urls="127.0.0.1", mcp_connect_timeout=0.5)
    tool = {"type": "mcp", "server_label": "mute", "server_url": silent, "require_approval": "never"}
    with trio.fail_after(10):  # before the bound, this request hung for minutes without a byte
        r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi", "stream": True, "tools": [tool]})
    frames = parse_sse(r.content)
    for event in frames[:-1]:
        validate_event(event)
    final = frames[-2]["response"]
    validate_response(final)
    listing = final["output"][0]
    assert listing["type"] == "mcp_list_tools" and listing["tools"] == []
    assert "mute" in listing["error"]
    assert "response.mcp_list_tools.failed" in [f["type"] for f in frames[:-1]]
    assert final["status"] == "completed"  # the model answered without the server's tools


async def test_a_configured_server_that_never_answers_is_given_up_on_and_retried(nursery: trio.Nursery) -> None:
    silent = await nursery.start(serve_silently)
    config = ServerConfig(name="mute", type="streamable-http", url=silent)
    manager = MCPManager([config], refresh_interval=3600, init_timeout=0.5, backoff_base=0.05)
    async with trio.open_nursery() as running:
        await running.start(manager.run)
        with trio.fail_after(10):
            await manager.wait_for(
                lambda: any(s.state == "reconnecting" and s.last_error for s in manager.status())
            )
        [status] = manager.status()
        assert status.tools == []
        running.cancel_scope.cancel()


def test_a_tool_schema_nested_too_deeply_is_replaced_not_passed_on() -> None:
    import mcp_types as types

    from gateway.mcp._connection import assign_tool_names

    deep: dict[str, Any] = {"type": "string"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}}
    fine = {"type": "object", "properties": {"x": {"type": "integer"}}}
    tools = assign_tool_names(
        [("srv", [types.Tool(name="deep", inputSchema=deep), types.Tool(name="fine", inputSchema=fine)])]
    )
    assert [(t.name, t.input_schema) for t in tools] == [("deep", {"type": "object", "properties": {}}), ("fine", fine)]
