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

Knows nothing of the gateway's modules; expects the simulator's chunk shape.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

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


async def _relay(client: socket.socket, backend: _Backend, body: bytes) -> None:
    model = orjson.loads(body).get("model", "sim")
    payload = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True})
    upstream = await backend.open()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: %b:%d\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        % (backend.host.encode(), backend.port, len(payload))
    ) + payload
    await _send(upstream, request)
    await _send(client, _HEAD)
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
            out = b"".join(frames)
            await _send(client, b"%x\r\n%b\r\n" % (len(out), out) + (b"0\r\n\r\n" if done else b""))
        if done:
            if not data.endswith(b"0\r\n\r\n"):  # the rest of the backend's body: its last chunk
                while not (await _recv(upstream)).endswith(b"0\r\n\r\n"):
                    pass
            return


async def _serve_connection(client: socket.socket, host: str, port: int) -> None:
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
            await _relay(client, backend, body)
    except OSError:
        return
    finally:
        backend.close()
        client.close()


async def serve(port: int, backend_url: str, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Relay on 127.0.0.1:`port` (0: any free one) to the simulator at `backend_url`; tells
    `task_status` its own URL once it listens."""
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
            nursery.start_soon(_serve_connection, _plain(client), host, int(backend_port))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.lab.floor", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True, help="the simulator's base URL, http://host:port")
    args = parser.parse_args(argv)
    try:
        trio.run(serve, args.port, args.backend)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
