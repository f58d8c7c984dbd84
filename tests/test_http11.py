"""The gateway's own HTTP/1.1 server (`gateway.server.http11`), over real sockets, byte for byte.

What a plain connection must do that the other tests do not already show
through clients: pipelined requests in order, `Expect: 100-continue`, a
chunked upload, HEAD, refusals in OpenAI's shape, and the connections it
hands to hypercorn part-way (HTTP/2 with prior knowledge) with not a byte
lost.  Its WebSockets: test_http11_websocket.py; its strictness: test_http_strict.py and test_http_differential.py.
"""

from __future__ import annotations

import functools
from typing import Any

import h2.config
import h2.connection
import h2.events
import orjson
import pytest
import trio

import gateway
from gateway.errors import RequestTooLarge
from gateway.app.bodies import read_body
from gateway.server.ext import BATCH as BATCH_EXTENSION, HTTP11 as HTTP11_EXTENSION, STREAM as STREAM_EXTENSION
from asgi_helpers import answer_lifespan
from conftest import make_settings, parse_sse
from test_http_edges import STREAM_BODY, connect, dechunk, error_of, read_until_closed, split_response


async def read_response(stream: trio.SocketStream, buffered: bytes = b"") -> tuple[bytes, bytes]:
    """One whole response (content-length or chunked) and what followed it."""
    data = buffered

    async def more() -> None:
        nonlocal data
        chunk = await stream.receive_some()
        assert chunk, "the connection closed part-way through a response"
        data += chunk

    with trio.fail_after(10):
        while b"\r\n\r\n" not in data:
            await more()
        end = data.index(b"\r\n\r\n") + 4
        _, headers, _ = split_response(data[:end])
        if b"content-length" in headers:
            end += int(headers[b"content-length"])
            while len(data) < end:
                await more()
            return data[:end], data[end:]
        assert headers.get(b"transfer-encoding") == b"chunked"
        while True:  # each chunk: its size line, its bytes, CRLF; the last one is empty
            while b"\r\n" not in data[end:]:
                await more()
            line_end = data.index(b"\r\n", end)
            size = int(data[end:line_end], 16)
            end = line_end + 2 + size + 2
            while len(data) < end:
                await more()
            if size == 0:
                return data[:end], data[end:]


async def test_pipelined_requests_on_one_connection_are_answered_whole_and_in_order(gateway_url, backend):
    post = (
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % len(STREAM_BODY)
        + STREAM_BODY
    )
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    async with await connect(gateway_url) as stream:
        await stream.send_all(health + post + health + b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")  # one write, four requests
        answers = []
        rest = b""
        for _ in range(4):
            answer, rest = await read_response(stream, rest)
            answers.append(split_response(answer))
    assert [status for status, _, _ in answers] == [200, 200, 200, 404]
    assert orjson.loads(answers[0][2])["status"] == "ok" and orjson.loads(answers[2][2])["status"] == "ok"
    frames = parse_sse(dechunk(answers[1][2]))
    assert frames[-1] == "[DONE]" and frames[-2]["type"] == "response.completed"
    assert orjson.loads(answers[3][2])["error"]["type"] == "invalid_request_error"
    assert len(backend.requests) == 1


async def test_expect_100_continue_is_answered_before_the_body_is_sent(gateway_url):
    head = (
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(STREAM_BODY)
    )
    async with await connect(gateway_url) as stream:
        await stream.send_all(head)
        interim = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in interim:
                interim += await stream.receive_some()
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"  # nothing of the body was sent: the server asked for it
        await stream.send_all(STREAM_BODY)
        answer, _ = await read_response(stream)
    status, _, body = split_response(answer)
    assert status == 200 and parse_sse(dechunk(body))[-2]["type"] == "response.completed"


async def test_a_chunked_upload_reaches_the_route_whole(gateway_url, backend):
    body = orjson.dumps({"model": "text", "input": "x" * 5000, "stream": False})
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(part), part) for part in (body[:7], body[7:4000], body[4000:])) + b"0\r\n\r\n"
    async with await connect(gateway_url) as stream:
        await stream.send_all(
            b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for i in range(0, len(chunks), 1000):  # in pieces, as a slow uploader sends them
            await stream.send_all(chunks[i : i + 1000])
        answer, _ = await read_response(stream)
    status, _, text = split_response(answer)
    assert status == 200 and orjson.loads(text)["status"] == "completed"
    assert backend.requests[0].body["messages"][-1]["content"] == "x" * 5000


async def test_head_gets_the_headers_and_no_body_and_the_connection_stays_usable(gateway_url):
    async with await connect(gateway_url) as stream:
        await stream.send_all(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        with trio.fail_after(10):
            while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"}"):
                data += await stream.receive_some()
    first, _, second = data.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")  # no body between the two
    assert orjson.loads(split_response(second)[2])["status"] == "ok"


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431, "request_too_large"),
        (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "request_too_large"),
        (b"GET /health HTTP/1.1\r\nHost x\r\n\r\n", 400, "invalid_request"),
        (b"BREW /health HTTP/1.1\r\nHost: x\r\n\r\n", 501, "method_not_supported"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "invalid_request"),  # a TLS hello on the plain port
    ],
    ids=["headers too large", "target too long", "header without a colon", "unknown method", "TLS on a plain port"],
)
async def test_a_request_the_parser_refuses_gets_openais_error_shape_and_a_closed_connection(gateway_url, request_bytes, status, code):
    async with await connect(gateway_url) as stream:
        await stream.send_all(request_bytes)
        data = await read_until_closed(stream)
    got, headers, _ = split_response(data)
    assert (got, headers[b"connection"], headers[b"content-type"]) == (status, b"close", b"application/json")
    error = error_of(data)
    assert error["code"] == code and error["message"] and "Traceback" not in error["message"]


async def test_http2_with_prior_knowledge_is_handed_to_hypercorn(gateway_url):
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    connection.send_headers(1, [(":method", "GET"), (":path", "/health"), (":scheme", "http"), (":authority", "x")], end_stream=True)
    async with await connect(gateway_url) as stream:
        data = connection.data_to_send()
        await stream.send_all(data[:10])  # the preface split across writes: still HTTP/2
        await stream.send_all(data[10:])
        status = body = None
        with trio.fail_after(10):
            ended = False
            while not ended:
                for event in connection.receive_data(await stream.receive_some()):
                    if isinstance(event, h2.events.ResponseReceived):
                        status = dict(event.headers)[b":status"]
                    elif isinstance(event, h2.events.DataReceived):
                        body = (body or b"") + event.data
                    elif isinstance(event, h2.events.StreamEnded):
                        ended = True
                await stream.send_all(connection.data_to_send())
    assert status == b"200" and orjson.loads(body or b"{}")["status"] == "ok"


async def test_a_receive_waiting_for_the_clients_end_hears_http_disconnect_once_its_response_is_complete(nursery):
    # An app that watches for the client leaving in a task of its own, and waits for that task
    # before it returns (as frameworks do): the end of its response ends the watch, and the
    # kept-alive connection serves the next request.
    heard: list[str] = []
    ended = [trio.Event() for _ in range(3)]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        assert (await receive())["type"] == "http.request"
        async with trio.open_nursery() as watchers:

            async def watch() -> None:
                heard.append((await receive())["type"])
                ended[len(heard) - 1].set()

            watchers.start_soon(watch)
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})

    url = await nursery.start(functools.partial(gateway.serve, make_settings("http://127.0.0.1:9"), app=app))  # type: ignore[arg-type]
    async with await connect(url) as stream:
        for n in range(3):
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer, rest = await read_response(stream)
            assert answer.endswith(b"\r\n\r\nok") and rest == b""
            with trio.fail_after(5):
                await ended[n].wait()  # while the connection is kept alive, not once it closes
    assert heard == ["http.disconnect"] * 3


async def test_the_scope_says_whether_the_body_is_already_whole_and_the_app_reads_it_either_way(nursery):
    # The server's extension (`gateway.http11`): `body_ready()` is true when the next
    # `receive` hands over the whole body without waiting; a body still on its way says false,
    # and `read_body` then waits for it under its timer.
    ready: list[bool] = []
    bodies: list[bytes | None] = []
    arrived = trio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        ready.append(scope["extensions"][HTTP11_EXTENSION]["body_ready"]())
        arrived.set()
        bodies.append(await read_body(receive, 1000, 5, scope))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    url = await nursery.start(functools.partial(gateway.serve, make_settings("http://127.0.0.1:9"), app=app))  # type: ignore[arg-type]
    async with await connect(url) as stream:
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nwhole")
        await read_response(stream)
        arrived = trio.Event()
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nla")  # the rest comes later
        with trio.fail_after(5):
            await arrived.wait()
        await stream.send_all(b"ter")
        answer, _ = await read_response(stream)
    assert answer.endswith(b"ok")
    assert ready == [True, False]
    assert bodies == [b"whole", b"later"]


async def test_read_body_goes_on_reading_when_a_body_said_whole_comes_in_parts() -> None:
    messages = [{"type": "http.request", "body": b"par", "more_body": True}, {"type": "http.request", "body": b"ts"}]

    async def receive() -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return messages.pop(0)

    scope = {"extensions": {HTTP11_EXTENSION: {"body_ready": lambda: True}}}
    assert await read_body(receive, 100, 5, scope) == b"parts"
    with pytest.raises(RequestTooLarge):
        messages[:] = [{"type": "http.request", "body": b"x" * 101}]
        await read_body(receive, 100, 5, scope)


async def test_the_stream_extension_writes_a_bodys_pieces_as_its_messages_would_and_keeps_the_framers_count(nursery):
    # `gateway.stream`: a piece of a started body without a message. The first piece carries
    # the held head; an empty piece writes nothing; pieces inside a `gateway.batch` hold leave
    # in one write; a body with a Content-Length still has its pieces counted (too many bytes
    # and the connection is not kept alive), and the last body goes as a message.
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        await receive()
        piece = scope["extensions"][STREAM_EXTENSION]["write"]
        hold = scope["extensions"][BATCH_EXTENSION]["hold"]
        if scope["path"] == "/chunked":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await piece(b"one ")
            await piece(b"")
            async with hold():
                await piece(b"two ")
                await piece(b"three ")
            await send({"type": "http.response.body", "body": b"end"})
        else:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
            await piece(b"ab")
            await piece(b"cde")  # one byte past its length
            await send({"type": "http.response.body", "body": b""})

    url = await nursery.start(functools.partial(gateway.serve, make_settings("http://127.0.0.1:9"), app=app))  # type: ignore[arg-type]
    async with await connect(url) as stream:
        await stream.send_all(b"GET /chunked HTTP/1.1\r\nHost: x\r\n\r\n")
        answer, rest = await read_response(stream)
        status, headers, body = split_response(answer)
        assert status == 200 and headers[b"transfer-encoding"] == b"chunked" and rest == b""
        assert body == b"4\r\none \r\n4\r\ntwo \r\n6\r\nthree \r\n3\r\nend\r\n0\r\n\r\n"
        assert dechunk(body) == b"one two three end"
        await stream.send_all(b"GET /counted HTTP/1.1\r\nHost: x\r\n\r\n")  # the connection was kept alive
        answer = await read_until_closed(stream)
    status, headers, body = split_response(answer)
    assert status == 200 and headers[b"content-length"] == b"4" and body == b"abcd"  # cut at its length, then closed
