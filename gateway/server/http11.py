"""The gateway's own HTTP/1.1 server for plain connections: one task per connection, the framing in `h1`.

hypercorn serves HTTP/1.1 through h11 (an event object per part of a message,
a task group per connection, a task spawned per request and another for the
connection's timer, every write through a lock and a shielded cancel scope):
that stack alone costs about a millisecond of CPU per streamed response.
Plain HTTP/1.1 connections are served here instead, with what the gateway
needs and nothing more.  This is the shell: it reads and writes; what the
bytes mean is `gateway.server.h1` (the request reader, the response framer).

- one task per connection (owned by the serve loop's connection nursery): it
  reads, has the reader parse, runs the ASGI app for each request in turn in
  that same task, and writes with one write(2) per send;
- a request reaches the app once its head is whole and checked; its body as
  it arrives; a body the reader refuses part-way is never complete to the app
  (`http.disconnect`), and the refusal (400, 501 …) is the one answer, if the
  app sent none;
- the app's `receive` reads the socket itself when it waits for more of the
  body; nothing else reads while a request runs, and nothing past the
  request (pipelined requests wait, unparsed, for their turn);
- a client that leaves is noticed at once, with no task and no read per
  response: the process's `Hangups` watches the sockets of the responses
  that asked (the `gateway.disconnect` extension, and every `receive` that
  waits for the client's end) and calls them back;
- a response's head leaves with its first body bytes; sends inside the
  extension's `hold()` leave in one write;
- the serve loop's rules hold here as they do on hypercorn's connections:
  the request line and headers within `REQUEST_HEADER_TIMEOUT` of their
  first byte (else 408 and close), an idle connection closed after
  `KEEP_ALIVE_TIMEOUT` or at once when its client closes, a write that makes
  no progress for `CLIENT_STALL_TIMEOUT` resets the connection (the app sees
  `http.disconnect`), and once the drain has begun every response says
  `Connection: close` and idle connections are closed;
- every refusal is in OpenAI's error shape and closes the connection.

A request for a WebSocket is served here too, on the same connection and
task (`gateway.server.websocket`).  A connection that opens with HTTP/2's
preface, or whose request asks to switch to anything else (h2c), is handed
on (`hand_off`, to hypercorn) with the bytes read so far.
"""

from __future__ import annotations

import collections
import contextlib
import http
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

import httptools
import orjson
import trio

from ..errors import is_failure
from . import ext, h1
from .h1 import END, InvalidResponse, Refusal, Request, ResponseFramer
from .hangups import Hangups
from .websocket import WebSocketExchange, asks_for_websocket

__all__ = ["DIRECT_WRITES", "PlainServer", "acquire", "request_target"]

log = logging.getLogger("gateway")

Message = MutableMapping[str, Any]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

_READ = 65536
_HELD = 4 * _READ  # bytes a client may send ahead of its running request before nothing more is read
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_LINGER = 2.0  # seconds a closed connection waits for its client's end (reading what it still sends)
_LINGER_BYTES = 1 << 20
_SEND_ERROR_WITHIN = 1.0  # seconds; a 400/408/431 is a courtesy to a client that is already at fault
_DROP_BYTES = 1 << 16  # of a body the app did not read, dropped to keep the connection (past it: closed)
_DROP_WITHIN = 1.0  # seconds that body may take to arrive
_RESET = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close() sends a reset
_DISCONNECT: Message = {"type": "http.disconnect"}
_ASGI = {"spec_version": "2.1", "version": "3.0"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
DIRECT_WRITES = sys.platform != "win32"  # os.write() on a socket is a POSIX thing (this server needs it)


async def acquire(lock: trio.Lock) -> None:
    """Take a lock without a pass through the scheduler when it is free (a write per event takes one)."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()


def _refusal(kind: str, code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


_REFUSALS = {  # the server's own (what the reader refuses says its own words: `h1.Refusal`)
    403: _refusal("invalid_request_error", "forbidden", "The server refused this WebSocket."),
    408: _refusal("invalid_request_error", "request_timeout", "The request's line and headers did not arrive in time."),
    500: _refusal("server_error", "server_error", "The server could not answer this request."),
}


def request_target(url: bytes) -> tuple[str, bytes, bytes]:
    """A request's target as ASGI has it: the decoded path, the raw path and the query string."""
    if not url.startswith(b"/"):
        try:
            parsed = httptools.parse_url(url)  # absolute form: GET http://host/path
        except httptools.HttpParserInvalidURLError:
            return "", b"", b""  # `*` (OPTIONS) and the like: no path
        raw_path, query = parsed.path or b"/", parsed.query or b""
    else:
        raw_path, _, query = url.partition(b"?")
        raw_path = raw_path.partition(b"#")[0]
    return unquote(raw_path.decode("latin-1")), raw_path, query


class PlainServer:
    """What every plain connection of one worker shares: the app, the settings of the
    connection rules, the hang-up watch, and the idle connections that the end of the drain closes."""

    def __init__(
        self,
        app: ASGIApp,
        config: Any,
        state: dict[str, Any],
        *,
        header_timeout: float,
        stall_timeout: float,
        date: Callable[[], bytes],
        hand_off: Callable[[trio.SocketStream, bytes], Awaitable[None]],
        hangups: Hangups | None,
        framing: h1.Framing | None = None,
    ) -> None:
        self.app = app
        self.framing = framing or h1.FRAMING  # (the load lab compares h11's: gateway.lab.h11framing)
        self.config = config  # keep_alive_timeout, keep_alive_max_requests (0 once draining), h11_max_incomplete_size, …
        self.state = state
        self.header_timeout = header_timeout
        self.stall_timeout = stall_timeout
        self.date = date
        self.hand_off = hand_off
        self.hangups = hangups
        self.waiting: set[trio.CancelScope] = set()  # connections waiting for a request's head
        self.terminated = False

    def terminate(self) -> None:
        """The drain is over: connections waiting for a request close; running ones finish theirs."""
        self.terminated = True
        for scope in self.waiting:
            scope.cancel()

    async def serve(self, stream: trio.SocketStream) -> None:
        """Serve one connection until it closes (or is handed on)."""
        connection = _Connection(self, stream)
        try:
            await connection.run()
            await connection.linger()
        finally:
            connection.close()


class _Connection:
    """One plain connection: the reads and writes, the loop over its requests."""

    def __init__(self, server: PlainServer, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.sock = stream.socket
        self.fd = self.sock.fileno()
        self.reader = server.framing.reader(int(server.config.h11_max_incomplete_size))
        self.events: collections.deque[Any] = collections.deque()  # what the reader said, not yet taken
        self.began: float | None = None  # when the head being read had its first byte
        self.opening: bytes | None = b""  # the first bytes, until they cannot be HTTP/2's preface
        self.preface: bytes | None = None  # HTTP/2 with prior knowledge: what was read, for hypercorn
        self.upgraded: WebSocketExchange | None = None  # a WebSocket served here: what is read are its frames
        self.exchange: _Exchange | None = None  # the request running
        self.read_over = False  # the client closed its side (or reset): nothing more comes
        self.write_over = False  # nothing more can be written
        self.closed = False
        self.watched = False  # the socket is in the hang-up watch
        self.batch: list[bytes] | None = None  # writes held until `hold()` ends
        self.send_lock = trio.Lock()
        self.read_lock = trio.Lock()
        self.requests = 0
        family = self.sock.family
        self.client = _address(family, self.sock.getpeername())
        self.local = _address(family, self.sock.getsockname())

    # --- the loop over requests -------------------------------------------------------------

    async def run(self) -> None:
        while True:
            request = await self._next_request()
            if request is None:
                return
            self.requests += 1
            if request.upgrade is not None:
                await self._switch(request)
                return
            exchange = self.exchange = _Exchange(self, request)
            try:
                await self._run(exchange)
                if exchange.unread() and not self.write_over and not self.read_over:
                    await self._drop_unread(exchange)
            finally:
                self.exchange = None
                self._unwatch()
            if not exchange.reusable() or self.write_over or self.read_over:
                return
            self.events.extend(self.reader.next_cycle())

    async def _next_request(self) -> Request | None:
        """The next request's head, once whole; None when the connection is to close (a
        refusal answered, the client gone, a timer run out, or the connection handed on)."""
        server = self.server
        while True:
            while self.events:
                event = self.events.popleft()
                if isinstance(event, Request):
                    self.began = None
                    return event
                if isinstance(event, Refusal):
                    await self.refuse_request(event)
                    return None
            if self.preface is not None:
                self.closed = True  # hypercorn's now: never touched here again
                await server.hand_off(self.stream, self.preface)
                return None
            if server.terminated:
                return None
            if self.began is None and self.reader.head_begun:
                self.began = trio.current_time()
            deadline = (
                self.began + server.header_timeout if self.began is not None else trio.current_time() + server.config.keep_alive_timeout
            )
            waiting = trio.CancelScope(deadline=deadline)
            server.waiting.add(waiting)
            try:
                with waiting:
                    data = await self._recv()
            finally:
                server.waiting.discard(waiting)
            if waiting.cancelled_caught:
                if self.began is not None and not server.terminated:
                    await self.refuse(408)
                return None
            if not data:
                return None  # the client closed: idle, the connection closes now
            self.take(data)

    async def _run(self, exchange: _Exchange) -> None:
        try:
            await self.server.app(exchange.scope(), exchange.receive, exchange.send)
        except BaseException as exc:
            if not is_failure(exc):
                raise
            log.error("the app failed on one request (%s); its connection is closed", type(exc).__name__)
            log.debug("app failure", exc_info=exc)
            exchange.keep_alive = False
        exchange.take_events()
        if exchange.replaced:
            return
        if not exchange.started:
            exchange.keep_alive = False
            if not self.write_over:
                # The one answer to a request the app left unanswered: the reader's refusal of
                # its body (the app saw the client leave), or a 500.
                if exchange.refused is not None:
                    await self.refuse_request(exchange.refused)
                else:
                    await self.refuse(500)
        elif not exchange.complete:
            exchange.keep_alive = False  # the app ended part-way: the client sees an unfinished body
            if exchange.head is not None and not self.write_over:
                # Its status line and headers at least (they wait for the body's first bytes).
                with trio.move_on_after(_SEND_ERROR_WITHIN):
                    await self.write_now(exchange.head)

    async def _drop_unread(self, exchange: _Exchange) -> None:
        """The rest of a body the app answered without reading (a GET that carried one), read
        and dropped, bounded in size and time, so that the connection carries the next request
        as the response said it would; past the bounds it closes."""
        dropped = 0
        with trio.move_on_after(_DROP_WITHIN):
            while True:
                exchange.take_events()
                dropped += sum(len(part) for part in exchange.body)
                exchange.body.clear()
                if exchange.request_complete or exchange.refused is not None or self.read_over or dropped > _DROP_BYTES:
                    return
                await self.read_more()

    async def _switch(self, request: Request) -> None:
        """A request to switch protocols: a WebSocket served here, anything else handed on."""
        if asks_for_websocket(request.method, request.headers):
            socket_ = self.upgraded = WebSocketExchange(self, request_target(request.target), request.headers, request.version)
            socket_.take(self.reader.trailing())
            await socket_.run(self.server.app)  # the connection is the socket's until it closes
            return
        self.closed = True  # hypercorn's now: never touched here again
        await self.server.hand_off(self.stream, request.head + self.reader.trailing())

    def take(self, data: bytes) -> None:
        """Bytes read from the client: HTTP/2's preface is kept for hypercorn, anything else parsed."""
        if self.opening is not None:
            data = self.opening + data
            if len(data) < len(_H2_PREFACE) and _H2_PREFACE.startswith(data):
                self.opening = data
                if self.began is None:
                    self.began = trio.current_time()
                return
            self.opening = None
            if data.startswith(_H2_PREFACE):
                self.preface = data
                return
        if self.upgraded is not None:
            self.upgraded.take(data)
            return
        self.events.extend(self.reader.feed(data))

    async def refuse_request(self, refusal: Refusal) -> None:
        """Answer what the reader refused, and close."""
        log.debug("refused a request on a plain connection: %s", refusal.reason)
        body = _refusal("invalid_request_error", refusal.code, refusal.message)
        await self.answer_and_close(refusal.status, [(b"content-type", b"application/json")], body)

    async def refuse(self, status: int) -> None:
        """Answer a request the app never saw (or one it left unanswered), in OpenAI's error shape, and close."""
        body = _REFUSALS.get(status) or _refusal("server_error", "server_error", http.HTTPStatus(status).phrase)
        await self.answer_and_close(status, [(b"content-type", b"application/json")], body)

    async def answer_and_close(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole answer (a refusal, or an app's refusal of a request to switch protocols), then the close."""
        try:
            framer = _whole(status, headers, body)
        except InvalidResponse as error:
            log.error("an answer could not be sent (%s); answered 500 instead", error)
            body = _REFUSALS[500]
            framer = _whole(500, [(b"content-type", b"application/json")], body)
        data = framer.head + b"connection: close\r\ndate: %b\r\n\r\n" % self.server.date() + framer.body(body, False)
        with trio.move_on_after(_SEND_ERROR_WITHIN):
            await self.write_now(data)
        with contextlib.suppress(OSError):
            if not self.closed:
                self.sock.shutdown(socket.SHUT_WR)  # a FIN after it, so the client reads it before the close
        self.write_over = True

    # --- the client leaving -------------------------------------------------------------

    def watch(self) -> bool:
        """Put the socket in the process's hang-up watch (once per request); False when there is none."""
        hangups = self.server.hangups
        if hangups is None:
            return False
        if not self.watched and not self.closed:
            hangups.watch(self.fd, self.hung_up)
            self.watched = True
        return True

    def _unwatch(self) -> None:
        if self.watched:
            self.watched = False
            hangups = self.server.hangups
            if hangups is not None:
                hangups.unwatch(self.fd)

    def hung_up(self) -> None:
        """The client closed its side or reset the connection (the hang-up watch says so)."""
        self.watched = False  # (the watch let go of the socket as it called)
        exchange = self.exchange
        if exchange is not None:
            exchange.client_left()

    def _lost(self) -> None:
        self.write_over = self.read_over = True
        exchange = self.exchange
        if exchange is not None:
            exchange.client_left()

    # --- reading and writing ------------------------------------------------------------

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
        """One read while a request runs (its body, or the end of the client's side), handed to the reader."""
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

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Writes inside leave together when it ends (what was written before a failure still
        goes; a cancelled writer writes nothing)."""
        if self.batch is not None:  # (inside another hold: that one writes)
            yield
            return
        parts: list[bytes] = []
        self.batch = parts
        try:
            yield
        finally:
            self.batch = None
            if parts:
                await self.write_now(b"".join(parts))

    async def write(self, data: bytes) -> None:
        batch = self.batch
        if batch is not None:
            batch.append(data)  # held, and written with the batch's other messages
            return
        await self.write_now(data)

    async def write_now(self, data: bytes) -> None:
        # One write(2) straight to the socket when the kernel takes it whole (almost every write
        # of a stream), without the lock: no other write is waiting (the lock is free), and none
        # can begin before this one returns, as it never passes through the scheduler.  What the
        # kernel does not take goes out under the lock, shielded (half a write would corrupt the
        # response), bounded by progress: a slow reader is cut only when it stops reading.
        await trio.lowlevel.checkpoint_if_cancelled()
        lock = self.send_lock
        if lock.locked():
            await lock.acquire()
            sent = 0
        else:
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
            lock.acquire_nowait()  # (free: nothing ran since it was looked at)
        try:
            if self.write_over or self.closed:
                return
            if not sent:
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
        if self.closed:
            return
        if not self.write_over:
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

    def close(self) -> None:
        if self.closed:
            return
        self._unwatch()
        self.closed = True
        self.read_over = self.write_over = True
        with contextlib.suppress(OSError):
            self.sock.close()


class _Exchange:
    """One request and its response: the ASGI scope, `receive` and `send`."""

    __slots__ = (
        "connection",
        "request",
        "keep_alive",
        "bodiless",
        "body",
        "request_complete",
        "body_said",
        "refused",
        "expect_continue",
        "started",
        "complete",
        "replaced",
        "head",
        "framer",
        "watch",
        "left",
        "on_leave",
    )

    def __init__(self, connection: _Connection, request: Request) -> None:
        self.connection = connection
        self.request = request
        self.keep_alive = request.keep_alive
        self.bodiless = request.method == "HEAD"
        self.body: list[bytes] = []
        self.request_complete = False  # the reader said the body's END
        self.body_said = False  # the last `http.request` message went to the app
        self.refused: Refusal | None = None  # the reader refused the body part-way
        self.expect_continue = request.expect_continue
        self.started = False
        self.complete = False
        self.replaced = False  # the app's response could not be framed: a 500 went instead
        self.head: bytes | None = None  # the response's head, until it leaves with the first body bytes
        self.framer: Any = None  # the response's framer (`h1.ResponseFramer`), once it started
        self.watch: trio.CancelScope | None = None  # a `receive` waiting for the client's end, while it waits
        self.left = False  # the client is gone (hung up, reset, or a write failed)
        self.on_leave: list[Callable[[], None]] | None = None  # what the app asked to be called then

    def scope(self) -> dict[str, Any]:
        connection = self.connection
        request = self.request
        path, raw_path, query = request_target(request.target)
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": request.version,
            "method": request.method,
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": connection.server.config.root_path,
            "headers": request.headers,
            "client": connection.client,
            "server": connection.local,
            "state": connection.server.state.copy(),
            "extensions": self._extensions(),
        }

    def _extensions(self) -> dict[str, Any]:
        extensions: dict[str, Any] = {
            ext.HTTP11: {"body_ready": self.body_ready},
            ext.BATCH: {"hold": self.connection.hold},
            ext.STREAM: {"write": self.write_piece},
        }
        if self.connection.server.hangups is not None:
            extensions[ext.DISCONNECT] = {"watch": self.watch_leaving}
        return extensions

    def unread(self) -> bool:
        """Answered whole, to be kept alive, while the request's body has not all arrived."""
        return self.keep_alive and self.complete and not self.request_complete and not self.left and self.refused is None

    def reusable(self) -> bool:
        """The connection may carry another request after this one."""
        return self.keep_alive and self.complete and self.request_complete and not self.left and self.refused is None

    def take_events(self) -> None:
        """What the reader said of this request's body since the last look."""
        events = self.connection.events
        while events:
            event = events[0]
            if isinstance(event, bytes):
                self.body.append(event)
            elif event is END:
                self.request_complete = True
            elif isinstance(event, Refusal):
                self.refused = event  # (what was read of the body goes nowhere)
                self.body.clear()
            else:
                return  # (the reader pauses after a body's end: never another request's head)
            events.popleft()

    def body_ready(self) -> bool:
        """The request's whole body has arrived and not yet gone to the app: its next `receive`
        returns it without waiting."""
        if self.connection.events:
            self.take_events()
        return self.request_complete and not self.body_said

    # --- what the app hears -----------------------------------------------------------------

    async def receive(self) -> Message:
        connection = self.connection
        while True:
            if connection.events:
                self.take_events()
            if self.refused is None and not self.body_said and (self.body or self.request_complete):
                body = self.body
                data = body[0] if len(body) == 1 else b"".join(body)
                body.clear()
                if self.request_complete:
                    self.body_said = True
                # No checkpoint: bytes already read are handed over at once (each read before
                # them waited for the socket, so a flood of body still yields once per read).
                return {"type": "http.request", "body": data, "more_body": not self.body_said}
            if self.refused is not None or connection.read_over or self.left or self.complete:
                await trio.lowlevel.checkpoint()
                return _DISCONNECT
            if not self.body_said:
                if self.expect_continue:
                    self.expect_continue = False
                    await connection.write_now(_CONTINUE)
                await connection.read_more()
                continue
            # The body is the app's: what is left to hear is the client leaving (or the
            # response's end).  The hang-up watch tells without a read; without one, a read
            # sees the end of the client's side, unless the client sent far ahead (pipelining).
            with trio.CancelScope() as self.watch:
                if connection.watch() or connection.reader.held > _HELD:
                    await trio.sleep_forever()
                else:
                    await connection.read_more()
            self.watch = None

    def watch_leaving(self, callback: Callable[[], None]) -> Callable[[], None]:
        """The `gateway.disconnect` extension: `callback()` once the client is gone (at once if it
        is); returns what forgets it.  (Offered only where the process has a hang-up watch.)"""
        self.connection.watch()
        if self.left or self.connection.read_over:
            callback()
            return _nothing
        callbacks = self.on_leave
        if callbacks is None:
            callbacks = self.on_leave = []
        callbacks.append(callback)

        def forget() -> None:
            with contextlib.suppress(ValueError):
                callbacks.remove(callback)

        return forget

    def client_left(self) -> None:
        if self.left:
            return
        self.left = True
        self.keep_alive = False
        if self.watch is not None:
            self.watch.cancel()
        callbacks, self.on_leave = self.on_leave, None
        for callback in callbacks or ():
            callback()

    # --- what the app says ------------------------------------------------------------------

    async def write_piece(self, data: bytes) -> None:
        """The `gateway.stream` extension: `data` as the body's next chunk, as `send` would frame
        and write it for `http.response.body` with `more_body`, with no message to look into."""
        framer = self.framer
        connection = self.connection
        if self.head is None and data and framer is not None and framer.plain_chunks and not (self.complete or connection.write_over):
            await connection.write(b"%x\r\n%b\r\n" % (len(data), data))
            return
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            if self.complete:
                return
            connection = self.connection
            if connection.write_over:
                # The client is gone: the app has heard (or hears) of it; until it ends the
                # response, a send waits rather than spin through what is left.
                with trio.move_on_after(connection.server.stall_timeout):
                    await trio.sleep_forever()
                return
            framer = self.framer
            if framer is None:
                raise RuntimeError("a response body was sent before its start")
            more = message.get("more_body", False)
            if framer.plain_chunks:  # chunked with nothing to account: framed here, on every event's path
                data = message.get("body", b"")
                out = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
                if not more:
                    out += b"0\r\n\r\n"
            else:
                out = framer.body(message.get("body", b""), more)
            head = self.head
            if head is not None:
                out = head + out
            if out:
                await connection.write(out)  # (cancelled before it wrote, it wrote nothing)
            self.head = None
            if not more:
                self.complete = True
                if framer.overrun or framer.short:
                    self.keep_alive = False
                    log.warning(
                        "the app sent %s than its Content-Length said on %s %s; the connection is closed",
                        "more" if framer.overrun else "less",
                        self.request.method,
                        self.request.target[:200].decode("latin-1"),
                    )
                if self.watch is not None:
                    self.watch.cancel()
            elif framer.overrun:
                self.keep_alive = False
        elif kind == "http.response.start":
            if self.started:
                raise RuntimeError("a response was started twice")
            self.started = True
            connection = self.connection
            server = connection.server
            keep_alive = self.keep_alive and connection.requests < server.config.keep_alive_max_requests and not server.terminated
            try:
                framer = self.framer = server.framing.framer(
                    connection.reader,
                    message["status"],
                    message.get("headers", ()),
                    version=self.request.version,
                    head_request=self.bodiless,
                    keep_alive=keep_alive,
                )
            except InvalidResponse as error:
                log.error("the app's response to %s could not be sent (%s); answered 500 instead", self.request.method, error)
                self.replaced = self.complete = True
                self.keep_alive = False
                await connection.refuse(500)
                return
            self.keep_alive = framer.keep_alive
            if not framer.keep_alive:
                end = b"connection: close\r\n\r\n"
            elif self.request.version == "1.0":
                end = b"connection: keep-alive\r\n\r\n"
            else:
                end = b"\r\n"
            self.head = framer.head + b"date: %b\r\n" % server.date() + end
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")


def _whole(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> ResponseFramer:
    """A response whose body is all there, the connection's last.

    Raises:
        InvalidResponse: its status or headers cannot be sent."""
    framed = [(name, value) for name, value in headers if name.lower() not in (b"content-length", b"transfer-encoding")]
    framed.append((b"content-length", b"%d" % len(body)))
    return ResponseFramer(status, framed, version="1.1", head_request=False, keep_alive=False)


def _nothing() -> None:
    pass


def _address(family: int, address: Any) -> tuple[str, int] | None:
    if family in (socket.AF_INET, socket.AF_INET6):
        return (str(address[0]), int(address[1]))
    return None

