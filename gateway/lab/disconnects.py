"""How soon the gateway lets go once a client leaves, in milliseconds, on each transport.

A backend of this module's own (plain HTTP/1.1 on trio sockets) answers the
gateway's chat requests as told (tokens as fast as they are read, silence
before the first byte, one token then silence) and notes, by
`time.monotonic()`, the moment the gateway's connection to it closes: the
backend's own timestamp.  A client (raw HTTP/1.1, h2 with prior knowledge,
or a WebSocket) starts a stream, waits for the moment to leave, notes the
time and closes its socket.  The figure is the gap between the two; for an
MCP tool call, the gap to the moment the tool itself hears of its
cancellation (a stdio MCP server of this module's, which says so through a
FIFO, on the same clock).

The gateway runs as a process of its own (`gateway serve`), with
`HTTP1_SERVER=gateway` or `hypercorn`.  `gateway bench --only disconnects`
runs this and prints the rows; the tests (`tests/test_disconnects.py`) show
the same without a clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import orjson
import trio

__all__ = ["MCP_SERVER", "Client", "Figures", "Http1Client", "Http2Client", "WebSocketClient", "Watched", "measure"]

_TOKEN = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}\n\n'
_CALL = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":'
    b'[{"index":0,"id":"call_1","type":"function","function":{"name":"slow","arguments":"{\\"seconds\\": 60}"}}]},"finish_reason":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
    b"data: [DONE]\n\n"
)
_SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

MCP_SERVER = '''
import os, time, anyio
from mcp.server.mcpserver import MCPServer
mcp = MCPServer("watched")
out = None
def say(what):
    global out
    if out is None:
        out = os.open(os.environ["WATCH_FIFO"], os.O_WRONLY)
    os.write(out, f"{what} {time.monotonic():.6f}\\n".encode())
@mcp.tool()
async def slow(seconds: float) -> str:
    say("started")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        say("cancelled")
        raise
    return "slept"
mcp.run()
'''


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


@dataclass
class _Request:
    """One chat request the backend answers: when it arrived, and when its connection closed."""

    requested: trio.Event = field(default_factory=trio.Event)
    closed: trio.Event = field(default_factory=trio.Event)
    closed_at: float | None = None

    def gone(self, scope: trio.CancelScope) -> None:
        if self.closed_at is None:
            self.closed_at = time.monotonic()  # the backend's own timestamp
            self.closed.set()
        scope.cancel()


@dataclass
class _Backend:
    """The backend: what its next request gets, and (per request: a late wake-up of an earlier
    one's tasks never counts for a later one) when that request's connection closed."""

    behaviour: str = "tokens"  # tokens | silent | one-then-silent | tool-call
    request: _Request = field(default_factory=_Request)
    url: str = ""

    def reset(self, behaviour: str) -> _Request:
        self.behaviour = behaviour
        self.request = _Request()
        return self.request

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        task_status.started(self.url)
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some()
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")), 0)
                while len(buffer) < length:
                    data = await stream.receive_some()
                    if not data:
                        return
                    buffer += data
                body, buffer = buffer[:length], buffer[length:]
                if not head.startswith(b"POST /v1/chat/completions"):
                    await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 27\r\n\r\n" + b'{"object":"list","data":[]}')
                    continue
                if b'"role":"tool"' in body.replace(b" ", b""):
                    await stream.send_all(_SSE_HEAD + _chunk(_TOKEN + b"data: [DONE]\n\n") + b"0\r\n\r\n")
                    continue
                request = self.request
                request.requested.set()
                if self.behaviour == "tool-call":  # a whole answer: the connection serves on
                    await stream.send_all(_SSE_HEAD + _chunk(_CALL) + b"0\r\n\r\n")
                    continue
                await self._answer(stream, request, self.behaviour)
                return
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()

    async def _answer(self, stream: trio.SocketStream, request: _Request, behaviour: str) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._until_closed, stream, request, nursery.cancel_scope)
            try:
                if behaviour in ("tokens", "one-then-silent"):
                    await stream.send_all(_SSE_HEAD + _chunk(_TOKEN))
                while behaviour == "tokens":
                    await stream.send_all(_chunk(_TOKEN * 4))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                request.gone(nursery.cancel_scope)  # (a write found the connection reset)
                return
            await trio.sleep_forever()

    async def _until_closed(self, stream: trio.SocketStream, request: _Request, scope: trio.CancelScope) -> None:
        try:
            while await stream.receive_some():
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        request.gone(scope)


# --- clients ---------------------------------------------------------------------------------


class Client:
    """One request, raw: opened, read until a marker, then left (its socket closed, nothing said,
    as a client that is killed or gives up) at the moment `leave` returns."""

    received = b""
    stream: trio.SocketStream

    async def open(self, url: str, body: bytes, path: bytes = b"/v1/responses", method: bytes = b"POST") -> None:
        raise NotImplementedError

    async def feed(self) -> None:
        raise NotImplementedError

    async def read_until(self, marker: bytes) -> None:
        while marker not in self.received:
            await self.feed()

    async def leave(self) -> float:
        left_at = time.monotonic()
        await self.stream.aclose()
        return left_at

    async def _more(self) -> bytes:
        data = await self.stream.receive_some()
        if not data:
            raise trio.BrokenResourceError("the gateway closed the connection")
        return data


async def _connect(url: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").split(":")
    return await trio.open_tcp_stream(host, int(port))


class Http1Client(Client):
    async def open(self, url: str, body: bytes, path: bytes = b"/v1/responses", method: bytes = b"POST") -> None:
        self.stream = await _connect(url)
        head = b"%b %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        await self.stream.send_all(head % (method, path, len(body)) + body)

    async def feed(self) -> None:
        self.received += await self._more()


class Http2Client(Client):
    """HTTP/2 with prior knowledge (the gateway hands such a connection to hypercorn)."""

    async def open(self, url: str, body: bytes, path: bytes = b"/v1/responses", method: bytes = b"POST") -> None:
        import h2.config
        import h2.connection

        self.stream = await _connect(url)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        headers = [(b":method", method), (b":path", path), (b":scheme", b"http"), (b":authority", b"x"), (b"content-type", b"application/json")]
        self.h2.send_headers(1, headers, end_stream=not body)
        if body:
            self.h2.send_data(1, body, end_stream=True)
        await self.stream.send_all(self.h2.data_to_send())

    async def feed(self) -> None:
        import h2.events

        for event in self.h2.receive_data(await self._more()):
            if isinstance(event, h2.events.DataReceived):
                self.received += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        await self.stream.send_all(self.h2.data_to_send())


class WebSocketClient(Client):
    """WebSocket mode: the body (a create request) goes as one `response.create` frame."""

    async def open(self, url: str, body: bytes, path: bytes = b"/v1/responses", method: bytes = b"POST") -> None:
        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection, Message, Request

        self.stream = await _connect(url)
        self.ws = WSConnection(ConnectionType.CLIENT)
        await self.stream.send_all(self.ws.send(Request(host="x", target=path.decode())))
        accepted = False
        while not accepted:
            self.ws.receive_data(await self._more())
            accepted = any(isinstance(event, AcceptConnection) for event in self.ws.events())
        frame = {"type": "response.create", **{k: v for k, v in orjson.loads(body).items() if k != "stream"}}
        await self.stream.send_all(self.ws.send(Message(data=orjson.dumps(frame).decode())))

    async def feed(self) -> None:
        from wsproto.events import TextMessage

        self.ws.receive_data(await self._more())
        for event in self.ws.events():
            if isinstance(event, TextMessage):
                self.received += event.data.encode()


TRANSPORTS: dict[str, tuple[type[Client], str]] = {
    "gateway HTTP/1.1": (Http1Client, "gateway"),
    "hypercorn HTTP/1.1": (Http1Client, "hypercorn"),
    "HTTP/2 (hypercorn)": (Http2Client, "gateway"),
    "WebSocket": (WebSocketClient, "gateway"),
}
# what the backend does, what the client waits to read before it leaves, and whether it streams
PHASES: dict[str, tuple[str, bytes | None, bool]] = {
    "tokens flowing": ("tokens", b"tok ", True),
    "backend silent, no byte yet": ("silent", None, True),
    "backend silent after its first token": ("one-then-silent", b"tok ", True),
    "a JSON answer awaited": ("silent", None, False),
    "an MCP tool call running": ("tool-call", b"mcp_call.in_progress", True),
}


@dataclass
class Figures:
    """Milliseconds from the client's close to the gateway letting go, by transport and phase."""

    samples: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, transport: str, phase: str, ms: float) -> None:
        self.samples.setdefault((transport, phase), []).append(ms)

    def rows(self) -> list[tuple[str, str, float, float]]:
        """(transport, phase, median, max) for each measured pair."""
        return [(t, p, statistics.median(v), max(v)) for (t, p), v in self.samples.items()]


class Watched:
    """What the watched MCP server (`MCP_SERVER`) says through its FIFO: `next(word)` waits for
    its next line that begins so and returns the time on it (CLOCK_MONOTONIC)."""

    def __init__(self, path: str) -> None:
        os.mkfifo(path)
        # Opened for writing too (Linux allows it on a FIFO): with a writer always there, a read
        # waits for the server's lines instead of seeing the end of a FIFO nobody writes yet.
        self._stream = trio.lowlevel.FdStream(os.open(path, os.O_RDWR | os.O_NONBLOCK))
        self._buffer = b""
        self.lines: list[tuple[str, float]] = []

    async def next(self, word: str) -> float:
        while True:
            for index, (said, at) in enumerate(self.lines):
                if said == word:
                    del self.lines[index]
                    return at
            self._buffer += await self._stream.receive_some()
            *whole, self._buffer = self._buffer.split(b"\n")
            for line in whole:
                said, when = line.decode().split()
                self.lines.append((said, float(when)))


@contextlib.asynccontextmanager
async def _gateway_process(backend: str, server: str, mcp_config: str) -> AsyncIterator[str]:
    from .bench import _free_port, _process

    port = _free_port()
    env = {
        "OPENAI_BASE_URL_INTERNAL": backend,
        "HTTP1_SERVER": server,
        "LOG_LEVEL": "WARNING",
        "LOG_FILE_PATH": "",
        "STORE_BACKEND": "memory",
        "MCP_SERVERS_CONFIG_PATH": mcp_config,
        "STREAM_TIMEOUT": "300",
    }
    args = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    async with _process(args, url, env):
        yield url


async def measure(repeats: int = 20, progress: Callable[[str], None] = print) -> Figures:
    """Each transport and phase, `repeats` times (see the module docstring)."""
    figures = Figures()
    backend = _Backend()
    with tempfile.TemporaryDirectory(prefix="gateway-disconnects-") as folder:
        server_file = os.path.join(folder, "mcp_server.py")
        with open(server_file, "w") as file:
            file.write(MCP_SERVER)
        fifo = os.path.join(folder, "watch.fifo")
        watch = Watched(fifo)
        mcp_config = os.path.join(folder, "mcp.json")
        with open(mcp_config, "w") as file:
            json.dump({"mcpServers": {"watched": {"command": sys.executable, "args": [server_file], "env": {"WATCH_FIFO": fifo}}}}, file)
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
            for server in ("gateway", "hypercorn"):
                async with _gateway_process(backend.url, server, mcp_config) as url:
                    for transport, (client_kind, wanted) in TRANSPORTS.items():
                        if wanted != server:
                            continue
                        for phase, (behaviour, marker, streamed) in PHASES.items():
                            if transport == "WebSocket" and not streamed:
                                continue  # (a WebSocket turn is always streamed)
                            progress(f"  disconnects: {transport}, {phase}")
                            for _ in range(repeats):
                                ms = await _one(url, backend, watch, client_kind(), behaviour, marker, streamed)
                                figures.add(transport, phase, ms)
            nursery.cancel_scope.cancel()
    return figures


async def _one(url: str, backend: _Backend, watch: Watched, client: Client, behaviour: str, marker: bytes | None, streamed: bool) -> float:
    request = backend.reset(behaviour)
    with trio.fail_after(30):
        await client.open(url, orjson.dumps({"model": "m", "input": "hi", "stream": streamed}))
        if behaviour == "tool-call":
            await watch.next("started")
        else:
            await request.requested.wait()
        if marker is not None:
            await client.read_until(marker)
        left_at = await client.leave()
        if behaviour == "tool-call":
            done_at = await watch.next("cancelled")
        else:
            await request.closed.wait()
            assert request.closed_at is not None
            done_at = request.closed_at
    return (done_at - left_at) * 1000
