"""WebSockets on the gateway's own HTTP/1.1 server (`gateway.server.websocket`), over real sockets.

The turns themselves are shown through a real client in test_websocket.py;
here, what the server does with the protocol: the handshake (no extension
taken), pings, fragments, the close handshake either way, the size bound,
frames a server may not accept, refusals in HTTP, and the frames it builds.
"""

from __future__ import annotations

import base64
import functools
import os
import struct
from typing import Any

import orjson
import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import Connection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.extensions import PerMessageDeflate

import gateway
import gateway.server.hypercorn
from asgi_helpers import answer_lifespan
from conftest import make_settings
from gateway.server.websocket import asks_for_websocket, frame
from test_http_edges import connect, split_response

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


class RawSocket:
    """A WebSocket client over a plain trio socket, wsproto doing the protocol, raw bytes when a test wants them."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.events: list[Any] = []
        self.accepted: AcceptConnection | None = None

    async def handshake(
        self, *, extensions: list[Any] | None = None, headers: list[tuple[bytes, bytes]] | None = None, subprotocols: list[str] | None = None
    ) -> Any:
        request = Request(
            host="x", target="/v1/responses", extensions=extensions or [], extra_headers=headers or [], subprotocols=subprotocols or []
        )
        await self.stream.send_all(self.ws.send(request))
        while True:
            event = await self.next_event()
            if isinstance(event, (AcceptConnection, RejectConnection)):
                return event

    async def next_event(self) -> Any:
        with trio.fail_after(10):
            while not self.events:
                data = await self.stream.receive_some()
                self.ws.receive_data(data or None)
                self.events.extend(self.ws.events())
        return self.events.pop(0)

    async def send(self, event: Any) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def message(self) -> str:
        """The next whole text message (pings and pongs skipped)."""
        parts = []
        while True:
            event = await self.next_event()
            if isinstance(event, TextMessage):
                parts.append(event.data)
                if event.message_finished:
                    return "".join(parts)
            elif isinstance(event, CloseConnection):
                raise AssertionError(f"closed with {event.code}")

    async def turn(self, **body: Any) -> list[dict[str, Any]]:
        await self.send(Message(data=orjson.dumps({"type": "response.create", **body}).decode()))
        events = []
        while True:
            events.append(orjson.loads(await self.message()))
            if events[-1]["type"] in TERMINAL or events[-1]["type"] == "error":
                return events


async def open_socket(gateway_url: str, **handshake: Any) -> tuple[RawSocket, Any]:
    raw = RawSocket(await connect(gateway_url))
    return raw, await raw.handshake(**handshake)


def masked(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    """A client's frame: masked, as RFC 6455 requires of clients."""
    mask = os.urandom(4)
    head = bytes([(0x80 if fin else 0) | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 65536:
        head += struct.pack("!BH", 0x80 | 126, size)
    else:
        head += struct.pack("!BQ", 0x80 | 127, size)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def test_a_socket_is_served_on_the_gateway_own_connection_and_takes_no_extension(gateway_url):
    raw, accepted = await open_socket(gateway_url, extensions=[PerMessageDeflate()])
    assert isinstance(accepted, AcceptConnection)
    assert accepted.extensions == []  # permessage-deflate offered, not taken: every frame goes as it is
    events = await raw.turn(model="text", input="hi")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text and events[-1]["response"]["output"][0]["content"][0]["text"] == text
    again = await raw.turn(model="text", input="and again")  # the same connection, the next turn
    assert again[-1]["type"] == "response.completed"


async def test_a_ping_is_answered_with_its_pong(gateway_url):
    raw, _ = await open_socket(gateway_url)
    await raw.send(Ping(payload=b"are you there"))
    event = await raw.next_event()
    assert isinstance(event, Pong) and event.payload == b"are you there"


async def test_a_message_in_fragments_is_one_request(gateway_url):
    raw, _ = await open_socket(gateway_url)
    body = orjson.dumps({"type": "response.create", "model": "text", "input": "hi"})
    await raw.stream.send_all(masked(0x1, body[:10], fin=False) + masked(0x0, body[10:20], fin=False))
    await raw.stream.send_all(masked(0x9, b"in between"))  # a control frame may come between fragments
    await raw.stream.send_all(masked(0x0, body[20:]))
    events = []
    while not events or events[-1]["type"] not in TERMINAL:
        events.append(orjson.loads(await raw.message()))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"


async def test_the_client_closing_is_answered_with_its_close_and_the_connection_ends(gateway_url):
    raw, _ = await open_socket(gateway_url)
    await raw.send(CloseConnection(code=1000, reason="done"))
    event = await raw.next_event()
    assert isinstance(event, CloseConnection) and event.code == 1000
    with trio.fail_after(10):
        assert await raw.stream.receive_some() == b""  # then the server closes the TCP connection


async def test_a_message_over_the_size_bound_closes_with_1009(monkeypatch, start_gateway):
    monkeypatch.setattr(gateway.server.hypercorn.GatewayConfig, "websocket_max_message_size", 4096)
    raw, _ = await open_socket(await start_gateway())
    await raw.send(Message(data="x" * 3000, message_finished=False))
    await raw.send(Message(data="x" * 3000))  # 6000 in all, over 4096
    event = await raw.next_event()
    assert isinstance(event, CloseConnection) and event.code == 1009


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x81\x02hi", 1002),  # not masked: a client's frames must be
        (b"\xc1\x82abcd" + bytes(b ^ m for b, m in zip(b"hi", b"abcd")), 1002),  # a reserved bit, no extension taken
        (masked(0x1, b"\xff\xfe"), 1007),  # text that is not UTF-8
    ],
)
async def test_a_frame_the_protocol_forbids_closes_with_its_code(gateway_url, data, code):
    raw, _ = await open_socket(gateway_url)
    await raw.stream.send_all(data)
    event = await raw.next_event()
    assert isinstance(event, CloseConnection) and event.code == code


async def test_a_refused_handshake_is_an_http_error_in_openai_shape(start_gateway):
    url = await start_gateway(gateway_api_keys="ops=sk-gw-test-0123456789abcdef")
    raw, refused = await open_socket(url)  # no key
    assert isinstance(refused, RejectConnection) and refused.status_code == 401 and refused.has_body
    body = b""
    while True:
        event = await raw.next_event()
        assert isinstance(event, RejectData)
        body += event.data
        if event.body_finished:
            break
    error = orjson.loads(body)["error"]
    assert error["code"] == "invalid_api_key" and "Traceback" not in error["message"]
    with trio.fail_after(10):
        assert await raw.stream.receive_some() == b""  # and the connection closes


async def test_a_socket_at_a_path_without_one_is_refused_with_404_in_openai_shape(gateway_url):
    raw = RawSocket(await connect(gateway_url))
    await raw.stream.send_all(raw.ws.send(Request(host="x", target="/v1/nothing-here")))
    event = await raw.next_event()
    assert isinstance(event, RejectConnection) and event.status_code == 404
    body = await raw.next_event()
    assert isinstance(body, RejectData) and orjson.loads(body.data)["error"]["code"] == "unknown_url"


async def test_a_socket_after_plain_requests_on_the_same_connection_loses_nothing(gateway_url):
    key = base64.b64encode(os.urandom(16))
    async with await connect(gateway_url) as stream:
        # A plain request, then the upgrade and a first frame in the same write.
        await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in data or b'"ok"' not in data:
                data += await stream.receive_some()
        assert split_response(data)[0] == 200
        body = orjson.dumps({"type": "response.create", "model": "text", "input": "hi"})
        await stream.send_all(
            b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: %b\r\nSec-WebSocket-Version: 13\r\n\r\n" % key + masked(0x1, body)
        )
        data = b""
        with trio.fail_after(10):
            while b"response.completed" not in data:
                data += await stream.receive_some()
    head, _, frames = data.partition(b"\r\n\r\n")
    status, headers, _ = split_response(head + b"\r\n\r\n")
    assert status == 101 and headers[b"upgrade"].lower() == b"websocket"
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(frames)
    texts = [e.data for e in client.events() if isinstance(e, TextMessage)]
    assert orjson.loads(texts[0])["type"] == "response.created"


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 70000])
def test_a_frame_built_here_is_read_by_wsproto_whole(size):
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(frame(0x2, payload))
    (event,) = list(client.events())
    assert isinstance(event, BytesMessage) and event.data == payload and event.message_finished


def test_only_a_version_13_get_with_a_key_asks_for_a_websocket():
    good = [(b"upgrade", b"WebSocket"), (b"sec-websocket-version", b"13"), (b"sec-websocket-key", b"abc")]
    assert asks_for_websocket("GET", good)
    assert not asks_for_websocket("POST", good)
    assert not asks_for_websocket("GET", good[:2])
    assert not asks_for_websocket("GET", [good[0], (b"sec-websocket-version", b"8"), good[2]])
    assert not asks_for_websocket("GET", [(b"upgrade", b"h2c"), *good[1:]])


async def _bare_socket(nursery: Any, handler: Any) -> str:
    """The gateway's server running an ASGI app whose WebSocket side is `handler`."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        assert scope["type"] == "websocket" and (await receive())["type"] == "websocket.connect"
        await handler(scope, receive, send)

    return await nursery.start(functools.partial(gateway.serve, make_settings("http://127.0.0.1:9"), app=app))  # type: ignore[no-any-return]


async def test_a_close_before_the_accept_refuses_with_403(nursery):
    async def handler(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "websocket.close", "code": 1000})

    raw, refused = await open_socket(await _bare_socket(nursery, handler))
    assert isinstance(refused, RejectConnection) and refused.status_code == 403


@pytest.mark.parametrize("headers", [[(b"x-echo", b"a\r\nSet-Cookie: stolen=1")], [(b"bad name", b"v")]], ids=["CRLF in a value", "a name that is no token"])
async def test_an_accept_whose_headers_no_response_may_carry_is_a_500_not_a_101(nursery, headers):
    async def handler(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "websocket.accept", "headers": headers})
        await send({"type": "websocket.send", "text": "never sent"})

    raw, refused = await open_socket(await _bare_socket(nursery, handler))
    assert isinstance(refused, RejectConnection) and refused.status_code == 500


async def test_an_app_that_returns_without_answering_is_a_500_and_one_that_fails_after_the_accept_closes_with_1011(nursery):
    async def silent(scope: Any, receive: Any, send: Any) -> None:
        pass

    _, refused = await open_socket(await _bare_socket(nursery, silent))
    assert isinstance(refused, RejectConnection) and refused.status_code == 500

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "websocket.accept", "subprotocol": "chat.v1", "headers": [(b"x-served-by", b"gateway")]})
        await send({"type": "websocket.send", "bytes": b"\x00\x01"})
        raise RuntimeError("boom")

    raw, accepted = await open_socket(await _bare_socket(nursery, failing), subprotocols=["chat.v1", "other"])
    assert isinstance(accepted, AcceptConnection) and accepted.subprotocol == "chat.v1"
    assert (b"x-served-by", b"gateway") in accepted.extra_headers
    message = await raw.next_event()
    assert isinstance(message, BytesMessage) and message.data == b"\x00\x01"
    closed = await raw.next_event()
    assert isinstance(closed, CloseConnection) and closed.code == 1011


async def test_the_app_hears_the_subprotocols_and_the_client_leaving(nursery):
    heard: list[Any] = []
    done = trio.Event()

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        heard.append(scope["subprotocols"])
        await send({"type": "websocket.accept"})
        heard.append(await receive())
        heard.append(await receive())  # the client went away without a close frame
        done.set()

    raw, _ = await open_socket(await _bare_socket(nursery, handler), subprotocols=["a", "b"])
    await raw.send(Message(data="hello"))
    await raw.stream.aclose()
    with trio.fail_after(10):
        await done.wait()
    assert heard == [["a", "b"], {"type": "websocket.receive", "text": "hello"}, {"type": "websocket.disconnect", "code": 1006}]


async def test_with_http1_server_hypercorn_sockets_are_hypercorn_and_serve_the_same_turns(start_gateway):
    raw, accepted = await open_socket(await start_gateway(http1_server="hypercorn"), extensions=[PerMessageDeflate()])
    assert isinstance(accepted, AcceptConnection)
    assert [type(e).__name__ for e in accepted.extensions] == ["PerMessageDeflate"]  # hypercorn's, which takes it
    events = await raw.turn(model="text", input="hi")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"


async def test_the_openai_sdk_runs_turns_over_its_responses_connection(gateway_url):
    # The SDK's `responses.connect()` (the `websockets` library, asyncio: run in a thread of its own).
    import asyncio

    import openai

    async def two_turns() -> list[list[str]]:
        client = openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="sk-test", max_retries=0)
        turns = []
        async with client.responses.connect() as connection:
            for text in ("hi", "again"):
                await connection.response.create(model="text", input=text)
                kinds = []
                async for event in connection:
                    kinds.append(event.type)
                    if event.type in TERMINAL or event.type == "error":
                        break
                turns.append(kinds)
        return turns

    with trio.fail_after(30):
        turns = await trio.to_thread.run_sync(lambda: asyncio.run(two_turns()))
    assert [kinds[0] for kinds in turns] == ["response.created"] * 2
    assert [kinds[-1] for kinds in turns] == ["response.completed"] * 2
    assert all("response.output_text.delta" in kinds for kinds in turns)
