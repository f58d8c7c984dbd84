"""WebSocket mode on /v1/responses, with a real WebSocket client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import orjson
import trio
from httpx2.websockets import AsyncWebSocketClient

import gateway.server.http11

from spec import _cached_validator, validate_event

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


async def turn(ws: Any, **body: Any) -> list[dict[str, Any]]:
    await ws.send_text(orjson.dumps({"type": "response.create", **body}).decode())
    events = []
    with trio.fail_after(10):
        while True:
            event = orjson.loads(await ws.receive_text())
            events.append(event)
            if event["type"] in TERMINAL or (event["type"] == "error" and "status" in event):
                return events


def ws_url(gateway_url: str) -> str:
    return gateway_url + "/v1/responses"


@contextlib.asynccontextmanager
async def aconnect_ws(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[Any]:
    async with httpx2.AsyncClient(timeout=10) as http:
        async with AsyncWebSocketClient(http).connect(url, headers=headers) as ws:
            yield ws


async def test_turns_on_one_socket_get_the_same_events_as_sse_in_order(gateway_url):
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        first = await turn(ws, model="text", input="hi")
        second = await turn(ws, model="reasoning", input="2+2?")
    for events in (first, second):
        for event in events:
            validate_event(event)
        assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert first[-1]["response"]["output"][0]["content"][0]["text"] == "Hello, world!"


async def test_a_turn_on_a_socket_is_begun_before_it_runs_and_sends_what_its_round_would(gateway_url, backend, begun):
    # Its first backend request goes before the turn's first events are written to the socket.
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        turns = [await turn(ws, model="text", input="hi") for _ in range(2)]
    assert begun == [False, True]
    for events in turns:
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hello, world!"
    first, second = backend.chat_requests
    assert second == first


async def test_store_false_continuations_use_the_connection_cache(gateway_url, backend, client):
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        first = await turn(ws, model="text", input="one", store=False)
        first_id = first[-1]["response"]["id"]
        second = await turn(ws, model="text", input="two", store=False, previous_response_id=first_id)
        assert second[-1]["type"] == "response.completed"
        assert [m["content"] for m in backend.chat_requests[-1]["messages"]] == ["one", "Hello, world!", "two"]
        # Only the latest response is cached: the first one is gone now, and was never stored.
        gone = await turn(ws, model="text", input="three", store=False, previous_response_id=first_id)
        error = gone[-1]
        _cached_validator("WebSocketErrorEvent").validate(error)
        assert (error["status"], error["error"]["code"]) == (404, "previous_response_not_found")
    assert (await client.get(f"{gateway_url}/v1/responses/{first_id}")).status_code == 404


async def test_bad_messages_get_the_error_envelope_and_the_socket_stays_open(gateway_url):
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        for payload, code in (
            (b"{nope", "invalid_json"),
            (orjson.dumps({"type": "response.cancel"}), "invalid_event_type"),
            (orjson.dumps({"type": "response.create", "model": "text", "input": "x", "background": True}), "invalid_request"),
        ):
            await ws.send_text(payload.decode())
            with trio.fail_after(5):
                error = orjson.loads(await ws.receive_text())
            _cached_validator("WebSocketErrorEvent").validate(error)
            assert error["error"]["code"] == code
        assert (await turn(ws, model="text", input="still here"))[-1]["type"] == "response.completed"


async def test_a_backend_failure_ends_the_turn_with_response_failed(gateway_url):
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        events = await turn(ws, model="error-mid-stream", input="x")
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]


async def test_leaving_the_socket_closes_the_backend_call(gateway_url, backend):
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        await ws.send_text(orjson.dumps({"type": "response.create", "model": "hang", "input": "x"}).decode())
        with trio.fail_after(5):
            await backend.stream_started.wait()
    with trio.fail_after(2):
        await backend.client_left.wait()


async def test_the_connection_limit_ends_the_socket_with_its_error(start_gateway):
    url = await start_gateway(websocket_max_age=0.3)
    async with aconnect_ws(ws_url(url)) as ws:
        assert (await turn(ws, model="text", input="x"))[-1]["type"] == "response.completed"
        with trio.fail_after(5):
            error = orjson.loads(await ws.receive_text())
    _cached_validator("WebSocketErrorEvent").validate(error)
    assert error["error"]["code"] == "websocket_connection_limit_reached"


async def test_a_turn_running_when_the_connection_reaches_its_age_ends_with_its_terminal_event_first(
    start_gateway, backend
):
    url = await start_gateway(websocket_max_age=0.3)
    async with aconnect_ws(ws_url(url)) as ws:
        await ws.send_text(orjson.dumps({"type": "response.create", "model": "text-then-wait", "input": "x"}).decode())
        events = []
        with trio.fail_after(10):
            while not any(e.get("type") == "response.output_text.delta" for e in events):
                events.append(orjson.loads(await ws.receive_text()))
            await trio.sleep(0.5)  # past the connection's age, the turn still running: time has to pass
            backend.release.set()
            while events[-1]["type"] not in TERMINAL:
                events.append(orjson.loads(await ws.receive_text()))
            limit = orjson.loads(await ws.receive_text())
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hello, world"
    assert limit["error"]["code"] == "websocket_connection_limit_reached"


class _CountingOs:
    """`os` as the gateway's own HTTP/1.1 server sees it (WebSockets too), counting the writes that carry text deltas."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.delta_writes = 0

    def write(self, fd: int, data: Any) -> int:
        if b"response.output_text.delta" in bytes(data):
            self.delta_writes += 1
        return int(self._real.write(fd, data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


async def test_the_events_of_a_burst_leave_as_a_message_each_in_a_few_writes(gateway_url, monkeypatch):
    counting = _CountingOs(gateway.server.http11.os)
    monkeypatch.setattr(gateway.server.http11, "os", counting)
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        events = await turn(ws, model="burst", input="hi")
        again = await turn(ws, model="text", input="still one message per event")
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [e["delta"] for e in deltas] == [f"w{i} " for i in range(200)]  # each its own message, in order
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "".join(f"w{i} " for i in range(200))
    assert again[-1]["type"] == "response.completed"
    # Written together: a write(2) per batch of events, not per message.
    assert 0 < counting.delta_writes <= 20, counting.delta_writes
