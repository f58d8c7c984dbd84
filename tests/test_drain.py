"""Graceful drain: SIGTERM sent to a real `gateway serve` with work in flight.

Every process stops listening at once (a new connection is refused, never
left unanswered); readiness turns 503 and requests on connections already
open are answered 503 `server_shutting_down` with `Connection: close`; open
streams, WebSocket turns and background responses get SHUTDOWN_GRACE to
finish; whatever is still running then ends with a terminal event that is
also stored, and WebSockets get a close frame.  Nothing is cut without an
ending, with one process as with `--workers 2`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import h11
import httpx2
import orjson
import psutil
import pytest
import trio
from httpx2.websockets import AsyncWebSocketClient, WebSocketDisconnect

from conftest import parse_sse
from gateway.server.loop import LINGER as _LINGER
from gateway.store.sqlite import SQLiteStore
from spec import validate_event
from test_multi_instance_and_crash import _SETTINGS_VARIABLES, STARTUP_SECONDS, LineReader


class Served:
    """A `gateway serve` process, and what it logs, read as it comes (a full pipe would stall it)."""

    def __init__(self, process: trio.Process) -> None:
        self.url = ""
        self.port = 0
        self.process = process
        self.lines: list[str] = []
        self.ended = trio.Event()
        self._more = trio.Event()

    async def pump(self, stream: trio.abc.ReceiveStream) -> None:
        reader = LineReader(stream)
        try:
            while True:
                self.lines.append(await reader.readline())
                self._more.set()
                self._more = trio.Event()
        except EOFError:
            self.lines += bytes(reader.buffer).decode(errors="replace").splitlines()
        finally:
            self.ended.set()
            self._more.set()

    async def until_logged(self, text: str, count: int = 1) -> str:
        """Wait until `count` lines contain `text`; the last of them (EOFError if the process ends first)."""
        while True:
            found = [line for line in self.lines if text in line]
            if len(found) >= count:
                return found[count - 1]
            if self.ended.is_set():
                raise EOFError("\n".join(self.lines))
            await self._more.wait()

    async def read_rest(self) -> str:
        """Everything logged, once the process has closed its stderr."""
        await self.ended.wait()
        return "\n".join(self.lines)


@contextlib.asynccontextmanager
async def served(tmp_path: Any, backend_url: str, *args: str, **env: str | None) -> AsyncIterator[Served]:
    """`gateway serve ARGS` with its own settings (`env` on top of a test set-up), once it serves."""
    environ = {k: v for k, v in os.environ.items() if k.upper() not in _SETTINGS_VARIABLES | {"PROMETHEUS_MULTIPROC_DIR"}}
    environ.update(
        API_ADAPTER_HOST="127.0.0.1",
        API_ADAPTER_PORT="0",
        OPENAI_BASE_URL_INTERNAL=backend_url,
        LOG_FILE_PATH="",
        STORE_BACKEND="sqlite",
        SQLITE_PATH=str(tmp_path / "responses.sqlite3"),
    )
    environ.update(env)
    environ = {name: value for name, value in environ.items() if value is not None}  # (None: unset it)
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            functools.partial(
                trio.run_process,
                [sys.executable, "-m", "gateway", "serve", *args],
                env=environ,
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                check=False,
                start_new_session=True,  # its own process group: killpg reaches the workers too
            )
        )
        try:
            assert process.stderr is not None
            gateway = Served(process)
            nursery.start_soon(gateway.pump, process.stderr)
            with trio.fail_after(STARTUP_SECONDS):
                line = await gateway.until_logged("serving the Responses gateway on ")
            gateway.url = line.split("serving the Responses gateway on ", 1)[1].split(" ", 1)[0]
            gateway.port = int(gateway.url.rsplit(":", 1)[1])
            yield gateway
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # never leave a gateway behind a failed test


async def stored(tmp_path: Any, response_id: str) -> dict[str, Any]:
    store = SQLiteStore(str(tmp_path / "responses.sqlite3"))
    try:
        record = await store.load(response_id)
    finally:
        await store.aclose()
    assert record is not None, f"{response_id} was not stored"
    return record.response


class OpenStream:
    """A streamed request held open: its frames so far, and an event per awaited type."""

    def __init__(self) -> None:
        self.raw = bytearray()
        self.first_delta = trio.Event()
        self.ended = trio.Event()
        self.status: int | None = None
        self.cut: str | None = None

    async def run(self, url: str, path: str, body: dict[str, Any]) -> None:
        try:
            async with httpx2.AsyncClient(timeout=60) as http:
                async with http.stream("POST", url + path, json=body) as response:
                    self.status = response.status_code
                    async for data in response.aiter_bytes():
                        self.raw += data
                        if b'"delta"' in self.raw or b"output_text.delta" in self.raw:
                            self.first_delta.set()
        except httpx2.TransportError as error:
            self.cut = f"{path}: the stream was cut after {bytes(self.raw)[-300:]!r} ({error})"
        self.ended.set()

    @property
    def frames(self) -> list[Any]:
        assert self.cut is None, self.cut
        return parse_sse(bytes(self.raw))

    @property
    def chunks(self) -> list[Any]:
        """A Chat Completions stream's data lines (no `event:` names there)."""
        assert self.cut is None, self.cut
        lines = [line[6:] for line in bytes(self.raw).split(b"\n") if line.startswith(b"data: ")]
        return ["[DONE]" if line == b"[DONE]" else orjson.loads(line) for line in lines]


class KeptAlive:
    """One HTTP/1.1 connection held open between requests (a load balancer's, say), spoken with h11."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.http = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, url: str) -> KeptAlive:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)))

    @property
    def port(self) -> int:
        """The client's port: how the server's side of this connection is found."""
        return int(self.stream.socket.getsockname()[1])

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[h11.Response, bytes]:
        """Send one request; its response and body (the connection is kept for the next one when it may be)."""
        if self.http.our_state is h11.DONE and self.http.their_state is h11.DONE:
            self.http.start_next_cycle()
        headers = [("host", "gateway"), ("content-type", "application/json"), ("content-length", str(len(body)))]
        data = self.http.send(h11.Request(method=method, target=path, headers=headers)) or b""
        data += (self.http.send(h11.Data(data=body)) or b"") + (self.http.send(h11.EndOfMessage()) or b"")
        await self.stream.send_all(data)
        response: h11.Response | None = None
        received = b""
        while True:
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                self.http.receive_data(await self.stream.receive_some())
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                received += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response, received
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def wait_closed(self) -> None:
        """Until the server has closed its side (EOF)."""
        while await self.stream.receive_some():
            pass


def header(response: h11.Response, name: bytes) -> bytes | None:
    return next((value for key, value in response.headers if key == name), None)


async def refused(url: str) -> bool:
    """Whether a new TCP connection to `url` is refused (connect() fails)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = trio.socket.socket()
    try:
        await sock.connect((host, int(port)))
    except ConnectionRefusedError:
        return True
    finally:
        sock.close()
    return False


def holder(gateway: Served, client_port: int) -> int | None:
    """The pid of the gateway process holding the server side of the connection from `client_port`."""
    parent = psutil.Process(gateway.process.pid)
    for process in [parent, *parent.children()]:
        for connection in process.net_connections(kind="tcp"):
            if connection.raddr and connection.raddr.port == client_port and connection.laddr.port == gateway.port:
                return process.pid
    return None


async def kept_alive_on_every_process(gateway: Served, processes: int, each: int = 2) -> list[KeptAlive]:
    """Idle kept-alive connections, at least `each` held by every serving process (the kernel picks who accepts)."""
    connections: list[KeptAlive] = []
    held: dict[int, int] = {}
    while len(held) < processes or min(held.values()) < each:
        assert len(connections) < 64, f"the connections all went to the same processes: {held}"
        connection = await KeptAlive.open(gateway.url)
        connections.append(connection)
        response, _ = await connection.request("GET", "/health")  # accepted and served: now idle
        assert response.status_code == 200
        pid = holder(gateway, connection.port)
        assert pid is not None
        held[pid] = held.get(pid, 0) + 1
    return connections


SHUTTING_DOWN = orjson.dumps({"model": "text", "input": "hi"})
WORKERS = pytest.mark.parametrize("workers", [1, 2], ids=["one process", "two workers"])


def served_workers(tmp_path: Any, backend_url: str, workers: int, **env: str) -> contextlib.AbstractAsyncContextManager[Served]:
    """`served`, as one process or as that many workers."""
    return served(tmp_path, backend_url, *(["--workers", str(workers)] if workers > 1 else []), **env)


async def sigterm_and_wait_until_nothing_listens(gateway: Served, workers: int) -> float:
    """SIGTERM to the parent only (as docker sends it); once every process said it stopped
    listening, a new connection is refused at once.  Seconds from the signal to that refusal."""
    signalled = trio.current_time()
    gateway.process.send_signal(signal.SIGTERM)
    await gateway.until_logged("stopped listening", count=workers + (1 if workers > 1 else 0))
    with trio.fail_after(2):  # a connect() that hangs is the defect itself
        assert await refused(gateway.url)
    return trio.current_time() - signalled


@WORKERS
async def test_on_sigterm_new_connections_are_refused_kept_alive_ones_get_503_and_open_streams_finish(
    tmp_path, backend, workers
):
    with trio.fail_after(STARTUP_SECONDS * workers + 30):
        async with served_workers(tmp_path, backend.url, workers, SHUTDOWN_GRACE="30") as gateway:
            await gateway.until_logged("serving the Responses gateway on ", count=workers)
            async with trio.open_nursery() as nursery:
                stream = OpenStream()
                body = {"model": "text-then-wait", "input": "hi", "stream": True}
                nursery.start_soon(stream.run, gateway.url, "/v1/responses", body)
                await stream.first_delta.wait()
                kept = await kept_alive_on_every_process(gateway, workers)

                await sigterm_and_wait_until_nothing_listens(gateway, workers)
                # Every connection already open, on every process (one holds the stream, the
                # others have no work at all), answers its next request 503, then closes.
                for connection in kept[1:]:
                    response, answer = await connection.request("POST", "/v1/responses", SHUTTING_DOWN)
                    assert response.status_code == 503
                    assert orjson.loads(answer)["error"]["code"] == "server_shutting_down"
                    assert header(response, b"connection") == b"close"
                    await connection.wait_closed()
                ready, _ = await kept[0].request("GET", "/ready")
                assert ready.status_code == 503 and header(ready, b"connection") == b"close"
                await kept[0].wait_closed()

                backend.release.set()  # the backend answers within the grace: the stream finishes normally
                await stream.ended.wait()
            assert await gateway.process.wait() == 0
            log = await gateway.read_rest()
    assert stream.status == 200
    frames = stream.frames
    assert frames[-1] == "[DONE]" and frames[-2]["type"] == "response.completed"
    assert frames[-2]["response"]["output"][0]["content"][0]["text"] == "Hello, world"
    assert (await stored(tmp_path, frames[-2]["response"]["id"]))["status"] == "completed"
    assert "Traceback" not in log


@WORKERS
async def test_past_a_short_grace_a_stream_the_backend_never_finishes_ends_failed_and_is_stored(tmp_path, backend, workers):
    with trio.fail_after(STARTUP_SECONDS * workers + 30):
        async with served_workers(tmp_path, backend.url, workers, SHUTDOWN_GRACE="2") as gateway:
            await gateway.until_logged("serving the Responses gateway on ", count=workers)
            async with trio.open_nursery() as nursery:
                stream = OpenStream()
                body = {"model": "text-then-wait", "input": "hi", "stream": True}
                nursery.start_soon(stream.run, gateway.url, "/v1/responses", body)
                await stream.first_delta.wait()
                kept = await kept_alive_on_every_process(gateway, workers, each=1)
                await sigterm_and_wait_until_nothing_listens(gateway, workers)
                for connection in kept:  # within the linger, min(SHUTDOWN_GRACE, 5 s)
                    response, answer = await connection.request("POST", "/v1/responses", SHUTTING_DOWN)
                    assert response.status_code == 503
                    assert orjson.loads(answer)["error"]["code"] == "server_shutting_down"
                await stream.ended.wait()  # never released: the drain stops it
            assert await gateway.process.wait() == 0
            log = await gateway.read_rest()
    frames = stream.frames
    assert frames[-1] == "[DONE]" and [f["type"] for f in frames[-3:-1]] == ["error", "response.failed"]
    failed = frames[-2]["response"]
    assert failed["error"]["code"] == "server_shutting_down"
    kept_record = await stored(tmp_path, failed["id"])
    assert kept_record["status"] == "failed" and kept_record["error"]["code"] == "server_shutting_down"
    assert "Traceback" not in log


@WORKERS
async def test_with_nothing_open_a_sigterm_stops_the_gateway_without_waiting_out_the_linger(tmp_path, backend, workers):
    async with served_workers(tmp_path, backend.url, workers, SHUTDOWN_GRACE="30") as gateway:
        with trio.fail_after(STARTUP_SECONDS * workers):
            await gateway.until_logged("serving the Responses gateway on ", count=workers)
        gateway.process.send_signal(signal.SIGTERM)
        with trio.fail_after(_LINGER - 1):  # the linger (5 s here) holds open connections only
            assert await gateway.process.wait() == 0


async def test_past_the_grace_every_kind_of_open_work_ends_with_a_stored_terminal_event(tmp_path, backend):
    with trio.fail_after(STARTUP_SECONDS + 30):
        async with served(tmp_path, backend.url, SHUTDOWN_GRACE="0.5") as gateway, trio.open_nursery() as nursery:
            sse = OpenStream()
            nursery.start_soon(sse.run, gateway.url, "/v1/responses", {"model": "text-then-wait", "input": "a", "stream": True})
            chat = OpenStream()
            chat_body = {"model": "text-then-wait", "messages": [{"role": "user", "content": "b"}], "stream": True}
            nursery.start_soon(chat.run, gateway.url, "/v1/chat/completions", chat_body)
            json_answer: list[httpx2.Response] = []

            async def plain_request() -> None:
                async with httpx2.AsyncClient(timeout=60) as http:
                    json_answer.append(await http.post(gateway.url + "/v1/responses", json={"model": "text-then-wait", "input": "c"}))

            nursery.start_soon(plain_request)
            async with httpx2.AsyncClient(timeout=10) as http:
                background = (await http.post(
                    gateway.url + "/v1/responses", json={"model": "text-then-wait", "input": "d", "background": True}
                )).json()
                async with AsyncWebSocketClient(http).connect(gateway.url.replace("http", "ws") + "/v1/responses") as ws:
                    await ws.send_text(orjson.dumps({"type": "response.create", "model": "text-then-wait", "input": "e"}).decode())
                    ws_events = [orjson.loads(await ws.receive_text())]
                    while ws_events[-1]["type"] != "response.output_text.delta":
                        ws_events.append(orjson.loads(await ws.receive_text()))
                    await sse.first_delta.wait()
                    await chat.first_delta.wait()
                    await backend.wait_for(lambda: len(backend.chat_requests) == 5)  # all five in flight
                    gateway.process.send_signal(signal.SIGTERM)
                    await gateway.until_logged("draining: 5 ")
                    with pytest.raises(WebSocketDisconnect) as closed:
                        while True:
                            ws_events.append(orjson.loads(await ws.receive_text()))
            await sse.ended.wait()
            await chat.ended.wait()
            assert await gateway.process.wait() == 0
        log = await gateway.read_rest()

    # The SSE stream: what it had, then error + response.failed, then [DONE].
    frames = sse.frames
    assert frames[-1] == "[DONE]"
    assert [f["type"] for f in frames[-3:-1]] == ["error", "response.failed"]
    failed = frames[-2]["response"]
    assert failed["error"]["code"] == "server_shutting_down"
    for frame in frames[:-1]:
        validate_event(frame)
    assert (await stored(tmp_path, failed["id"]))["status"] == "failed"
    assert "Hello" in orjson.dumps(await stored(tmp_path, failed["id"])).decode()  # what was said is kept

    # The chat stream ends with an error chunk, then [DONE].
    chat_frames = chat.chunks
    assert chat_frames[-1] == "[DONE]" and chat_frames[-2]["error"]["code"] == "server_shutting_down"

    # The plain request is answered with the error, and its response is stored.
    (answer,) = json_answer
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "server_shutting_down"

    # The WebSocket turn got its terminal event, then a going-away close frame.
    assert ws_events[-1]["type"] == "response.failed"
    assert ws_events[-1]["response"]["error"]["code"] == "server_shutting_down"
    assert closed.value.code == 1001
    assert (await stored(tmp_path, ws_events[-1]["response"]["id"]))["status"] == "failed"

    # The background response ended failed, stored; a client that comes back can read why.
    kept = await stored(tmp_path, background["id"])
    assert kept["status"] == "failed" and kept["error"]["code"] == "server_shutting_down"
    assert "Traceback" not in log


async def test_with_several_workers_every_worker_drains_its_own_streams(tmp_path, backend):
    with trio.fail_after(STARTUP_SECONDS * 2 + 30):
        async with served(tmp_path, backend.url, "--workers", "2", SHUTDOWN_GRACE="0.5") as gateway:
            await gateway.until_logged("serving the Responses gateway on ")  # the second worker
            async with trio.open_nursery() as nursery:
                streams = [OpenStream() for _ in range(4)]
                for index, stream in enumerate(streams):
                    body = {"model": "text-then-wait", "input": f"s{index}", "stream": True}
                    nursery.start_soon(stream.run, gateway.url, "/v1/responses", body)
                for stream in streams:
                    await stream.first_delta.wait()
                gateway.process.send_signal(signal.SIGTERM)  # to the parent only, as docker sends it
            assert await gateway.process.wait() == 0
            log = await gateway.read_rest()
    for stream in streams:
        frames = stream.frames
        assert frames[-1] == "[DONE]" and frames[-2]["type"] == "response.failed"
        assert frames[-2]["response"]["error"]["code"] == "server_shutting_down"
        assert (await stored(tmp_path, frames[-2]["response"]["id"]))["status"] == "failed"
    assert "Traceback" not in log
