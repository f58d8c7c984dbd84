"""The gateway's own HTTP/1.1 server over real sockets: as strict as h11, one answer, nothing on to the backend.

Raw bytes against the gateway served on port 0 (and a scripted backend
behind it): every smuggling shape gets exactly one answer and a closed
connection, no turn runs on a partial body, and nothing reaches the
backend; a request refused at the door is answered before its body is
read; what an app sends is checked on the way out.  The same corpus the
differential suite feeds h11 (`test_http_differential.py`) goes here over
sockets to an app that records what it hears.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import h11
import orjson
import pytest
import trio

import gateway
from asgi_helpers import answer_lifespan
from conftest import make_settings
from test_http_differential import CORPUS, REFUSED, body_read, h11_reads
from test_http_edges import connect, read_until_closed
from test_keys import ALICE, CAROL, key

HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def responses_in(data: bytes) -> tuple[list[tuple[int, dict[bytes, bytes], bytes]], bytes]:
    """The whole responses in `data` (by h11, as a client that sent GETs), and what followed them."""
    found = []
    while data:
        client = h11.Connection(h11.CLIENT)
        client.send(h11.Request(method="GET", target="/", headers=[(b"host", b"x")]))
        client.send(h11.EndOfMessage())
        client.receive_data(data)
        try:
            head = client.next_event()
        except h11.RemoteProtocolError:
            break
        if not isinstance(head, h11.Response):
            break
        body = body_read(client)
        if body is None:
            return found, data  # an unfinished response
        found.append((head.status_code, {bytes(n): bytes(v) for n, v in head.headers}, body))
        data = bytes(client.trailing_data[0])
    return found, data


async def exchange(url: str, data: bytes) -> bytes:
    async with await connect(url) as stream:
        await stream.send_all(data)
        return await read_until_closed(stream)


SMUGGLING = [
    "broken chunk after a whole json body",
    "te xchunked",
    "te gzip",
    "te gzip, chunked",
    "te identity",
    "te chunked twice",
    "chunk ext with bare CR",
    "chunk size 0x19",
    "chunk size overflow",
    "chunk lines with bare LF",
    "trailer without colon",
    "cl and te",
    "te and cl",
    "cl doubled, same value",
    "cl listed",
    "obs-fold in a value",
    "obs-fold of transfer-encoding",
    "bare LF head",
    "bare CR in a header",
    "no host",
    "two hosts",
    "two spaces in the request line",
    "empty line before the request",
    "http/0.9",
    "te on http/1.0",
]


def _aimed_at_responses(raw: bytes) -> bytes:
    """The case's bytes as a POST to /v1/responses, where a turn would run."""
    for line in (b"POST / ", b"GET / "):
        if raw.startswith(line):
            return b"POST /v1/responses " + raw[len(line) :]
    return raw


@pytest.mark.parametrize("name", SMUGGLING)
async def test_every_smuggling_shape_gets_one_answer_then_a_closed_connection_and_nothing_reaches_the_backend(gateway_url, backend, name):
    raw = _aimed_at_responses(dict(CORPUS)[name])
    data = await exchange(gateway_url, raw + HEALTH)  # a second request behind it: never answered
    found, rest = responses_in(data)
    assert len(found) == 1 and rest == b"", f"{name}: {data!r}"
    status, headers, body = found[0]
    assert status in (400, 501, 505), name
    assert headers[b"connection"] == b"close"
    error = orjson.loads(body)["error"]
    assert error["code"] and "Traceback" not in error["message"]
    assert backend.chat_requests == []
    # ...and the gateway goes on serving.
    assert responses_in(await exchange(gateway_url, HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")))[0][0][0] == 200


async def test_a_transfer_coding_that_is_not_chunked_is_501_as_h11_answers_it(gateway_url, backend):
    data = await exchange(gateway_url, b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    [(status, _, body)], _ = responses_in(data)
    assert status == 501 and orjson.loads(body)["error"]["code"] == "unsupported_transfer_encoding"


@pytest.mark.parametrize("hosts", [b"", b"Host: a\r\nHost: b\r\n"], ids=["none", "two"])
async def test_an_http11_request_without_exactly_one_host_is_400(gateway_url, hosts):
    [(status, _, _)], _ = responses_in(await exchange(gateway_url, b"GET /health HTTP/1.1\r\n" + hosts + b"\r\n"))
    assert status == 400


async def test_a_broken_chunk_after_a_whole_body_runs_no_turn_and_the_app_hears_the_client_leave(nursery):
    heard: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        while True:
            message = await receive()
            heard.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                return

    url = await nursery.start(functools.partial(gateway.serve, make_settings("http://127.0.0.1:9"), app=app))
    body = b'{"model":"m","input":"x"}'
    raw = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%b\r\nzz\r\n" % (len(body), body)
    found, rest = responses_in(await exchange(url, raw))
    assert [status for status, _, _ in found] == [400] and rest == b""
    # The app never heard the body as complete: the client left (as far as it can tell).
    assert all(m.get("more_body", False) for m in heard if m["type"] == "http.request")
    assert heard[-1]["type"] == "http.disconnect"


async def test_what_the_app_hears_over_a_socket_is_what_h11_reads(nursery):
    heard: list[tuple[Any, ...]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        body, whole = b"", False
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body"):
                whole = True
                break
        target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        heard.append((scope["method"], target, scope["http_version"], list(scope["headers"]), body, whole))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    url = await nursery.start(functools.partial(gateway.serve, make_settings("http://127.0.0.1:9"), app=app))
    for name, raw in CORPUS:
        heard.clear()
        theirs, end = h11_reads(raw)
        async with await connect(url) as stream:
            await stream.send_all(raw)
            with trio.move_on_after(0.5):  # (a partial request is never answered: what was heard by then)
                await read_until_closed(stream)
        whole = [request for request in heard if request[5]]
        if end == REFUSED:
            # h11 refuses somewhere: what the app heard whole came before that point, and h11 read it too.
            assert len(whole) <= len([t for t in theirs if t[5]]), f"{name}: the app heard what h11 refuses"
        # Every request the app heard whole, h11 read the same (the gateway may stop sooner: stricter).
        for ours, h11_request in zip(whole, [t for t in theirs if t[5]]):
            method, target, version, headers, body, _ = ours
            assert (method, version, headers, body) == (h11_request[0], h11_request[2], h11_request[3], h11_request[4]), name
            assert h11_request[1].startswith(target) or h11_request[1].startswith(b"http"), name


# --- refused before the body is read -------------------------------------------------------------


async def test_a_request_refused_at_the_door_is_answered_before_its_body_and_told_no_100_continue(keyed_gateway):
    url = keyed_gateway
    async with await connect(url) as stream:
        await stream.send_all(
            b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 1000000\r\n\r\n"
        )
        data = await read_until_closed(stream)  # the body never sent: the answer comes anyway
    assert b"100 Continue" not in data
    [(status, headers, body)], _ = responses_in(data)
    assert status == 401 and orjson.loads(body)["error"]["code"] == "invalid_api_key"


async def test_a_request_over_its_keys_rate_is_answered_before_its_body(keyed_gateway, keys_store, client):
    url = keyed_gateway
    await keys_store.put(key("carol", CAROL, rpm=1))
    assert (await client.get(url + "/v1/models", headers={"authorization": f"Bearer {CAROL}"})).status_code == 200
    async with await connect(url) as stream:
        await stream.send_all(
            b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %b\r\nExpect: 100-continue\r\nContent-Length: 1000\r\n\r\n" % CAROL.encode()
        )
        data = await read_until_closed(stream)
    assert b"100 Continue" not in data
    [(status, _, _)], _ = responses_in(data)
    assert status == 429


async def test_an_admitted_request_is_told_100_continue_and_its_body_read(keyed_gateway, backend):
    async with await connect(keyed_gateway) as stream:
        body = b'{"model":"text","input":"hi"}'
        await stream.send_all(
            b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %b\r\nExpect: 100-continue\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (ALICE.encode(), len(body))
        )
        with trio.fail_after(10):
            seen = b""
            while b"100 Continue" not in seen:
                seen += await stream.receive_some()
        await stream.send_all(body)
        data = seen + await read_until_closed(stream)
    assert data.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    [(status, _, _)], _ = responses_in(data.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n"))
    assert status == 200 and len(backend.chat_requests) == 1


@pytest.fixture
async def keys_store() -> Any:
    from gateway.keys.stores import MemoryKeys

    keys = MemoryKeys(clock=lambda: 1_700_000_000.0)
    await keys.put(key("alice", ALICE))
    return keys


@pytest.fixture
async def keyed_gateway(start_gateway, keys_store) -> str:
    return await start_gateway(keys=keys_store)  # type: ignore[no-any-return]


# --- the WebSocket upgrade, and pipelining -----------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [b"Content-Length: 3\r\n", b"Host: y\r\n", b"Transfer-Encoding: chunked\r\n"],
    ids=["a body", "two hosts", "chunked"],
)
async def test_a_websocket_handshake_framed_wrong_is_refused_and_closed(gateway_url, extra):
    raw = (
        b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" + extra + b"\r\nabc"
    )
    found, rest = responses_in(await exchange(gateway_url, raw))
    assert [status for status, _, _ in found] == [400] and rest == b""


async def test_a_smuggled_request_behind_a_good_one_gets_the_good_answer_and_one_refusal(gateway_url, backend):
    bad = dict(CORPUS)["cl and te"]
    found, rest = responses_in(await exchange(gateway_url, HEALTH + bad + HEALTH))
    assert [status for status, _, _ in found] == [200, 400] and rest == b""


# --- what goes out ----------------------------------------------------------------------------------


def answering(status: int, headers: list[tuple[bytes, bytes]], *bodies: bytes) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for index, body in enumerate(bodies or (b"",)):
            await send({"type": "http.response.body", "body": body, "more_body": index < len(bodies) - 1})

    return app


@pytest.mark.parametrize("value", [b"x\r\nSet-Cookie: stolen=1", b"x\nY: z", b"x\x00y"], ids=["CRLF", "LF", "NUL"])
async def test_a_header_the_app_sends_with_cr_lf_or_nul_becomes_a_500_and_the_connection_closes(nursery, caplog, value):
    app = answering(200, [(b"x-echo", value), (b"content-length", b"2")], b"ok")
    url = await nursery.start(functools.partial(gateway.serve, make_settings("http://127.0.0.1:9"), app=app))
    with caplog.at_level(logging.INFO, logger="gateway"):
        data = await exchange(url, HEALTH + HEALTH)
    found, rest = responses_in(data)
    assert [status for status, _, _ in found] == [500] and rest == b""
    assert b"stolen" not in data and b"x-echo" not in data.lower()
    said = [r for r in caplog.records if "could not be sent" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None


async def test_more_body_than_its_content_length_is_cut_and_the_connection_closed_never_desynced(nursery):
    app = answering(200, [(b"content-length", b"2")], b"okEXTRAHTTP/1.1 200 OK\r\n\r\n")
    url = await nursery.start(functools.partial(gateway.serve, make_settings("http://127.0.0.1:9"), app=app))
    found, rest = responses_in(await exchange(url, HEALTH + HEALTH))
    assert [(status, body) for status, _, body in found] == [(200, b"ok")] and rest == b""


async def test_less_body_than_its_content_length_closes_the_connection(nursery):
    app = answering(200, [(b"content-length", b"5")], b"ok")
    url = await nursery.start(functools.partial(gateway.serve, make_settings("http://127.0.0.1:9"), app=app))
    data = await exchange(url, HEALTH + HEALTH)  # closed after the two bytes: the client is not left waiting
    assert data.endswith(b"\r\n\r\nok") and data.count(b"HTTP/1.1 ") == 1


async def test_an_apps_own_transfer_encoding_chunked_is_honoured(nursery):
    app = answering(200, [(b"transfer-encoding", b"chunked")], b"hello ", b"world")
    url = await nursery.start(functools.partial(gateway.serve, make_settings("http://127.0.0.1:9"), app=app))
    found, rest = responses_in(await exchange(url, HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")))
    assert [(status, headers.get(b"transfer-encoding"), body) for status, headers, body in found] == [(200, b"chunked", b"hello world")]
    assert rest == b""
