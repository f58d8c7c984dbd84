"""A client that leaves is noticed at once, whatever the response is doing, on every transport.

The gateway, the scripted backend and the client run in one trio run whose
clock does not move (`MockClock(rate=0)`; it jumps only if every task has
been blocked for `STUCK` real seconds, a test that fails rather than hangs).
A watch that polled, slept or waited out a timer could not see the client
leave here: the backend's connection closes (and an MCP call is cancelled)
without the clock having moved, so the gateway noticed from the socket
itself, at once.  `gateway bench --only disconnects` measures the same in
milliseconds with the backend's own timestamps (`gateway/lab/disconnects.py`).

The transports: the gateway's own HTTP/1.1, hypercorn's (`HTTP1_SERVER=
hypercorn`), HTTP/2 (hypercorn's, prior knowledge) and WebSockets.  What the
response is doing when the client leaves: tokens flowing, the backend silent
before its first byte (so no byte has reached the client), silent after it,
an MCP tool call running, a JSON answer awaited, a background response
followed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
import trio
import trio.testing

import gateway
import gateway.api.responses
from conftest import SequentialIds, make_settings
from gateway.lab.disconnects import MCP_SERVER, Client, Http1Client, Http2Client, WebSocketClient, Watched

STUCK = 1.0  # real seconds every task may be blocked before the clock jumps (then the test fails)


@pytest.fixture
def frozen() -> trio.testing.MockClock:
    return trio.testing.MockClock(rate=0, autojump_threshold=STUCK)


def request_body(model: str, **extra: Any) -> bytes:
    return orjson.dumps({"model": model, "input": "hi", "stream": True, **extra})


# --- the clients, one per transport (the lab's): send a request, read until a marker, then leave --------


TRANSPORTS: dict[str, tuple[type[Client], dict[str, Any]]] = {
    "gateway http/1.1": (Http1Client, {}),
    "hypercorn http/1.1": (Http1Client, {"http1_server": "hypercorn"}),
    "http/2": (Http2Client, {}),
    "websocket": (WebSocketClient, {}),
}


async def read_until(client: Client, marker: bytes) -> None:
    with trio.fail_after(60):
        await client.read_until(marker)


@contextlib.asynccontextmanager
async def gateway_on(nursery: trio.Nursery, backend: Any, **overrides: Any) -> AsyncIterator[str]:
    settings = make_settings(backend.url, **overrides)
    app = gateway.create_app(settings, ids=SequentialIds(), clock=lambda: 1_700_000_000.0)
    yield await nursery.start(functools.partial(gateway.serve, settings, app=app))


async def leaves_at_once(frozen: trio.testing.MockClock, left: Callable[[], Awaitable[Any]]) -> None:
    """The client has just left: `left()` returns once the gateway has let go (the backend's
    connection closed, the call cancelled), and the clock has not moved meanwhile."""
    before = trio.current_time()
    with trio.fail_after(60):
        await left()
    assert trio.current_time() == before, "the gateway needed a timer to notice the client had left"


# --- the backend's request closed ---------------------------------------------------------------


PHASES = {
    # what the backend does, and what the client waits to read before it leaves
    "tokens flowing": ("tokens-forever", b"tok "),
    "backend silent before its first byte": ("hang-before-headers", None),
    "backend silent after its first byte": ("hang", b"Waiting"),
}


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("transport", list(TRANSPORTS))
async def test_a_client_that_leaves_a_stream_closes_the_backends_request_at_once(frozen, nursery, backend, transport, phase):
    kind, overrides = TRANSPORTS[transport]
    model, marker = PHASES[phase]
    async with gateway_on(nursery, backend, **overrides) as url:
        client = kind()
        await client.open(url, request_body(model))
        with trio.fail_after(60):
            await backend.wait_for(lambda: bool(backend.chat_requests))
        if marker is not None:
            await read_until(client, marker)
        assert not backend.client_left.is_set()
        left_at = trio.current_time()
        await client.leave()
        await leaves_at_once(frozen, backend.client_left.wait)
        assert backend.client_left_at == left_at


@pytest.mark.parametrize("transport", list(TRANSPORTS))
async def test_a_client_that_leaves_in_the_first_moment_has_the_backends_request_closed_at_once(frozen, nursery, backend, transport):
    # Gone as soon as its request is sent: the turn has begun its backend request by the time the
    # gateway hears of it (it begins that first), and closes it then.
    kind, overrides = TRANSPORTS[transport]
    async with gateway_on(nursery, backend, **overrides) as url:
        client = kind()
        await client.open(url, request_body("hang-before-headers"))
        await client.leave()
        await leaves_at_once(frozen, backend.client_left.wait)
        assert len(backend.chat_requests) == 1


@pytest.mark.parametrize("transport", ["gateway http/1.1", "hypercorn http/1.1", "http/2"])
async def test_a_client_that_leaves_before_its_json_answer_closes_the_backends_request_at_once(frozen, nursery, backend, transport):
    kind, overrides = TRANSPORTS[transport]
    async with gateway_on(nursery, backend, **overrides) as url:
        client = kind()
        await client.open(url, orjson.dumps({"model": "hang-before-headers", "input": "hi"}))
        with trio.fail_after(60):
            await backend.wait_for(lambda: bool(backend.chat_requests))
        await client.leave()
        await leaves_at_once(frozen, backend.client_left.wait)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages"])
async def test_a_client_that_leaves_a_chat_or_messages_stream_closes_the_backends_request_at_once(frozen, nursery, backend, route):
    async with gateway_on(nursery, backend) as url:
        client = Http1Client()
        body = {"model": "hang-before-headers", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        if route == "/v1/messages":
            body["max_tokens"] = 10
        await client.open(url, orjson.dumps(body), path=route.encode())
        with trio.fail_after(60):
            await backend.wait_for(lambda: bool(backend.chat_requests))
        await client.leave()
        await leaves_at_once(frozen, backend.client_left.wait)


# --- an MCP tool call cancelled ----------------------------------------------------------------------


@pytest.mark.parametrize("transport", list(TRANSPORTS))
async def test_a_client_that_leaves_during_an_mcp_tool_call_has_the_call_cancelled_at_once(frozen, nursery, backend, tmp_path, transport):
    kind, overrides = TRANSPORTS[transport]
    # The lab's MCP server, whose `slow` tool says through a FIFO when it starts and is cancelled.
    watched = Watched(str(tmp_path / "watch.fifo"))
    (tmp_path / "mcp_server.py").write_text(MCP_SERVER)
    config = tmp_path / "mcp.json"
    server = {"command": sys.executable, "args": [str(tmp_path / "mcp_server.py")], "env": {"WATCH_FIFO": str(tmp_path / "watch.fifo")}}
    config.write_text(json.dumps({"mcpServers": {"watched": server}}))
    async with gateway_on(nursery, backend, mcp_servers_config_path=str(config), **overrides) as url:
        client = kind()
        await client.open(url, request_body("mcp-slow"))
        with trio.fail_after(60):
            await watched.next("started")
        await read_until(client, b"mcp_call.in_progress")
        await client.leave()
        await leaves_at_once(frozen, functools.partial(watched.next, "cancelled"))


# --- a background response followed ------------------------------------------------------------


@pytest.mark.parametrize("how", ["POST stream+background", "GET ?stream=true"])
@pytest.mark.parametrize("transport", ["gateway http/1.1", "hypercorn http/1.1", "http/2"])
async def test_a_client_that_leaves_a_followed_background_response_lets_go_of_it_at_once(frozen, nursery, backend, monkeypatch, transport, how):
    kind, overrides = TRANSPORTS[transport]
    let_go = trio.Event()
    follow_job = gateway.api.responses.follow_job

    async def followed(job: Any, after: int) -> AsyncIterator[bytes]:
        try:
            async for data in follow_job(job, after):
                yield data
        finally:
            let_go.set()

    monkeypatch.setattr(gateway.api.responses, "follow_job", followed)
    monkeypatch.setattr(gateway.api.stored, "follow_job", followed)
    async with gateway_on(nursery, backend, **overrides) as url:
        client = kind()
        if how == "POST stream+background":
            await client.open(url, request_body("hang", background=True))
        else:
            starter = Http1Client()
            await starter.open(url, orjson.dumps({"model": "hang", "input": "hi", "background": True}))
            await read_until(starter, b'"queued"')
            response_id = orjson.loads(starter.received.partition(b"\r\n\r\n")[2])["id"]
            await client.open(url, b"", path=b"/v1/responses/%b?stream=true" % response_id.encode(), method=b"GET")
        await read_until(client, b"Waiting")
        await client.leave()
        await leaves_at_once(frozen, let_go.wait)
        assert not backend.client_left.is_set()  # the background response itself goes on
