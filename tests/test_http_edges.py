"""The HTTP edge over real sockets: what the server and framework left open, closed.

An app failure after a stream started once took the whole process down;
`Connection: close` and HTTP/1.0 connections were never closed; requests
with both Content-Length and Transfer-Encoding were served; WebSockets were
unlimited; headers trickled in slowly held a connection for 75 s; SIGTERM
skipped the shutdown; a store that could not open printed a traceback after
claiming to serve.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
from typing import Any

import httpx2
import orjson
import pytest
import trio
from quart import Response

import gateway
from conftest import SequentialIds, make_settings
from test_multi_instance_and_crash import STARTUP_SECONDS, LineReader, run_gateway_process
from test_websocket import aconnect_ws, turn, ws_url


async def exchange(url: str, request: bytes, *, until_closed: float = 10) -> tuple[bytes, bool]:
    """Send raw bytes; everything the server answers, and whether it closed the connection."""
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    data = b""
    async with stream:
        await stream.send_all(request)
        with trio.move_on_after(until_closed):
            while chunk := await stream.receive_some():
                data += chunk
            return data, True
    return data, False


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
    failures = [r for r in caplog.records if r.name == "gateway.edge"]
    assert len(failures) == 20 and all(r.exc_info is None for r in failures)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /health HTTP/1.0\r\n\r\n",
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"Content-Length: 43\r\n\r\n" + b'{"model":"text","input":"hi","stream":true}',
        b"POST /v1/responses HTTP/1.0\r\nContent-Type: application/json\r\n"
        b"Content-Length: 43\r\n\r\n" + b'{"model":"text","input":"hi","stream":true}',
    ],
)
async def test_connection_close_and_http_1_0_clients_are_answered_and_closed(gateway_url, request_bytes):
    data, closed = await exchange(gateway_url, request_bytes)
    assert closed
    assert data.startswith(b"HTTP/1.1 200")
    assert data.rstrip(b"\r\n0").endswith((b'"running"}', b"data: [DONE]\n\n", b"data: [DONE]"))


async def test_content_length_with_transfer_encoding_is_refused_and_the_connection_closed(gateway_url, backend):
    data, closed = await exchange(
        gateway_url,
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 44\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert closed and data.startswith(b"HTTP/1.1 400"), data
    assert data.count(b"HTTP/1.1") == 1  # the smuggled second request was not served
    assert orjson.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "invalid_request"
    assert backend.requests == []


async def test_control_characters_in_any_path_are_a_400(gateway_url):
    data, closed = await exchange(gateway_url, b"POST /v1/responses%0A HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400") and closed
    assert orjson.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "invalid_path"


async def test_websockets_beyond_the_cap_are_refused_with_429(start_gateway):
    url = await start_gateway(websocket_max_connections=1)
    async with aconnect_ws(ws_url(url)) as first:
        handshake = (
            b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        data, _ = await exchange(url, handshake, until_closed=2)
        assert data.startswith(b"HTTP/1.1 429")
        assert orjson.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "rate_limit_exceeded"
        events = await turn(first, model="text", input="hi")  # the one admitted works
        assert events[-1]["type"] == "response.completed"
    async with aconnect_ws(ws_url(url)) as again:  # a place is free again
        assert (await turn(again, model="text", input="hi"))[-1]["type"] == "response.completed"


async def test_headers_trickling_in_are_cut_off_but_an_idle_connection_is_not(start_gateway):
    url = await start_gateway(request_header_timeout=0.5)
    host, port = url.removeprefix("http://").split(":")
    slow = await trio.open_tcp_stream(host, int(port))
    async with slow, trio.open_nursery() as nursery:

        async def trickle() -> None:
            for byte in b"GET /health HTTP/1.1\r\nHost: " + b"x" * 200:
                await slow.send_all(bytes([byte]))
                await trio.sleep(0.05)  # the attacker's own pace

        nursery.start_soon(trickle)
        with trio.fail_after(5):  # 200 bytes at this pace would take 10 s
            assert await slow.receive_some() == b""
        nursery.cancel_scope.cancel()
    idle = await trio.open_tcp_stream(host, int(port))
    async with idle:
        with trio.move_on_after(1.0):  # longer than the header timeout: time has to pass
            await idle.receive_some()
            pytest.fail("an idle keep-alive connection was closed by the header timeout")
        await idle.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.fail_after(5):
            assert (await idle.receive_some()).startswith(b"HTTP/1.1 200")


async def test_sigterm_stops_the_gateway_in_order_with_exit_status_0(tmp_path, backend):
    with trio.fail_after(STARTUP_SECONDS + 10):
        async with trio.open_nursery() as nursery:
            process = await nursery.start(
                run_gateway_process, tmp_path, {"OPENAI_BASE_URL_INTERNAL": backend.url, "LOG_FILE_PATH": ""}
            )
            async with httpx2.AsyncClient() as http:
                assert (await http.get(process.url + "/health")).status_code == 200
            process.process.send_signal(signal.SIGTERM)
            assert await process.process.wait() == 0
    log = bytes(process.stderr).decode()
    assert "stopping (SIGTERM)" in log and "Traceback" not in log


async def test_several_workers_serve_and_stop_in_order(tmp_path, backend):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("API_ADAPTER", "LOG_"))}
    environ.update(OPENAI_BASE_URL_INTERNAL=backend.url, API_ADAPTER_HOST="127.0.0.1", API_ADAPTER_PORT="0", LOG_FILE_PATH="",
                   STORE_BACKEND="memory", REQUEST_HEADER_TIMEOUT="0.5")
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            functools.partial(
                trio.run_process,
                [sys.executable, "-m", "gateway", "serve", "--workers", "2"],
                env=environ,
                cwd=tmp_path,
                stderr=subprocess.PIPE,
                check=False,
            )
        )
        assert process.stderr is not None
        reader = LineReader(process.stderr)
        urls: list[str] = []
        with trio.fail_after(STARTUP_SECONDS * 2):
            while len(urls) < 2:
                line = await reader.readline()
                if "serving the Responses gateway on " in line:
                    urls.append(line.split("serving the Responses gateway on ", 1)[1].split(" ", 1)[0])
        assert urls[0] == urls[1]  # one shared socket
        async with httpx2.AsyncClient(timeout=10) as http:
            r = await http.post(urls[0] + "/v1/responses", json={"model": "text", "input": "hi"})
            assert r.json()["status"] == "completed"
        # The header timeout applies in worker processes too.
        host, port = urls[0].removeprefix("http://").split(":")
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(b"GET /health HTTP/1.1\r\n")
            with trio.fail_after(5):
                assert await stream.receive_some() == b""
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await process.wait() == 0


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

