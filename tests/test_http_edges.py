"""The HTTP edge over real sockets: what the server and framework left open, closed.

An app failure after a stream started, or a response cancelled as it
started, once took the whole process down; `Connection: close` and HTTP/1.0
connections were never closed; requests with both Content-Length and
Transfer-Encoding were served; control characters in a path were routed;
WebSockets were unlimited; headers trickled in slowly held a connection for
75 s; SIGTERM skipped the shutdown; a store that could not open printed a
traceback after claiming to serve.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from typing import Any

import httpx2
import orjson
import pytest
import trio
import trio.testing
from httpx2.websockets import WebSocketUpgradeError
from quart import Response

import gateway
from asgi_helpers import answer_lifespan
from conftest import SequentialIds, make_settings, parse_sse
from test_drain import served, stored
from test_multi_instance_and_crash import STARTUP_SECONDS, run_gateway_process
from test_websocket import aconnect_ws, turn, ws_url

STREAM_BODY = b'{"model":"text","input":"hi","stream":true}'


async def connect(url: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").split(":")
    return await trio.open_tcp_stream(host, int(port))


async def read_until_closed(stream: trio.SocketStream, *, within: float = 10) -> bytes:
    """Everything the server sends until it closes the connection; fails if it does not close in time."""
    data = b""
    with trio.fail_after(within):
        try:
            while chunk := await stream.receive_some():
                data += chunk
        except trio.BrokenResourceError:  # closed with a reset (bytes of ours were still unread)
            pass
    return data


async def exchange(url: str, request: bytes) -> bytes:
    """Send raw bytes; everything answered, once the server has closed the connection."""
    async with await connect(url) as stream:
        await stream.send_all(request)
        return await read_until_closed(stream)


def split_response(data: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def error_of(data: bytes) -> dict[str, Any]:
    return orjson.loads(split_response(data)[2])["error"]  # type: ignore[no-any-return]


def dechunk(body: bytes) -> bytes:
    """A chunked body's content; asserts the framing is complete and nothing follows it."""
    content = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            assert body == b"\r\n", body
            return content
        content, body = content + body[:size], body[size + 2 :]


# --- nothing reaches the server's own error handling ----------------------------------------


async def test_an_app_failing_after_its_stream_started_never_takes_the_process_down(backend, nursery, client, caplog):
    caplog.set_level(logging.INFO)
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, ids=SequentialIds())

    @app.get("/v1/boom")
    async def boom() -> Response:
        async def body() -> Any:
            yield b"data: partial\n\n"
            raise RuntimeError("the body failed half-way")

        response = Response(body(), content_type="text/event-stream")
        response.timeout = None
        return response

    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    for attempt in range(20):
        with pytest.raises(httpx2.RemoteProtocolError):  # the body ends unfinished: the client can tell
            await client.get(url + "/v1/boom")
        assert (await client.get(url + "/health")).status_code == 200, attempt
    failures = [r for r in caplog.records if r.name == "gateway.app.edge"]
    assert len(failures) == 20 and all(r.exc_info is None for r in failures)
    assert not [r for r in caplog.records if "Error in ASGI Framework" in r.getMessage()]


async def test_a_response_cancelled_as_its_status_line_is_sent_never_takes_the_process_down(
    backend, nursery, client, caplog
):
    # quart-trio cancels a response's send when its timeout passes; cancelled
    # inside the status line's send, hypercorn once tried a 500 mid-response.
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, ids=SequentialIds())

    @app.get("/v1/cut")
    async def cut() -> Response:
        response = Response(b"never finished")
        response.timeout = 0
        return response

    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    for attempt in range(20):
        data = await exchange(url, b"GET /v1/cut HTTP/1.1\r\nHost: x\r\n\r\n")
        assert split_response(data)[0] == 200, attempt  # the status line got out whole; the body was cut
        assert (await client.get(url + "/health")).status_code == 200, attempt
    assert not [r for r in caplog.records if "failed on one connection" in r.getMessage()]  # the edge sufficed


def bare_app(other: Any) -> Any:
    """An ASGI app without the gateway's edge: the lifespan, `/ok`, and every other path `other`'s."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
        elif scope["path"] == "/ok":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
        else:
            await other(scope, receive, send)

    return app


async def test_a_failure_inside_hypercorns_http_server_ends_its_connection_only(backend, nursery, client, caplog):
    # Without the edge (any ASGI app), on hypercorn's HTTP/1.1 (HTTP1_SERVER=hypercorn; its
    # WebSockets and HTTP/2 always): a response start cancelled half-way makes hypercorn's own
    # cleanup raise h11's LocalProtocolError.
    async def cut_start(scope: dict[str, Any], receive: Any, send: Any) -> None:
        with trio.CancelScope() as cut:
            cut.cancel()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})

    settings = make_settings(backend.url, http1_server="hypercorn")
    url = await nursery.start(functools.partial(gateway.serve, settings, app=bare_app(cut_start)))  # type: ignore[arg-type]
    for attempt in range(5):
        assert await exchange(url, b"GET /cut HTTP/1.1\r\nHost: x\r\n\r\n") == b"", attempt
        assert (await client.get(url + "/ok")).text == "ok", attempt
    assert [r.exc_info for r in caplog.records if "failed on one connection" in r.getMessage()] == [None] * 5


async def test_an_app_breaking_the_asgi_protocol_on_the_gateways_http_server_gets_a_500_and_ends_its_connection_only(
    backend, nursery, client, caplog
):
    # Without the edge (any ASGI app), on the gateway's own HTTP/1.1: a body before its start
    # is the app's failure; the client gets a 500 and a closed connection, the log one line.
    async def body_first(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/silent":
            return  # no answer at all
        await send({"type": "http.response.body", "body": b"no start"})

    url = await nursery.start(functools.partial(gateway.serve, make_settings(backend.url), app=bare_app(body_first)))  # type: ignore[arg-type]
    for attempt in range(5):
        for path in (b"/broken", b"/silent"):
            status, headers, _ = split_response(await exchange(url, b"GET %b HTTP/1.1\r\nHost: x\r\n\r\n" % path))
            assert (status, headers[b"connection"]) == (500, b"close"), (attempt, path)
        assert (await client.get(url + "/ok")).text == "ok", attempt
    failures = [r for r in caplog.records if "the app failed on one request (RuntimeError)" in r.getMessage()]
    assert [r.exc_info for r in failures] == [None] * 5


# --- Connection: close, HTTP/1.0 ------------------------------------------------------------


def streamed_post(version: bytes, extra_header: bytes = b"") -> bytes:
    head = b"POST /v1/responses HTTP/%s\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % (version, extra_header, len(STREAM_BODY)) + STREAM_BODY


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /health HTTP/1.0\r\n\r\n",
        streamed_post(b"1.1", b"Connection: close\r\n"),
        streamed_post(b"1.0"),
    ],
    ids=["GET Connection: close", "GET HTTP/1.0", "streamed POST Connection: close", "streamed POST HTTP/1.0"],
)
async def test_connection_close_and_http_1_0_clients_get_a_whole_response_and_a_closed_connection(
    gateway_url, request_bytes
):
    status, headers, body = split_response(await exchange(gateway_url, request_bytes))
    assert status == 200 and headers[b"connection"] == b"close"
    if b"content-length" in headers:
        assert len(body) == int(headers[b"content-length"])
        assert orjson.loads(body)["adapter"] == "running"
        return
    if headers.get(b"transfer-encoding") == b"chunked":
        body = dechunk(body)
    frames = parse_sse(body)  # close-delimited (HTTP/1.0): the close ends the body
    assert frames[-1] == "[DONE]" and frames[-2]["type"] == "response.completed"


# --- request smuggling, hostile paths ----------------------------------------------------------


@pytest.mark.parametrize(
    "framing",
    [b"Content-Length: 44\r\nTransfer-Encoding: chunked\r\n", b"Transfer-Encoding: chunked\r\nContent-Length: 44\r\n"],
    ids=["CL first", "TE first"],
)
async def test_content_length_with_transfer_encoding_is_refused_and_the_connection_closed(gateway_url, backend, framing):
    data = await exchange(
        gateway_url,
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + framing + b"\r\n"
        b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    status, headers, _ = split_response(data)
    assert status == 400 and headers[b"connection"] == b"close"
    assert data.count(b"HTTP/1.1 ") == 1  # the smuggled second request was not served
    error = error_of(data)
    assert error["code"] == "invalid_request" and error["type"] == "invalid_request_error"
    assert backend.requests == []


@pytest.mark.parametrize("path", [b"/health%00", b"/v1/responses%1B", b"/v1/models%7F", b"/v1/%0Aresponses", b"/%1f"])
async def test_control_characters_in_a_path_are_a_400_invalid_path(gateway_url, backend, path):
    data = await exchange(gateway_url, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert split_response(data)[0] == 400
    error = error_of(data)
    assert error["code"] == "invalid_path" and error["param"] is None
    assert backend.requests == []


# --- WebSockets -----------------------------------------------------------------------------------


async def test_websockets_beyond_the_cap_are_refused_with_429_until_a_place_is_free(start_gateway):
    url = await start_gateway(websocket_max_connections=1)
    async with aconnect_ws(ws_url(url)) as first:
        with pytest.raises(WebSocketUpgradeError) as refused:
            async with aconnect_ws(ws_url(url)):
                pass
        assert refused.value.response.status_code == 429
        handshake = (
            b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        data = await exchange(url, handshake)
        assert split_response(data)[0] == 429
        error = error_of(data)
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "invalid_request_error"
        events = await turn(first, model="text", input="hi")  # the one admitted works
        assert events[-1]["type"] == "response.completed"
    await trio.testing.wait_all_tasks_blocked()  # the server has seen the close
    async with aconnect_ws(ws_url(url)) as again:
        assert (await turn(again, model="text", input="hi"))[-1]["type"] == "response.completed"


# --- the request-header deadline ------------------------------------------------------------------


async def test_a_request_whose_headers_stop_half_way_gets_408_and_is_closed(start_gateway):
    url = await start_gateway(request_header_timeout=0.5)
    async with await connect(url) as stream:
        await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        data = await read_until_closed(stream, within=5)
    assert split_response(data)[0] == 408


async def test_headers_trickling_in_are_cut_off_however_busy_the_client_keeps_the_connection(start_gateway):
    url = await start_gateway(request_header_timeout=0.5)
    async with await connect(url) as stream, trio.open_nursery() as nursery:

        async def trickle() -> None:
            try:
                for byte in b"GET /health HTTP/1.1\r\nX-Slow: " + b"x" * 200:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(0.05)  # the attacker's own pace: 200 bytes take 10 s
            except trio.BrokenResourceError:
                pass  # cut off

        nursery.start_soon(trickle)
        data = await read_until_closed(stream, within=5)
        nursery.cancel_scope.cancel()
    assert data == b"" or split_response(data)[0] == 408


async def test_the_header_deadline_runs_from_a_requests_first_byte_not_while_a_connection_idles(start_gateway):
    url = await start_gateway(request_header_timeout=0.5)
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    async with await connect(url) as stream:
        for _ in range(2):
            await stream.send_all(request)
            data = b""
            with trio.fail_after(5):
                while not data.endswith(b'"running"}'):  # the whole /health response
                    data += await stream.receive_some()
            assert split_response(data)[0] == 200
            with trio.move_on_after(1.0):  # idle for longer than the header deadline: time has to pass
                await stream.receive_some()
                pytest.fail("an idle keep-alive connection was closed by the header deadline")
    async with await connect(url) as stream:  # a pipelined request that stops half-way is still cut off
        await stream.send_all(request + b"GET /health HTTP/1.1\r\nHo")
        data = await read_until_closed(stream, within=5)
    first, _, second = data.partition(b'"running"}')
    assert split_response(first)[0] == 200 and split_response(second)[0] == 408


# --- processes: signals, workers, start-up --------------------------------------------------------


def store_env(tmp_path: Any, backend_url: str) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL_INTERNAL": backend_url,
        "LOG_FILE_PATH": "",
        "STORE_BACKEND": "sqlite",
        "SQLITE_PATH": str(tmp_path / "responses.sqlite3"),
    }


async def start_background_response(url: str, backend: Any) -> str:
    async with httpx2.AsyncClient(timeout=10) as http:
        made = await http.post(url + "/v1/responses", json={"model": "hang", "input": "hi", "background": True})
    with trio.fail_after(5):
        await backend.stream_started.wait()
    return str(made.json()["id"])


async def status_in_store(tmp_path: Any, response_id: str) -> str:
    return str((await stored(tmp_path, response_id))["status"])


async def error_in_store(tmp_path: Any, response_id: str) -> str | None:
    return ((await stored(tmp_path, response_id)).get("error") or {}).get("code")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_drains_the_gateway_and_stops_unfinished_background_work_with_a_stored_ending(
    tmp_path, backend, signum
):
    # The backend never answers: past SHUTDOWN_GRACE the response ends, failed, and says why.
    with trio.fail_after(STARTUP_SECONDS + 20):
        async with trio.open_nursery() as nursery:
            env = {**store_env(tmp_path, backend.url), "SHUTDOWN_GRACE": "0.5"}
            process = await nursery.start(run_gateway_process, tmp_path, env)
            response_id = await start_background_response(process.url, backend)
            process.process.send_signal(signum)
            assert await process.process.wait() == 0
    log = bytes(process.stderr).decode()
    assert f"stopping ({signal.Signals(signum).name})" in log and "Traceback" not in log, log
    assert await status_in_store(tmp_path, response_id) == "failed", log
    assert await error_in_store(tmp_path, response_id) == "server_shutting_down"


@pytest.mark.parametrize("to_every_process", [False, True], ids=["SIGTERM to the parent", "SIGTERM to every process"])
async def test_several_workers_share_the_socket_cut_slow_headers_and_stop_in_order(tmp_path, backend, to_every_process):
    # A service manager may signal the parent only (docker, kubernetes) or
    # every process of the service at once (systemd).
    with trio.fail_after(STARTUP_SECONDS * 2 + 30):
        async with served(tmp_path, backend.url, "--workers", "2", REQUEST_HEADER_TIMEOUT="0.5", SHUTDOWN_GRACE="0.5") as gateway:
            second = await gateway.until_logged("serving the Responses gateway on ", count=2)
            assert gateway.url in second  # one shared socket
            async with httpx2.AsyncClient(timeout=10) as http:
                r = await http.post(gateway.url + "/v1/responses", json={"model": "text", "input": "hi"})
                assert r.json()["status"] == "completed"
            async with await connect(gateway.url) as stream:  # the header deadline applies in worker processes too
                await stream.send_all(b"GET /health HTTP/1.1\r\n")
                assert split_response(await read_until_closed(stream, within=5))[0] == 408
            response_id = await start_background_response(gateway.url, backend)
            if to_every_process:
                os.killpg(gateway.process.pid, signal.SIGTERM)
            else:
                gateway.process.send_signal(signal.SIGTERM)
            assert await gateway.process.wait() == 0
            log = await gateway.read_rest()
    assert "Traceback" not in log
    assert await status_in_store(tmp_path, response_id) == "failed"
    assert await error_in_store(tmp_path, response_id) == "server_shutting_down"


async def test_a_store_that_cannot_open_stops_start_up_with_one_clear_line(tmp_path, backend):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("API_ADAPTER", "LOG_", "SQLITE", "STORE"))}
    environ.update(OPENAI_BASE_URL_INTERNAL=backend.url, API_ADAPTER_PORT="0", LOG_FILE_PATH="", SQLITE_PATH=str(tmp_path))
    with trio.fail_after(STARTUP_SECONDS):
        done = await trio.run_process(
            [sys.executable, "-m", "gateway", "serve"], env=environ, cwd=tmp_path, capture_stderr=True, check=False
        )
    err = done.stderr.decode()
    assert done.returncode == 2
    assert "gateway: cannot start: SQLITE_PATH: cannot open the SQLite store" in err
    assert "Traceback" not in err and "serving the Responses gateway" not in err


SERVE_THEN_COUNT = """
import functools, sys
import trio
import gateway
from gateway.config import Settings

async def main():
    settings = Settings(_env_file=None, openai_base_url_internal="http://127.0.0.1:9", api_adapter_port=0,
                        log_file_path="", store_backend="memory")
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(gateway.serve, settings))
        print("mcp" in sys.modules, "gateway.mcp" in sys.modules)
        nursery.cancel_scope.cancel()

trio.run(main)
"""


async def test_the_mcp_side_is_loaded_before_serving_so_no_request_holds_the_event_loop_loading_it():
    # Loading the mcp SDK takes about a second of pydantic model building. The first request that
    # named a hosted MCP server (or went through the hosted-tool check) once paid it on the event
    # loop, stalling every other stream of the process for that long.
    done = await trio.run_process(
        [sys.executable, "-c", SERVE_THEN_COUNT], capture_stdout=True, capture_stderr=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["True", "True"]


async def test_chat_completions_and_the_messages_api_are_served_beside_the_framework(nursery, backend, client):
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, ids=SequentialIds(), clock=lambda: 1_700_000_000.0)
    framework = app.asgi_app
    seen: list[str] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append(f"{scope['method']} {scope['path']}")
        await framework(scope, receive, send)

    app.asgi_app = recording  # type: ignore[method-assign]
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    hi = [{"role": "user", "content": "hi"}]
    with trio.fail_after(20):
        relayed = await client.post(url + "/v1/chat/completions", json={"model": "text", "messages": hi})
        assert relayed.status_code == 200 and relayed.text.rstrip().endswith("data: [DONE]")  # as the backend sent it
        streamed = await client.post(url + "/chat/completions", json={"model": "text", "messages": hi, "stream": True})
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        refused = await client.post(url + "/v1/chat/completions", json={"model": "text"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "missing_required_parameter"
        anthropic = {"anthropic-version": "2023-06-01"}
        message = await client.post(url + "/v1/messages?beta=true", json={"model": "text", "max_tokens": 32, "messages": hi}, headers=anthropic)
        assert message.status_code == 200 and message.json()["content"][0]["text"] == "Hello, world!"
        bad = await client.post(url + "/v1/messages", json={"model": "text", "messages": hi}, headers=anthropic)
        assert bad.status_code == 400 and bad.json()["type"] == "error"  # Anthropic's shape
        listed = await client.get(url + "/v1/models")
        assert listed.status_code == 200
    assert seen == ["GET /v1/models"]  # the rest never reached the framework


async def _response(stream: trio.SocketStream) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length, read whole: its status and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += await stream.receive_some(65536)
    return int(head.split()[1]), body


async def test_a_body_the_app_answered_without_reading_does_not_cost_the_next_request(gateway_url):
    """A GET that carries a body (its bytes sent after the app answered): the response says the
    connection stays open, and it does, for the next request on it."""
    host, port = gateway_url.removeprefix("http://").split(":")
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(b"GET /health HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\n")
            status, body = await _response(stream)
            assert status == 200 and orjson.loads(body)["status"] == "ok"
            await stream.send_all(b"{}GET /ready HTTP/1.1\r\nHost: gw\r\n\r\n")
            status, body = await _response(stream)
            assert status in (200, 503) and "status" in orjson.loads(body)
