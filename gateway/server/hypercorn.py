"""Every use of hypercorn's internals, in one place: HTTP/2, and HTTP/1.1 with `HTTP1_SERVER=hypercorn`.

hypercorn serves what the gateway's own connections do not (HTTP/2, h2c, and
everything when asked to).  Its public surface (`Config`, the lifespan, the
TCP server run per connection) is used as it is; a few of its internals are
replaced, for rules hypercorn has no setting for:

- `TCPServer._read_data`: the header clock starts with a request's first
  byte, and a client that closed while idle is let go at once (hypercorn
  kept its socket in CLOSE-WAIT until the keep-alive timer ran out);
- `TCPServer.protocol_send`: one write(2) when the kernel takes it whole,
  a stalled write bounded by `CLIENT_STALL_TIMEOUT` (a reset), and held
  writes (`gateway.batch`) written together;
- `TCPServer.idle_task` (a `TrioSingleTask`, started through
  `TaskGroup._nursery`): one keep-alive timer per connection whose deadline
  moves, not a task per idle spell; it answers 408 through the connection's
  `h11.Connection` (`H11Protocol.connection`) and closes with
  `_initiate_server_close`;
- `Lifespan.asgi_send`: a start-up that failed is told from one that did not.

These are pinned to the hypercorn versions they were read against
(`pyproject.toml`); `tests/test_server_hypercorn.py` fails when any of them
changes shape (`TOUCHED` names each, with the digest of its source).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from wsgiref.handlers import format_date_time

import h11
import trio
from hypercorn.config import Config, Sockets
from hypercorn.events import Closed, RawData
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import TrioSingleTask, WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import LifespanFailureError, ShutdownError, raise_shutdown, repr_socket_addr, wrap_app

from ..config import Settings
from ..errors import is_failure
from . import ext
from .http11 import DIRECT_WRITES, acquire

__all__ = [
    "TOUCHED",
    "Config",
    "ConnectionState",
    "GatewayConfig",
    "LifespanFailureError",
    "ShutdownError",
    "Sockets",
    "StartedLifespan",
    "WorkerContext",
    "connection_handler",
    "hypercorn_config",
    "raise_shutdown",
    "repr_socket_addr",
    "startup_message",
    "wrap_app",
]

log = logging.getLogger("gateway")

# The internals above, as "module:qualified name" -> the digest of their source in the versions
# read (hypercorn 0.18).  A new hypercorn that changes one fails the test named above: read the
# new source, check what this module assumes of it, and record the new digest.
TOUCHED = {
    "hypercorn.trio.tcp_server:TCPServer.__init__": "4c1d42457bc1",  # idle_task, send_lock, stream, protocol
    "hypercorn.trio.tcp_server:TCPServer.run": "fd34b021d1a8",  # calls idle_task.restart, then _read_data
    "hypercorn.trio.tcp_server:TCPServer.protocol_send": "225856426bff",  # RawData, Closed, Updated(idle)
    "hypercorn.trio.tcp_server:TCPServer._read_data": "7ca747d922c6",
    "hypercorn.trio.tcp_server:TCPServer._initiate_server_close": "7c1b548a65ad",
    "hypercorn.trio.worker_context:TrioSingleTask.restart": "0170ab8e4418",
    "hypercorn.trio.worker_context:TrioSingleTask.stop": "044ad384dfd2",
    "hypercorn.trio.task_group:TaskGroup.__aenter__": "38047eb0284c",  # _nursery
    "hypercorn.trio.lifespan:Lifespan.asgi_send": "40bd02438cd8",
    "hypercorn.protocol:ProtocolWrapper.__init__": "df25e181b9e2",  # .protocol: H11Protocol or H2Protocol
    "hypercorn.protocol:ProtocolWrapper.handle": "b03e2962872c",  # h2c and prior knowledge switch .protocol
    "hypercorn.protocol.h11:H11Protocol.__init__": "c7c989fd6a35",  # .connection: the h11.Connection
    "hypercorn.config:Config.response_headers": "5a637c3d4818",
}

_SEND_408_WITHIN = 1.0  # seconds; the 408 is a courtesy to a client that is already too slow
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset and frees the buffers


class GatewayConfig(Config):
    """hypercorn's configuration, with the `date` header formatted once a second rather than
    once a response (hypercorn formats it with `email.utils` each time)."""

    _date_second = -1
    _date = b""

    def date(self) -> bytes:
        """The `date` header's value now."""
        second = int(time.time())
        if second != self._date_second:
            self._date, self._date_second = format_date_time(second).encode("ascii"), second
        return self._date

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        if self.alt_svc_headers or self._quic_addresses or not self.include_date_header:
            return super().response_headers(protocol)
        headers = [(b"date", self.date())]
        if self.include_server_header:
            headers.append((b"server", b"hypercorn-" + protocol.encode("ascii")))
        return headers


def hypercorn_config(settings: Settings, *, host: str | None = None, port: int | None = None) -> GatewayConfig:
    """The settings as hypercorn's configuration (what the serve loop and the workers share)."""
    config = GatewayConfig()
    host = settings.api_adapter_host if host is None else host
    port = settings.api_adapter_port if port is None else port
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.worker_class = "trio"
    config.accesslog = None  # the app logs one line per response itself
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = settings.keep_alive_timeout
    config.graceful_timeout = 5
    config.backlog = 4096
    return config


class StartedLifespan(Lifespan):
    """hypercorn's lifespan, telling a startup that completed from one that failed."""

    started = False

    async def asgi_send(self, message: Any) -> None:
        if message["type"] == "lifespan.startup.complete":
            self.started = True
        await super().asgi_send(message)


def startup_message(error: BaseException) -> str:
    """The app's own reason, out of hypercorn's wording ("Lifespan failure in startup. '<reason>'")."""
    text = str(error)
    return text.split(". ", 1)[1].strip("'") if ". " in text else text


# --- connections -----------------------------------------------------------------------------


class _Held:
    """The writes a sender holds inside `hold()`, and the connection they go to."""

    __slots__ = ("parts", "write")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.write: Callable[[bytes], Awaitable[None]] | None = None


_HELD: contextvars.ContextVar[_Held | None] = contextvars.ContextVar("gateway_hypercorn_held", default=None)


@contextlib.asynccontextmanager
async def _hold() -> AsyncIterator[None]:
    """`gateway.batch` on hypercorn's HTTP/1.1: the sending task's writes are held and leave together."""
    if _HELD.get() is not None:
        yield
        return
    held = _Held()
    token = _HELD.set(held)
    try:
        yield
    finally:
        _HELD.reset(token)
        if held.parts and held.write is not None:
            await held.write(b"".join(held.parts))


def _with_batch(app: Any) -> Any:
    """The app, offered `gateway.batch` in every scope hypercorn gives it."""

    async def batched(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") in ("http", "websocket"):
            extensions = scope.get("extensions")
            if extensions is None:
                extensions = scope["extensions"] = {}
            extensions[ext.BATCH] = {"hold": _hold}
        await app(scope, receive, send)

    return batched


def connection_handler(
    app: Any,
    config: Config,
    context: WorkerContext,
    lifespan_state: dict[str, Any],
    *,
    header_timeout: float,
    stall_timeout: float,
    opened: Callable[[], Any],
) -> tuple[Callable[[trio.SocketStream], Awaitable[None]], Callable[[trio.SocketStream, bytes], Awaitable[None]]]:
    """What serves a connection with hypercorn (counted by `opened`, a context manager), and
    what takes over a plain connection part-way (its bytes read so far, replayed)."""
    wrapped = wrap_app(_with_batch(app), config.wsgi_max_body_size, "asgi")

    async def serve(stream: trio.SocketStream) -> None:
        with opened():
            await _GatewayTCPServer(
                wrapped, config, context, ConnectionState(lifespan_state.copy()), stream,
                header_timeout=header_timeout, stall_timeout=stall_timeout,
            ).run()

    async def take_over(stream: trio.SocketStream, prefix: bytes) -> None:
        # (counted already, as the plain connection it was)
        await _GatewayTCPServer(
            wrapped, config, context, ConnectionState(lifespan_state.copy()), _Replayed(stream, prefix),
            header_timeout=header_timeout, stall_timeout=stall_timeout,
        ).run()

    return serve, take_over


class _Replayed(trio.abc.HalfCloseableStream):
    """A socket stream whose first reads return bytes already read from it (a connection
    handed over part-way); hypercorn's connection writes through `.socket` as usual."""

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


class _GatewayTCPServer(TCPServer):
    """hypercorn's connection handler, with a deadline for each request's line and headers,
    a bound on writes that make no progress, and no wait once the client has closed.

    One timer per connection: the keep-alive timer (`KEEP_ALIVE_TIMEOUT`),
    running while the connection is idle.  hypercorn starts a task for it each time the
    connection falls idle and cancels that task when a request's headers are
    complete (a task spawned, started and cancelled per request); here one
    task lives as long as the connection and only its deadline moves (no
    deadline while a request runs).  The first byte of a request cuts the
    timer short to `header_timeout` from that byte; when it fires the client
    gets a 408 (if h11 can still send one) and the connection is closed.  The
    end of the client's side (EOF, a reset) fires it at once.  The 408 and the
    header clock are HTTP/1.1's: on h2c the timer is the keep-alive one only.
    """

    def __init__(
        self,
        app: Any,
        config: Config,
        context: Any,
        state: Any,
        stream: Any,
        *,
        header_timeout: float,
        stall_timeout: float,
    ) -> None:
        super().__init__(app, config, context, state, stream)
        self._header_timeout = header_timeout
        self._stall_timeout = stall_timeout
        self.idle_task = _KeepAliveTimer(self)  # hypercorn's idle task, replaced
        self._timer: trio.CancelScope | None = None  # the keep-alive task's scope, while that task runs
        self._idle_timer: trio.CancelScope | None = None  # the same scope while the connection is idle, else None
        self._headers_due: float | None = None  # set once a request has begun while the timer runs
        self._read_over = False  # the client closed or reset the connection (or it timed out): nothing more comes

    async def run(self) -> None:
        # hypercorn lets a failure of its own protocol code on one connection
        # (an h11 LocalProtocolError, say) escape into the nursery that serves
        # every connection, ending the process.  It ends this connection only.
        try:
            await super().run()
        except BaseException as exc:
            if not is_failure(exc):
                raise
            log.error("the HTTP server failed on one connection (%s); it is closed", type(exc).__name__)
            log.debug("connection failure", exc_info=exc)

    async def protocol_send(self, event: Any) -> None:
        if not (isinstance(event, RawData) and isinstance(self.stream, (trio.SocketStream, _Replayed))):
            await super().protocol_send(event)
            return
        held = _HELD.get()
        if held is not None and held.write in (None, self._write_raw) and self._one_stream():
            # Held by a sender inside `hold()`, and written with the others when its block ends.
            # HTTP/1.1 only: on HTTP/2 the bytes may carry other streams' frames, whose order
            # matters (HPACK).
            held.write = self._write_raw
            held.parts.append(event.data)
            return
        await self._write_raw(event.data)

    async def _write_raw(self, data: bytes) -> None:
        # hypercorn's write, made cheap when the kernel takes it whole (almost every write of a
        # stream): the send lock taken without a trip through the scheduler when it is free, and
        # one write(2) straight to the socket, with no cancel scope, deadline or trio socket call
        # (each a scheduler pass and timer-heap work, per event sent).  What the kernel does not
        # take goes out as hypercorn's write did: shielded (half a write would corrupt the
        # response), but bounded by progress, so a slow reader is cut only when it stops.
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled sender writes nothing (no yield otherwise)
        lock = self.send_lock
        await acquire(lock)
        try:
            socket_ = self.stream.socket
            sent = 0
            if DIRECT_WRITES:
                try:
                    sent = os.write(socket_.fileno(), data)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    await self.protocol.handle(Closed())  # the client is gone (reset, or closed by us)
                    return
                if sent == len(data):
                    return
            try:
                with trio.CancelScope(shield=True) as write, memoryview(data) as view:
                    while sent < len(view):
                        write.deadline = trio.current_time() + self._stall_timeout
                        with view[sent:] as rest:
                            sent += await socket_.send(rest)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())  # the client is gone (reset, or closed by us)
                return
            if write.cancelled_caught:
                log.info("reset a connection whose client stopped reading (no progress for %g s)", self._stall_timeout)
                _reset(socket_)
                await self.protocol.handle(Closed())
        finally:
            lock.release()

    async def _read_data(self) -> None:
        # hypercorn's loop, plus the one call that starts the header clock,
        # and the end of the idle timer once nothing more can be read.
        while True:
            try:
                with trio.fail_after(self.config.read_timeout or math.inf):
                    data = await self.stream.receive_some(MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                break
            if data == b"":
                self._read_over = True  # before the protocol hears of it: it may restart the idle timer meanwhile
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                break
            self._start_header_clock()
        self._read_over = True
        await self.protocol.handle(Closed())
        if self._timer is not None:
            # The client closed (or reset) the connection.  Idle, it is closed now
            # (hypercorn waited for the keep-alive timer, holding the socket in
            # CLOSE-WAIT after a FIN all that time); with a request running, the
            # timer's task ends and the end of the response closes it.
            self._timer.cancel()

    def _fall_idle(self, task_group: Any) -> None:
        """The connection has no request running: the keep-alive deadline starts now."""
        timer = self._timer
        if timer is None:
            timer = self._timer = trio.CancelScope()
            task_group._nursery.start_soon(self._keep_alive, timer)
        timer.deadline = trio.current_time() + self.config.keep_alive_timeout
        self._idle_timer, self._headers_due = timer, None
        if self._read_over:  # the client left while its last request was answered
            timer.cancel()
        self._start_header_clock()  # a pipelined request may already have begun

    def _fall_busy(self) -> None:
        """A request's headers are complete: no deadline until its response has ended."""
        if self._idle_timer is not None:
            self._idle_timer.deadline = math.inf
        self._idle_timer, self._headers_due = None, None

    async def _keep_alive(self, timer: trio.CancelScope) -> None:
        with timer:
            await self.context.terminated.wait()
        if self._idle_timer is not timer:
            # A request runs (it began before the timer's task woke, or the server
            # is shutting down meanwhile): the end of its response decides, and the
            # next idle spell starts a timer of its own.
            if self._timer is timer:
                self._timer = None
            return
        self._idle_timer = None
        with trio.CancelScope(shield=True):
            if timer.cancelled_caught and self._headers_due is not None and not self._read_over:
                await self._send_408()
            await self._initiate_server_close()

    def _start_header_clock(self) -> None:
        timer = self._idle_timer
        if timer is not None and self._headers_due is None and self._awaiting_headers():
            # The connection is no longer idle: this deadline replaces the keep-alive one.
            self._headers_due = timer.deadline = trio.current_time() + self._header_timeout

    def _one_stream(self) -> bool:
        """HTTP/1.1 (a WebSocket upgraded from it included): one stream, whose bytes are all this task's."""
        return isinstance(getattr(self.protocol, "protocol", None), H11Protocol)

    def _h11(self) -> h11.Connection | None:
        protocol = getattr(self.protocol, "protocol", None)  # set once the connection is set up
        if isinstance(protocol, H11Protocol) and isinstance(protocol.connection, h11.Connection):
            return protocol.connection
        return None  # HTTP/2, or upgraded to a WebSocket

    def _awaiting_headers(self) -> bool:
        """Part of a request has arrived, but not yet its complete line and headers."""
        connection = self._h11()
        return connection is not None and connection.their_state is h11.IDLE and bool(connection.trailing_data[0])

    async def _send_408(self) -> None:
        connection = self._h11()
        if connection is None or connection.our_state is not h11.IDLE:
            return
        headers = [(b"content-length", b"0"), (b"connection", b"close"), *self.config.response_headers("h11")]
        try:
            data = connection.send(h11.Response(status_code=408, reason=b"Request Timeout", headers=headers))
            data += connection.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            return
        with trio.move_on_after(_SEND_408_WITHIN):
            async with self.send_lock:
                try:
                    await self.stream.send_all(data)
                    await self.stream.send_eof()  # a FIN after it, so the client reads it before the close
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                    pass


class _KeepAliveTimer(TrioSingleTask):
    """What hypercorn's connection calls its idle task (`restart` when the connection falls
    idle, `stop` when a request begins), as two calls that move one timer's deadline."""

    def __init__(self, server: _GatewayTCPServer) -> None:
        super().__init__()
        self._server = server

    async def restart(self, task_group: Any, action: Any) -> None:
        self._server._fall_idle(task_group)

    async def stop(self) -> None:
        self._server._fall_busy()


def _reset(socket_: trio.socket.SocketType) -> None:
    """Close with a reset: the kernel drops what the client never read, now."""
    with contextlib.suppress(OSError):
        socket_.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    socket_.close()  # the connection's read loop wakes with ClosedResourceError
