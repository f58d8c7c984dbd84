"""The floor: the least a Python relay on trio can spend per streamed event (`just bench`).

A prototype, not a gateway: it bounds from below what the gateway's hot path could cost on this
machine. It serves `POST /v1/responses` on raw trio sockets and, for each request, asks the
backend for a streamed chat completion on a kept-alive connection, then for every upstream read
writes one SSE frame per content chunk it finds (`response.output_text.delta`, the word copied
by byte search) and, at `[DONE]`, `response.completed`. It parses no JSON per chunk, keeps no
state, stores nothing, checks no key and runs no framework: what remains per event is what any
relay pays, the wake-up for the backend's bytes, one `recv`, a few byte searches, one `send`.
`bench --only floor` measures it on the paced load beside the gateway; the gap between the two
is what the gateway's layers cost.

`--server hypercorn` serves the same relay as a bare ASGI app under hypercorn's trio worker, the
server the gateway runs on (`POST` answered as SSE, a WebSocket connection as one message per
event for each `response.create` it receives): what the stack costs before any of the gateway's
own work, the floor for the targets that count per request and per WebSocket message.

`--server decoding` is the raw trio relay doing, per chunk, the least any translator must: the
backend's HTTP/1.1 body parsed (httptools, as the gateway parses it), its SSE split into events,
each event's JSON decoded (orjson) and its text written as a whole `response.output_text.delta`
event (every field the spec gives it, encoded by orjson), and at `[DONE]` a
`response.completed` carrying the whole text.  Still no state machine, store, keys or
framework: the floor for a gateway that reads the chunks it relays instead of searching bytes.

Knows nothing of the gateway's modules; expects the simulator's chunk shape.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httptools
import orjson
import trio

__all__ = ["main", "serve"]

_READ = 65536
_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_DELTA = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"%b"}\n\n'
_COMPLETED = b'event: response.completed\ndata: {"type":"response.completed","response":{"status":"completed"}}\n\n'
_CONTENT = b'"content":"'


class _Backend:
    """One kept-alive connection to the backend, for one client connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sock: socket.socket | None = None

    async def open(self) -> socket.socket:
        if self.sock is None:
            sock = trio.socket.socket()
            await sock.connect((self.host, self.port))
            self.sock = _plain(sock)
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _plain(sock: trio.socket.SocketType) -> socket.socket:
    """trio's socket as a plain non-blocking one (its calls not wrapped in trio's)."""
    plain = socket.socket(fileno=sock.detach())
    plain.setblocking(False)
    plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return plain


async def _recv(sock: socket.socket) -> bytes:
    """The next bytes: taken at once when waiting, else after one wait for readability."""
    while True:
        try:
            return sock.recv(_READ)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)


async def _send(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            sent = os.write(sock.fileno(), view)
        except BlockingIOError:
            sent = 0
        view = view[sent:]
        if view:
            await trio.lowlevel.wait_writable(sock)


async def _read_request(client: socket.socket, buf: bytes) -> tuple[bytes, bytes] | None:
    """The next request's body, and what followed it; None when the client left."""
    while b"\r\n\r\n" not in buf:
        data = await _recv(client)
        if not data:
            return None
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        data = await _recv(client)
        if not data:
            return None
        rest += data
    return rest[:length], rest[length:]


async def _relay(client: socket.socket, backend: _Backend, body: bytes, *, decode: bool = False) -> None:
    await _send(client, _HEAD)

    async def write(frames: bytes, done: bool) -> None:
        await _send(client, b"%x\r\n%b\r\n" % (len(frames), frames) + (b"0\r\n\r\n" if done else b""))

    await (_stream_decoded if decode else _stream)(backend, body, write)


async def _ask(backend: _Backend, body: bytes) -> socket.socket:
    """Send the backend a streamed chat completion for the request's model; its connection."""
    model = orjson.loads(body).get("model", "sim")
    payload = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True})
    upstream = await backend.open()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: %b:%d\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        % (backend.host.encode(), backend.port, len(payload))
    ) + payload
    await _send(upstream, request)
    return upstream


async def _stream(backend: _Backend, body: bytes, write: Callable[[bytes, bool], Awaitable[None]]) -> None:
    """Ask the backend for the request's model and hand `write` each upstream read's frames."""
    upstream = await _ask(backend, body)
    headed = False
    pending = b""
    while True:
        data = await _recv(upstream)
        if not data:
            backend.close()
            raise ConnectionError("the backend closed the connection")
        if not headed:
            pending += data
            if b"\r\n\r\n" not in pending:
                continue
            data = pending.partition(b"\r\n\r\n")[2]
            headed = True
        frames = []
        at = data.find(_CONTENT)
        while at >= 0:
            start = at + len(_CONTENT)
            end = data.find(b'"', start)
            if end > start:
                frames.append(_DELTA % data[start:end])
            at = data.find(_CONTENT, end)
        done = b"[DONE]" in data
        if done:
            frames.append(_COMPLETED)
        if frames:
            await write(b"".join(frames), done)
        if done:
            if not data.endswith(b"0\r\n\r\n"):  # the rest of the backend's body: its last chunk
                while not (await _recv(upstream)).endswith(b"0\r\n\r\n"):
                    pass
            return


class _Decoded:
    """One upstream answer read as a translator must read it (see `--server decoding`)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.rest = b""
        self.texts: list[str] = []
        self.seq = 0
        self.complete = False

    # httptools' callbacks
    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def frames(self, data: bytes) -> tuple[bytes, bool]:
        """The events `data` completes, as SSE; and whether the answer is over."""
        self.parser.feed_data(data)
        events = (self.rest + b"".join(self.body)).split(b"\n\n")
        self.body.clear()
        self.rest = events.pop()
        out = []
        done = False
        for event in events:
            if event[:6] != b"data: ":
                continue
            payload = event[6:]
            if payload == b"[DONE]":
                done = True
                text = "".join(self.texts)
                completed = {
                    "type": "response.completed",
                    "sequence_number": self.seq,
                    "response": {"object": "response", "status": "completed", "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]},
                }
                out.append(b"event: response.completed\ndata: " + orjson.dumps(completed) + b"\n\n")
                break
            text = orjson.loads(payload)["choices"][0]["delta"].get("content")
            if text:
                self.texts.append(text)
                delta = {
                    "type": "response.output_text.delta",
                    "sequence_number": self.seq,
                    "item_id": "msg_floor",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                }
                self.seq += 1
                out.append(b"event: response.output_text.delta\ndata: " + orjson.dumps(delta) + b"\n\n")
        return b"".join(out), done


async def _stream_decoded(backend: _Backend, body: bytes, write: Callable[[bytes, bool], Awaitable[None]]) -> None:
    """`_stream`, each chunk decoded and each event encoded whole (`_Decoded`)."""
    upstream = await _ask(backend, body)
    answer = _Decoded()
    done = False
    while not answer.complete:
        data = await _recv(upstream)
        if not data:
            backend.close()
            raise ConnectionError("the backend closed the connection")
        frames, over = answer.frames(data)
        if frames and not done:
            done = over
            await write(frames, done)


async def _serve_connection(client: socket.socket, host: str, port: int, decode: bool) -> None:
    backend = _Backend(host, port)
    buf = b""
    try:
        while True:
            got = await _read_request(client, buf)
            if got is None:
                return
            body, buf = got
            if not body:  # GET /health
                await _send(client, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                continue
            await _relay(client, backend, body, decode=decode)
    except OSError:
        return
    finally:
        backend.close()
        client.close()


async def serve(
    port: int, backend_url: str, decode: bool = False, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Relay on 127.0.0.1:`port` (0: any free one) to the simulator at `backend_url` (`decode`:
    each chunk decoded, `--server decoding`); tells `task_status` its own URL once it listens."""
    authority = backend_url.split("://", 1)[-1].split("/", 1)[0]
    host, _, backend_port = authority.rpartition(":")
    listener = trio.socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    await listener.bind(("127.0.0.1", port))
    listener.listen(4096)
    task_status.started(f"http://127.0.0.1:{listener.getsockname()[1]}")
    async with trio.open_nursery() as nursery:  # owned here: one task per client connection
        while True:
            client, _ = await listener.accept()
            nursery.start_soon(_serve_connection, _plain(client), host, int(backend_port), decode)


class AsgiFloor:
    """The same relay as a bare ASGI app: what hypercorn costs before the gateway's own work.

    Backend connections are kept alive in a free list (a request takes one, gives it back when
    its answer is whole).  A WebSocket connection answers each message with one message per
    upstream read's frames, as the gateway's WebSocket mode sends each event as a message."""

    def __init__(self, backend_url: str) -> None:
        authority = backend_url.split("://", 1)[-1].split("/", 1)[0]
        host, _, port = authority.rpartition(":")
        self.host, self.port = host, int(port)
        self.idle: list[_Backend] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        elif scope["type"] == "websocket":
            await self._websocket(receive, send)
        else:
            await self._http(scope, receive, send)

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})

        async def write(frames: bytes, done: bool) -> None:
            await send({"type": "http.response.body", "body": frames, "more_body": not done})

        await self._relay(body, write)

    async def _websocket(self, receive: Any, send: Any) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})

        async def write(frames: bytes, done: bool) -> None:
            for frame in frames.split(b"\n\n")[:-1]:  # one message per event, as the gateway sends them
                await send({"type": "websocket.send", "text": frame.partition(b"data: ")[2].decode()})

        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return
            await self._relay((message.get("text") or "").encode() or message.get("bytes") or b"{}", write)

    async def _relay(self, body: bytes, write: Callable[[bytes, bool], Awaitable[None]]) -> None:
        backend = self.idle.pop() if self.idle else _Backend(self.host, self.port)
        try:
            await _stream(backend, body, write)
        except BaseException:
            backend.close()
            raise
        self.idle.append(backend)


async def serve_hypercorn(port: int, backend_url: str, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """`AsgiFloor` under hypercorn's trio worker on 127.0.0.1:`port`; tells `task_status` its URL."""
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = 75  # as the gateway's
    config.backlog = 4096
    async with trio.open_nursery() as nursery:  # owned here: hypercorn's serve loop
        app: Any = AsgiFloor(backend_url)  # an ASGI 3 app; hypercorn's types name its own scope classes
        binds = await nursery.start(functools.partial(hypercorn_serve, app, config))
        task_status.started(binds[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.lab.floor", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True, help="the simulator's base URL, http://host:port")
    parser.add_argument(
        "--server",
        choices=["trio", "hypercorn", "decoding"],
        default="trio",
        help="raw trio sockets, hypercorn's trio worker, or raw trio sockets decoding each chunk",
    )
    args = parser.parse_args(argv)
    try:
        if args.server == "hypercorn":
            trio.run(serve_hypercorn, args.port, args.backend)
        else:
            trio.run(serve, args.port, args.backend, args.server == "decoding")
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
