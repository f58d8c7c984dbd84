"""The gateway's own HTTP/1.1 server for plain connections: llhttp parsing, one task per connection.

hypercorn serves HTTP/1.1 through h11 (an event object per part of a message,
a task group per connection, a task spawned per request and another for the
connection's timer, every write through a lock and a shielded cancel scope):
on this machine that stack alone costs about 1 ms per streamed response and
~1 ms added to the first byte, more than the gateway's own work on a short
answer.  Plain HTTP/1.1 connections are served here instead, with what the
gateway needs and nothing more:

- one task per connection (owned by the serve loop's connection nursery): it
  reads and parses (httptools, Node's llhttp), runs the ASGI app for each
  request in turn in that same task, and writes with one write(2) per send;
- the app's `receive` reads the socket itself when it waits for more of the
  body or for the client to leave (the disconnect watch every stream runs);
  nothing else reads while a request runs;
- a response's head leaves with its first body bytes, chunked unless the app
  gave a length; sends inside `coalesced()` leave in one write;
- the serve loop's rules hold here as they do on hypercorn's connections
  (`gateway.server`): the request line and headers within
  `REQUEST_HEADER_TIMEOUT` of their first byte (else 408 and close), an idle
  connection closed after `KEEP_ALIVE_TIMEOUT` or at once when its client
  closes, a write that makes no progress for `CLIENT_STALL_TIMEOUT` resets the
  connection (the app sees `http.disconnect`), and once the drain has begun
  every response says `Connection: close` and idle connections are closed;
- a head larger than hypercorn's limit (`h11_max_incomplete_size`) is a 431
  (414 for the target alone), a method llhttp does not know a 501, any other
  message it refuses a 400, each in OpenAI's error shape, closing the connection;
  `Expect: 100-continue` is answered when the app first waits for the body.

A request for a WebSocket is served here too, on the same connection and
task (`gateway.http11_websocket`).  A connection that opens with HTTP/2's
preface, or whose request asks to switch to anything else (h2c), is handed
to hypercorn with the bytes read so far (`hand_off`): HTTP/2 stays hypercorn's.
"""

from __future__ import annotations

import collections
import contextlib
import http
import logging
import os
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

import httptools
import orjson
import trio

from .edge import is_failure
from .intake import HTTP11_EXTENSION
from .http11_websocket import WebSocketExchange, asks_for_websocket
from .transport.coalesce import current_batch

__all__ = ["PlainServer", "Replayed", "acquire"]

log = logging.getLogger("gateway")

Message = MutableMapping[str, Any]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

_READ = 65536
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_LINGER = 2.0  # seconds a closed connection waits for its client's end (reading what it still sends)
_LINGER_BYTES = 1 << 20
_SEND_ERROR_WITHIN = 1.0  # seconds; a 400/408/431 is a courtesy to a client that is already at fault
_RESET = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close() sends a reset
_NO_BODY_STATUS = frozenset({204, 304})
_STATUS_LINES = {status.value: b"HTTP/1.1 %d %b\r\n" % (status.value, status.phrase.encode("ascii")) for status in http.HTTPStatus}
_DISCONNECT: Message = {"type": "http.disconnect"}
_ASGI = {"spec_version": "2.1", "version": "3.0"}


async def acquire(lock: trio.Lock) -> None:
    """Take a lock without a pass through the scheduler when it is free (a write per event takes one)."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()


def _refusal(status: int, kind: str, code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


_REFUSALS = {
    400: _refusal(400, "invalid_request_error", "invalid_request", "The request is not valid HTTP, or frames its body two ways."),
    403: _refusal(403, "invalid_request_error", "forbidden", "The server refused this WebSocket."),
    408: _refusal(408, "invalid_request_error", "request_timeout", "The request's line and headers did not arrive in time."),
    414: _refusal(414, "invalid_request_error", "request_too_large", "The request's target is too long."),
    431: _refusal(431, "invalid_request_error", "request_too_large", "The request's headers are too large."),
    500: _refusal(500, "server_error", "server_error", "The server could not answer this request."),
    501: _refusal(501, "invalid_request_error", "method_not_supported", "The request's method is not one this server knows."),
}


def request_target(url: bytes) -> tuple[str, bytes, bytes]:
    """A request's target as ASGI has it: the decoded path, the raw path and the query string."""
    if not url.startswith(b"/"):
        parsed = httptools.parse_url(url)  # absolute form: GET http://host/path
        raw_path, query = parsed.path or b"/", parsed.query or b""
    else:
        raw_path, _, query = url.partition(b"?")
    return unquote(raw_path.decode("latin-1")), raw_path, query


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


class PlainServer:
    """What every plain connection of one worker shares: the app, the settings of the
    connection rules, and the idle connections that the end of the drain closes."""

    def __init__(
        self,
        app: ASGIApp,
        config: Any,
        state: dict[str, Any],
        *,
        header_timeout: float,
        stall_timeout: float,
        date: Callable[[], bytes],
        hand_off: Callable[[Replayed], Awaitable[None]],
    ) -> None:
        self.app = app
        self.config = config  # hypercorn's: keep_alive_timeout, keep_alive_max_requests (0 once draining), h11_max_incomplete_size
        self.state = state
        self.header_timeout = header_timeout
        self.stall_timeout = stall_timeout
        self.date = date
        self.hand_off = hand_off
        self.waiting: set[trio.CancelScope] = set()  # connections waiting for a request's head
        self.terminated = False

    def terminate(self) -> None:
        """The drain is over: connections waiting for a request close; running ones finish theirs."""
        self.terminated = True
        for scope in self.waiting:
            scope.cancel()

    async def serve(self, stream: trio.SocketStream) -> None:
        """Serve one connection until it closes (or is handed to hypercorn)."""
        connection = _Connection(self, stream)
        try:
            await connection.run()
            await connection.linger()
        finally:
            connection.close()


class Replayed(trio.abc.HalfCloseableStream):
    """A socket stream whose first reads return bytes already read from it (a connection
    handed to hypercorn part-way); hypercorn's connection writes through `.socket` as usual."""

    def __init__(self, stream: trio.SocketStream, prefix: bytes) -> None:
        self.stream = stream
        self.socket = stream.socket
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            await trio.lowlevel.checkpoint()
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()


class _Connection:
    """One plain connection: the parser's callbacks, the read and write, the loop over requests."""

    def __init__(self, server: PlainServer, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.sock = stream.socket
        self.fd = self.sock.fileno()
        self.parser = httptools.HttpRequestParser(self)
        self.ready: collections.deque[_Exchange | WebSocketExchange] = collections.deque()
        self.filling: _Exchange | None = None  # the request whose body the parser is reading
        self.began: float | None = None  # when the head being parsed had its first byte
        self.head_size = 0
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.refused: int | None = None  # a status to answer and close with (400, 414, 431)
        self.opening: bytes | None = b""  # the first bytes, until they cannot be HTTP/2's preface
        self.switching: bytes | None = None  # a request to switch protocols, and what followed: hypercorn's
        self.upgraded: WebSocketExchange | None = None  # a WebSocket served here: the bytes after its head are its frames
        self.read_over = False  # the client closed its side (or reset): nothing more comes
        self.write_over = False  # nothing more can be written
        self.closed = False
        self.send_lock = trio.Lock()
        self.read_lock = trio.Lock()
        self.requests = 0
        family = self.sock.family
        self.client = _address(family, self.sock.getpeername())
        self.local = _address(family, self.sock.getsockname())

    # --- the parser's callbacks (httptools calls them from `feed_data`) ----------------------

    def on_message_begin(self) -> None:
        self.began = trio.current_time()
        self.url = b""
        self.headers = []
        self.head_size = 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))
        self._count(len(name) + len(value) + 4)

    def _count(self, size: int) -> None:
        self.head_size += size
        if self.head_size > self.server.config.h11_max_incomplete_size and self.refused is None:
            self.refused = 431 if self.headers else 414

    def on_headers_complete(self) -> None:
        self.began = None
        if self.refused is not None:
            return
        parser = self.parser
        if parser.should_upgrade():
            if self.upgraded is None and asks_for_websocket(parser.get_method(), self.headers):
                target = request_target(self.url)
                self.upgraded = WebSocketExchange(self, target, self.headers, parser.get_http_version())
                self.ready.append(self.upgraded)
            else:
                self.switching = self._head_again()
            return
        exchange = _Exchange(
            self, parser.get_method().decode("ascii"), parser.get_http_version(), parser.should_keep_alive(), self.url, self.headers
        )
        self.filling = exchange
        self.ready.append(exchange)

    def on_body(self, body: bytes) -> None:
        exchange = self.filling
        if exchange is not None:
            exchange.body.append(bytes(body))

    def on_message_complete(self) -> None:
        exchange = self.filling
        if exchange is not None:
            exchange.request_complete = True
            self.filling = None

    def _head_again(self) -> bytes:
        """The request's line and headers as hypercorn will parse them again."""
        parser = self.parser
        lines = [b"%b %b HTTP/%b\r\n" % (parser.get_method(), self.url, parser.get_http_version().encode("ascii"))]
        lines.extend(b"%b: %b\r\n" % pair for pair in self.headers)
        lines.append(b"\r\n")
        return b"".join(lines)

    def take(self, data: bytes) -> None:
        """Bytes read from the client: HTTP/2's preface goes to hypercorn, anything else is parsed."""
        if self.opening is not None:
            data = self.opening + data
            if len(data) < len(_H2_PREFACE) and _H2_PREFACE.startswith(data):
                self.opening = data
                if self.began is None:
                    self.began = trio.current_time()
                return
            self.opening = None
            if data.startswith(_H2_PREFACE):
                self.switching = data
                return
        self.feed(data)

    def feed(self, data: bytes) -> None:
        if self.switching is not None:
            self.switching += data  # after a request to switch protocols: the new protocol's bytes
            return
        if self.upgraded is not None:
            self.upgraded.take(data)
            return
        if self.refused is not None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            if self.switching is not None:
                self.switching += data[int(upgrade.args[0]) :]
            elif self.upgraded is not None:
                self.upgraded.take(data[int(upgrade.args[0]) :])
        except httptools.HttpParserInvalidMethodError:
            # A method llhttp does not know (RFC 9110: not implemented); bytes that are no
            # method at all (a TLS hello on the plain port) are simply not HTTP.
            self.refused = 501 if data[:1].isupper() else 400
        except httptools.HttpParserError:
            self.refused = 400
        if self.refused is not None and self.filling is not None:
            self.filling.request_complete = True  # what was read of its body is all it gets
            self.filling = None

    # --- the connection's loop ----------------------------------------------------------------

    async def run(self) -> None:
        while True:
            if not self.ready:
                if self.switching is not None:
                    await self._hand_off(self.switching)
                    return
                if self.refused is not None:
                    await self.refuse(self.refused)
                    return
                if not await self._wait_for_request():
                    return
                continue
            exchange = self.ready.popleft()
            self.requests += 1
            if isinstance(exchange, WebSocketExchange):
                await exchange.run(self.server.app)  # the connection is the socket's until it closes
                return
            await self._run(exchange)
            if not exchange.keep_alive or self.write_over or self.read_over:
                return

    async def _wait_for_request(self) -> bool:
        """Read until a request's head is complete; False when the connection is to close."""
        server = self.server
        if server.terminated:
            return False
        if self.began is None:
            deadline = trio.current_time() + server.config.keep_alive_timeout
        else:
            deadline = self.began + server.header_timeout
        waiting = trio.CancelScope(deadline=deadline)
        server.waiting.add(waiting)
        try:
            with waiting:
                while not self.ready and self.switching is None and self.refused is None:
                    data = await self._recv()
                    if not data:
                        return False  # the client closed: idle, the connection closes now
                    self.take(data)
                    if self.began is not None and not self.ready:
                        waiting.deadline = self.began + server.header_timeout
        finally:
            server.waiting.discard(waiting)
        if waiting.cancelled_caught:
            if self.began is not None and not server.terminated:
                await self.refuse(408)
            return False
        return True

    async def _run(self, exchange: _Exchange) -> None:
        try:
            await self.server.app(exchange.scope(), exchange.receive, exchange.send)
        except BaseException as exc:
            if not is_failure(exc):
                raise
            log.error("the app failed on one request (%s); its connection is closed", type(exc).__name__)
            log.debug("app failure", exc_info=exc)
            exchange.keep_alive = False
        if not exchange.started:
            exchange.keep_alive = False
            if not self.write_over:
                await self.refuse(500)
        elif not exchange.complete:
            exchange.keep_alive = False  # the app ended part-way: the client sees an unfinished body
            if exchange.head is not None and not self.write_over:
                # Its status line and headers at least (they wait for the body's first bytes).
                with trio.move_on_after(_SEND_ERROR_WITHIN):
                    await self.write_now(exchange.head)
        elif not exchange.request_complete:
            exchange.keep_alive = False  # its body was left unread: not worth reading to find the next request

    async def _hand_off(self, data: bytes) -> None:
        self.closed = True  # hypercorn's now: never touched here again
        await self.server.hand_off(Replayed(self.stream, data))

    async def refuse(self, status: int) -> None:
        """Answer a request the app never saw (or one it left unanswered), in OpenAI's error shape, and close."""
        body = _REFUSALS.get(status) or _refusal(status, "server_error", "server_error", http.HTTPStatus(status).phrase)
        await self.answer_and_close(status, [(b"content-type", b"application/json")], body)

    async def answer_and_close(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole answer (a refusal, or an app's refusal of a request to switch protocols), then the close."""
        lines = [_status_line(status)]
        lines += [b"%b: %b\r\n" % (name, value) for name, value in headers if name.lower() not in (b"connection", b"date")]
        if not any(name.lower() == b"content-length" for name, _ in headers):
            lines.append(b"content-length: %d\r\n" % len(body))
        lines.append(b"connection: close\r\ndate: %b\r\n\r\n" % self.server.date())
        data = b"".join(lines) + body
        with trio.move_on_after(_SEND_ERROR_WITHIN):
            await self.write_now(data)
        with contextlib.suppress(OSError):
            if not self.closed:
                self.sock.shutdown(socket.SHUT_WR)  # a FIN after it, so the client reads it before the close

    # --- reading and writing ------------------------------------------------------------------

    async def _recv(self) -> bytes:
        """The next bytes, after a wait for them (a checkpoint every time); b"" once the client left."""
        while not (self.closed or self.read_over):
            try:
                await trio.lowlevel.wait_readable(self.sock)
            except trio.ClosedResourceError:
                break  # closed by this connection meanwhile (a reset after a stalled write)
            if self.closed:
                break
            try:
                data = os.read(self.fd, _READ)
            except BlockingIOError:
                continue
            except OSError:
                data = b""  # a reset
            if not data:
                self.read_over = True
            return data
        self.read_over = True
        return b""

    async def read_more(self) -> None:
        """One read while a request runs (its body, or the end of the client's side), fed to the parser."""
        lock = self.read_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            async with lock:  # another task read meanwhile: the caller looks again
                return
        try:
            data = await self._recv()
            if data:
                self.take(data)
        finally:
            lock.release()

    async def write(self, data: bytes) -> None:
        batch = current_batch()
        if batch is not None and batch.write in (None, self.write_now):
            batch.write = self.write_now  # held, and written with the batch's other messages
            batch.parts.append(data)
            return
        await self.write_now(data)

    async def write_now(self, data: bytes) -> None:
        # One write(2) straight to the socket when the kernel takes it whole (almost every write
        # of a stream).  What it does not take goes out shielded (half a write would corrupt the
        # response), bounded by progress: a slow reader is cut only when it stops reading.
        await trio.lowlevel.checkpoint_if_cancelled()
        lock = self.send_lock
        await acquire(lock)
        try:
            if self.write_over or self.closed:
                return
            try:
                sent = os.write(self.fd, data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._lost()
                return
            if sent == len(data):
                return
            stall = self.server.stall_timeout
            with trio.CancelScope(shield=True) as writing, memoryview(data) as view:
                while sent < len(view) and not self.closed:
                    writing.deadline = trio.current_time() + stall
                    try:
                        await trio.lowlevel.wait_writable(self.sock)
                        sent += os.write(self.fd, view[sent:])
                    except BlockingIOError:
                        continue
                    except (OSError, trio.ClosedResourceError):
                        self._lost()
                        return
            if writing.cancelled_caught:
                log.info("reset a connection whose client stopped reading (no progress for %g s)", stall)
                with contextlib.suppress(OSError):
                    self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                self._lost()
                self.close()  # the reset; a read waiting on the socket wakes
        finally:
            lock.release()

    async def linger(self) -> None:
        """Close our side first and let the client's last bytes drain: closed with unread bytes
        waiting, the kernel would reset the connection and could drop the end of the response."""
        if self.closed or self.write_over:
            return
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        self.write_over = True
        with trio.move_on_after(_LINGER):
            drained = 0
            while drained < _LINGER_BYTES:
                data = await self._recv()
                if not data:
                    return
                drained += len(data)

    def _lost(self) -> None:
        self.write_over = self.read_over = True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.read_over = self.write_over = True
        with contextlib.suppress(OSError):
            self.sock.close()


class _Exchange:
    """One request and its response: the ASGI scope, `receive` and `send`."""

    __slots__ = (
        "connection",
        "url",
        "headers",
        "method",
        "version",
        "keep_alive",
        "body",
        "request_complete",
        "body_said",
        "expect_continue",
        "started",
        "complete",
        "head",
        "chunked",
        "bodiless",
        "watch",
    )

    def __init__(
        self, connection: _Connection, method: str, version: str, keep_alive: bool, url: bytes, headers: list[tuple[bytes, bytes]]
    ) -> None:
        self.connection = connection
        self.url = url
        self.headers = headers
        self.method = method
        self.version = version
        self.keep_alive = keep_alive
        self.body: list[bytes] = []
        self.request_complete = False
        self.body_said = False  # the last `http.request` message went to the app
        self.expect_continue = False
        self.started = False
        self.complete = False
        self.head: bytes | None = None  # the response's head, until it leaves with the first body bytes
        self.chunked = False
        self.bodiless = method == "HEAD"
        self.watch: trio.CancelScope | None = None  # a `receive` waiting for the client's end, while it waits

    def scope(self) -> dict[str, Any]:
        connection = self.connection
        path, raw_path, query = request_target(self.url)
        headers = self.headers
        for name, value in headers:
            if name == b"expect" and value.lower() == b"100-continue":
                self.expect_continue = True
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": self.version,
            "method": self.method,
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": connection.server.config.root_path,
            "headers": headers,
            "client": connection.client,
            "server": connection.local,
            "state": connection.server.state.copy(),
            "extensions": {HTTP11_EXTENSION: {"body_ready": self.body_ready}},
        }

    def body_ready(self) -> bool:
        """The request's whole body has arrived and not yet gone to the app: its next `receive`
        returns it without waiting."""
        return self.request_complete and not self.body_said

    async def receive(self) -> Message:
        connection = self.connection
        while True:
            if not self.body_said and (self.body or self.request_complete):
                body = self.body
                data = body[0] if len(body) == 1 else b"".join(body)
                body.clear()
                if self.request_complete:
                    self.body_said = True
                # No checkpoint: bytes already read are handed over at once (each read before
                # them waited for the socket, so a flood of body still yields once per read).
                return {"type": "http.request", "body": data, "more_body": not self.body_said}
            if connection.read_over or self.complete:
                await trio.lowlevel.checkpoint()
                return _DISCONNECT
            if self.body_said and (connection.ready or connection.switching is not None or connection.refused is not None):
                # The next request has begun behind this one: it is not read past (pipelining);
                # the end of this response ends the wait.
                with trio.CancelScope() as self.watch:
                    await trio.sleep_forever()
                self.watch = None
                continue
            if self.expect_continue and not self.body_said:
                self.expect_continue = False
                await connection.write_now(b"HTTP/1.1 100 Continue\r\n\r\n")
            if not self.body_said:
                await connection.read_more()
                continue
            with trio.CancelScope() as self.watch:  # the response's end ends the wait (then: disconnect)
                await connection.read_more()
            self.watch = None

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            if self.complete:
                return
            if self.connection.write_over:
                # The client is gone: its disconnect watch (`receive`) ends the response;
                # until it does, a send waits rather than spin through what is left.
                with trio.move_on_after(self.connection.server.stall_timeout):
                    await trio.sleep_forever()
                return
            if not self.started:
                raise RuntimeError("a response body was sent before its start")
            data = message.get("body", b"")
            more = message.get("more_body", False)
            if self.bodiless:
                out = b""
            elif self.chunked:
                out = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
                if not more:
                    out += b"0\r\n\r\n"
            else:
                out = bytes(data)
            head = self.head
            if head is not None:
                out = head + out
            if out:
                await self.connection.write(out)  # (cancelled before it wrote, it wrote nothing)
            self.head = None
            if not more:
                self.complete = True
                if self.watch is not None:
                    self.watch.cancel()
        elif kind == "http.response.start":
            if self.started:
                raise RuntimeError("a response was started twice")
            self.started = True
            self.head = self._head(int(message["status"]), message.get("headers", ()))
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")

    def _head(self, status: int, headers: Any) -> bytes:
        connection = self.connection
        server = connection.server
        lines = [_status_line(status)]
        framed = False
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"content-length" or lowered == b"transfer-encoding":
                framed = True
            elif lowered == b"connection" and value.lower() == b"close":
                self.keep_alive = False
                continue  # said once, below
            elif lowered == b"date":
                continue
            lines.append(b"%b: %b\r\n" % (name, value))
        if status in _NO_BODY_STATUS or status < 200:
            self.bodiless = True
        elif not framed and not self.bodiless:
            if self.version == "1.1":
                self.chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
            else:
                self.keep_alive = False  # the body ends with the connection
        if connection.requests >= server.config.keep_alive_max_requests or server.terminated:
            self.keep_alive = False  # the drain has begun: every response says so
        lines.append(b"date: %b\r\n" % server.date())
        if not self.keep_alive:
            lines.append(b"connection: close\r\n\r\n")
        elif self.version == "1.0":
            lines.append(b"connection: keep-alive\r\n\r\n")
        else:
            lines.append(b"\r\n")
        return b"".join(lines)


def _address(family: int, address: Any) -> tuple[str, int] | None:
    if family in (socket.AF_INET, socket.AF_INET6):
        return (str(address[0]), int(address[1]))
    return None
