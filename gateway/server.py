"""Serving the app: a serve loop of our own over two HTTP servers.

Plain HTTP/1.1 connections, WebSockets among them, are served by the
gateway's own lean protocol (`gateway.http11`, `gateway.http11_websocket`);
HTTP/2 (and every connection with `HTTP1_SERVER=hypercorn`) by hypercorn's
protocol machinery.

`serve` is the embedding entry point: run it in the caller's nursery with
`nursery.start`, which returns the bound base URL.  `run` is what the CLI
calls: one process, or several worker processes sharing the listening
sockets.

The loop is ours (hypercorn's trio `worker_serve`, reduced to what the
gateway uses) for what hypercorn has no setting for:

- a request's line and headers must arrive within `REQUEST_HEADER_TIMEOUT`
  once its first byte has (a client trickling headers would otherwise hold a
  connection until the 75 s keep-alive timer);
- a connection whose client closed while no request was in progress is
  closed at once (hypercorn kept it, in CLOSE-WAIT, until the keep-alive
  timer ran out); a request in progress still sees `http.disconnect`;
- a write to a client that makes no progress for `CLIENT_STALL_TIMEOUT`
  resets the connection (hypercorn's write has no deadline: a client that
  stops reading held its connection and buffers for ever); the app sees
  `http.disconnect`.  Slow writes that progress are not cut;
- SIGTERM and SIGINT shut down in order: every process stops accepting at
  once (with `--workers N` the parent closes its copy of the listening
  sockets as the signal arrives, and the workers hear of it through a pipe,
  not a poll), so new connections are refused rather than left unanswered;
  the app drains (`gateway.drain`: open streams get `SHUTDOWN_GRACE`, new
  requests 503 `server_shutting_down`); every response from then on says
  `Connection: close`; connections already open are kept for a short linger,
  `min(SHUTDOWN_GRACE, 5 s)`, so that kept-alive clients (a load balancer's)
  learn of the drain from a 503 rather than a reset, unless they close first;
  then the app's shutdown runs and the process exits 0;
- a gateway that cannot start (its address cannot be listened on, its store
  cannot be opened, a backend URL that is its own address) raises
  `StartupError` saying why in one line, and never claims to be serving;
  with `--workers N` a worker that cannot start hands its reason to the
  parent, which stops the others and raises it once.  The CLI prints it as
  `gateway: cannot start: <reason>` and exits 2.

hypercorn's `run` cannot be reused for `--workers N`: its workers construct
hypercorn's own `TCPServer`, so these rules would be lost there.
What the app sees of HTTP (the edge rules) lives in `gateway.edge`, not here.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import logging
import math
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext
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
from hypercorn.utils import (
    LifespanFailureError,
    ShutdownError,
    raise_shutdown,
    repr_socket_addr,
    wrap_app,
)

from .app import GatewayApp, create_app
from .config import ConfigError, Settings
from .edge import is_failure
from .http11 import PlainServer, Replayed, acquire
from .transport.coalesce import current_batch

__all__ = ["StartupError", "hypercorn_config", "run", "serve"]

log = logging.getLogger("gateway")

_SEND_408_WITHIN = 1.0  # seconds; the 408 is a courtesy to a client that is already too slow
# Once the drain begins, how long open connections are kept (at most; never
# beyond SHUTDOWN_GRACE) so that a kept-alive client's next request is
# answered 503 rather than met by a closed connection.
_LINGER = 5.0
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset and frees the buffers
_DIRECT_WRITES = sys.platform != "win32"  # os.write() on a socket is a POSIX thing


class StartupError(Exception):
    """The gateway could not start; the message is the reason, in one line (no traceback needed)."""


class _Config(Config):
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


def hypercorn_config(settings: Settings, *, host: str | None = None, port: int | None = None) -> Config:
    config = _Config()
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


async def serve(
    settings: Settings,
    *,
    app: GatewayApp | None = None,
    host: str | None = None,
    port: int | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    own_process: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway until cancelled, or until `shutdown_trigger` returns (an orderly stop).

    Use as `url = await nursery.start(serve, settings)`; `url` is the bound
    base URL such as `http://127.0.0.1:43123` (port 0 binds a free port).
    `own_process`: the process is the gateway's (`gateway serve`), so it may
    tune the garbage collector once started; an embedding program's is left alone.

    Raises:
        StartupError: the address cannot be listened on, or the app could
            not start (its store, say).
    """
    config = hypercorn_config(settings, host=host, port=port)
    # The address first: a gateway that cannot listen says only that, before
    # the app is built (and logs its own warnings).
    sockets = await trio.to_thread.run_sync(_open_sockets, settings, config)  # it may resolve host names
    try:
        app = app if app is not None else create_app(settings)
    except ConfigError as error:
        _close(sockets)
        raise StartupError(str(error)) from None
    except BaseException:
        _close(sockets)
        raise
    await _serve_sockets(app, config, sockets, settings, shutdown_trigger, own_process=own_process, task_status=task_status)


def _open_sockets(settings: Settings, config: Config) -> Sockets:
    """The listening sockets for `config.bind`, unless the gateway must not or cannot serve there.

    Raises:
        StartupError: the address cannot be listened on, or it is a backend's.
    """
    with _listen_errors(config):
        sockets = config.create_sockets()
    try:
        _refuse_self_reference(settings, sockets)
        with _listen_errors(config):
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
    except StartupError:
        _close(sockets)
        raise
    return sockets


def _close(sockets: Sockets) -> None:
    for sock in sockets.insecure_sockets:
        sock.close()


@contextlib.contextmanager
def _listen_errors(config: Config) -> Iterator[None]:
    """Binding and listening failures, as one `StartupError` naming the address and the cause.

    Raises:
        StartupError: instead of the `OSError` (a name that does not resolve
            is a `socket.gaierror`) or the `OverflowError` (a port beyond 65535).
    """
    try:
        yield
    except (OSError, OverflowError) as error:
        raise StartupError(f"cannot listen on {config.bind[0]}: {_why_not_listening(error, config.bind[0])}") from None


def _why_not_listening(error: OSError | OverflowError, bind: str) -> str:
    if isinstance(error, OverflowError):
        return "the port must be 0-65535"
    if isinstance(error, socket.gaierror):
        return f"the host name does not resolve ({error.strerror})"
    if error.errno == errno.EADDRINUSE:
        return "the address is already in use"
    if error.errno == errno.EADDRNOTAVAIL:
        return "this machine has no such address"
    if error.errno == errno.EACCES:
        port = bind.rsplit(":", 1)[-1]
        privileged = port.isdigit() and 0 < int(port) < 1024
        return "permission denied (ports below 1024 need privileges)" if privileged else "permission denied"
    return error.strerror or str(error)


def _refuse_self_reference(settings: Settings, sockets: Sockets) -> None:
    """A backend URL that is the gateway's own address would send every request round in circles.

    Raises:
        StartupError: naming the setting and the URL.
    """
    from .loops import self_references

    binds = [f"http://{repr_socket_addr(sock.family, sock.getsockname())}" for sock in sockets.insecure_sockets]
    where = "OPENAI_BASE_URL_INTERNAL"
    urls = [settings.openai_base_url_internal]
    if settings.gateway_config:
        from .backends.config import load_config

        where = settings.gateway_config
        try:
            urls = [backend.base_url for backend in load_config(settings.gateway_config).backends.values()]
        except ConfigError as error:
            raise StartupError(str(error)) from None
    looped = self_references(urls, binds)
    if looped:
        raise StartupError(
            f"{where}: the backend {looped[0]} is this gateway itself ({binds[0]}); "
            "every request would come back here without end"
        )


async def _serve_sockets(
    app: Any,
    config: Config,
    sockets: Sockets,
    settings: Settings,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    *,
    own_process: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """One worker: the app's lifespan, then connections until shutdown.

    Raises:
        StartupError: the app's startup failed.
    """
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan_state: dict[str, Any] = {}
    lifespan = _Lifespan(wrapped, config, lifespan_state)
    failures: list[BaseException] = []
    lifespan_over = trio.Event()

    async def run_lifespan(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await lifespan.handle_lifespan(task_status=task_status)
        except* LifespanFailureError as group:
            failures.extend(group.exceptions)  # the app could not start (or stop): said below, once
        finally:
            lifespan_over.set()

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(run_lifespan)
        with _startup_failure_said_once(app):
            await lifespan.wait_for_startup()
        if not lifespan.started:
            await lifespan_over.wait()  # startup failed: its reason is on its way
            lifespan_nursery.cancel_scope.cancel()
        else:
            if own_process:
                settle_garbage_collector()
            await _serve_connections(
                wrapped, config, sockets, settings, lifespan_state, shutdown_trigger, task_status, gateway=app, plain_app=app
            )
            await lifespan.wait_for_shutdown()
            lifespan_nursery.cancel_scope.cancel()
    if not lifespan.started:
        raise StartupError(_startup_message(failures[0]) if failures else "the app did not start")


@contextlib.contextmanager
def _startup_failure_said_once(app: Any) -> Iterator[None]:
    """Keep Quart's own record of a failed start-up ("Exception", with the error) out of the log.

    Quart logs the error its `before_serving` raised, then hands it on: the
    serve loop raises it as `StartupError`, the one line that says why.  At
    DEBUG the record is kept, for its traceback.
    """
    logger = getattr(app, "logger", None)
    if not isinstance(logger, logging.Logger):
        yield
        return

    def said_by_the_server(record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.msg == "Exception" and not logger.isEnabledFor(logging.DEBUG))

    logger.addFilter(said_by_the_server)
    try:
        yield
    finally:
        logger.removeFilter(said_by_the_server)


# The collector's thresholds once the gateway serves.  With thousands of open
# streams the heap holds millions of live objects, and every collection stops
# every stream.  A full collection walked them all (at 5,000 slow streams, 31
# of about a second each took half the process's CPU): the oldest generation
# is now looked at only after 2,000 middle ones (~120 M allocations, and then
# only if it grew by a quarter).  The younger ones stay small, because a
# stream's objects live until it ends and all survive: a middle collection
# of up to 20,000 x 3 young objects pauses ~70 ms at 10,000 streams, where
# 50,000 x 20 paused ~0.5 s (the longest silence at 10,000 streams and 2 s
# heartbeats went 2.65 s -> 2.24 s).
_GC_THRESHOLDS = (20_000, 3, 2_000)


def settle_garbage_collector() -> None:
    """Move everything start-up made out of the collector's sight, and collect less often.

    `gc.freeze()` puts the objects alive now (modules, the app, settings) in a
    permanent generation that no collection walks again; only what requests
    create is collected, and less often.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)


async def _serve_connections(
    app: Any,
    config: Config,
    sockets: Sockets,
    settings: Settings,
    lifespan_state: dict[str, Any],
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    task_status: trio.TaskStatus[str],
    gateway: Any = None,
    plain_app: Any = None,
) -> None:
    """Accept connections until shutdown; then stop listening, drain (the app's streams,
    turns and background responses finish or end well, open connections linger), and
    give what is still open `graceful_timeout` to write what is left.

    Plain HTTP/1.1 connections are the gateway's own (`gateway.http11`) unless
    `HTTP1_SERVER=hypercorn`, WebSockets included; HTTP/2 is hypercorn's."""
    context = WorkerContext(None)
    listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets.insecure_sockets]
    binds = [f"http://{repr_socket_addr(sock.family, sock.getsockname())}" for sock in sockets.insecure_sockets]
    connections = _OpenConnections()
    hypercorn_connection = functools.partial(
        _GatewayTCPServer,
        app,
        config,
        context,
        ConnectionState(lifespan_state.copy()),
        header_timeout=settings.request_header_timeout,
        stall_timeout=settings.client_stall_timeout,
    )
    plain: PlainServer | None = None
    handler: Callable[[trio.SocketStream], Awaitable[None]]
    if plain_app is not None and settings.http1_server == "gateway" and _DIRECT_WRITES:

        async def hand_off(stream: Replayed) -> None:
            await hypercorn_connection(stream, connections=None).run()

        plain = PlainServer(
            plain_app,
            config,
            lifespan_state,
            header_timeout=settings.request_header_timeout,
            stall_timeout=settings.client_stall_timeout,
            date=config.date if isinstance(config, _Config) else _Config().date,
            hand_off=hand_off,
        )
        handler = functools.partial(_serve_plain, plain, connections)
    else:

        async def handler(stream: trio.SocketStream) -> None:
            await hypercorn_connection(stream, connections=connections).run()
    async with trio.open_nursery() as server_nursery:
        log.info("serving the Responses gateway on %s (backend %s)", binds[0], settings.openai_base_url_internal)
        if gateway is not None and hasattr(gateway, "serving"):
            await gateway.serving(binds, stalls_bounded=True)
        task_status.started(binds[0])
        graceful = False
        try:
            async with trio.open_nursery(strict_exception_groups=True) as nursery:
                if shutdown_trigger is not None:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                nursery.start_soon(raise_shutdown, context.terminate.wait)
                nursery.start_soon(functools.partial(trio.serve_listeners, handler, listeners, handler_nursery=server_nursery))
                await trio.sleep_forever()
        except BaseExceptionGroup as error:
            _, other = error.split((ShutdownError, KeyboardInterrupt))
            if other is not None:
                raise other
            graceful = True
        finally:
            for listener in listeners:
                listener.socket.close()  # new connections are refused, not queued unanswered
            if graceful:
                log.info("stopped listening (%d connections open)", connections.count)
                linger_until = trio.current_time() + min(settings.shutdown_grace, _LINGER)
                # hypercorn adds `Connection: close` to a response once its connection
                # has served this many requests: from now on, every response (h2: GOAWAY).
                config.keep_alive_max_requests = 0
                if gateway is not None and hasattr(gateway, "drain"):
                    await gateway.drain.run(settings.shutdown_grace)
                with trio.move_on_at(linger_until):  # nothing open (or all closed): no wait at all
                    await connections.wait_none()
            await context.terminated.set()  # idle connections close; busy ones get the grace period
            if plain is not None:
                plain.terminate()
            server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout


async def _serve_plain(plain: PlainServer, connections: _OpenConnections, stream: trio.SocketStream) -> None:
    with _one_connection(connections):
        await plain.serve(stream)


@contextlib.contextmanager
def _one_connection(connections: _OpenConnections | None) -> Iterator[None]:
    """A connection counted while it is open (None: counted elsewhere); a failure of the
    server's own code on it ends that connection only, not every connection of the process."""
    if connections is not None:
        connections.opened()
    try:
        yield
    except BaseException as exc:
        if not is_failure(exc):
            raise
        log.error("the HTTP server failed on one connection (%s); it is closed", type(exc).__name__)
        log.debug("connection failure", exc_info=exc)
    finally:
        if connections is not None:
            connections.closed()


class _OpenConnections:
    """How many connections a worker holds open; the drain waits (bounded) for none."""

    def __init__(self) -> None:
        self.count = 0
        self._none = trio.Event()
        self._none.set()

    def opened(self) -> None:
        self.count += 1
        if self.count == 1:
            self._none = trio.Event()

    def closed(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._none.set()

    async def wait_none(self) -> None:
        await self._none.wait()


class _Lifespan(Lifespan):
    """hypercorn's lifespan, telling a startup that completed from one that failed."""

    started = False

    async def asgi_send(self, message: Any) -> None:
        if message["type"] == "lifespan.startup.complete":
            self.started = True
        await super().asgi_send(message)


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
        connections: _OpenConnections | None,
    ) -> None:
        super().__init__(app, config, context, state, stream)
        self._header_timeout = header_timeout
        self._stall_timeout = stall_timeout
        self._connections = connections
        self.idle_task = _KeepAliveTimer(self)  # hypercorn's idle task, replaced
        self._timer: trio.CancelScope | None = None  # the keep-alive task's scope, while that task runs
        self._idle_timer: trio.CancelScope | None = None  # the same scope while the connection is idle, else None
        self._headers_due: float | None = None  # set once a request has begun while the timer runs
        self._read_over = False  # the client closed or reset the connection (or it timed out): nothing more comes

    async def run(self) -> None:
        # hypercorn lets a failure of its own protocol code on one connection
        # (an h11 LocalProtocolError, say) escape into the nursery that serves
        # every connection, ending the process.  It ends this connection only.
        # (A connection handed over by the plain server is counted there.)
        with _one_connection(self._connections):
            await super().run()

    async def protocol_send(self, event: Any) -> None:
        if not (isinstance(event, RawData) and isinstance(self.stream, (trio.SocketStream, Replayed))):
            await super().protocol_send(event)
            return
        batch = current_batch()
        if batch is not None and batch.write in (None, self._write_raw) and self._one_stream():
            # A transport sending several messages at once (`coalesced`): held, and
            # written with the others when its block ends.  HTTP/1.1 only: on HTTP/2
            # the bytes may carry other streams' frames, whose order matters (HPACK).
            batch.write = self._write_raw
            batch.parts.append(event.data)
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
            if _DIRECT_WRITES:
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


def _startup_message(error: BaseException) -> str:
    text = str(error)
    # hypercorn's wording: "Lifespan failure in startup. '<the app's message>'"
    return text.split(". ", 1)[1].strip("'") if ". " in text else text


def run(settings: Settings, *, host: str | None = None, port: int | None = None, workers: int = 1) -> int:
    """Blocking entry point for `gateway serve`; the process's exit code.

    SIGTERM and SIGINT stop it in order (exit 0).

    Raises:
        StartupError: it could not start.
        ValueError: `workers` is below 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    if workers == 1:
        trio.run(functools.partial(_serve_until_signalled, settings, host, port))
        return 0
    return _run_workers(settings, host=host, port=port, workers=workers)


async def _serve_until_signalled(settings: Settings, host: str | None, port: int | None) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        await serve(
            settings, host=host, port=port, shutdown_trigger=functools.partial(_wait_for_signal, signals), own_process=True
        )


async def _wait_for_signal(signals: AsyncIterator[int]) -> None:
    async for signum in signals:
        log.info("stopping (%s)", signal.Signals(signum).name)
        return


# --- several worker processes ---------------------------------------------------------------


def _run_workers(settings: Settings, *, host: str | None, port: int | None, workers: int) -> int:
    """Worker processes sharing the listening sockets; SIGTERM/SIGINT stop them all in order.

    A worker that dies is replaced; one that cannot start stops them all.

    Raises:
        StartupError: the sockets could not be opened, or a worker could not
            start (its reason, said once however many workers failed).
    """
    from .observe.metrics import shared_across_workers

    config = hypercorn_config(settings, host=host, port=port)
    sockets = _open_sockets(settings, config)
    context = get_context("spawn")
    stop = _Stop(context)
    processes: dict[Any, Connection] = {}  # each worker, and the pipe on which it says why it could not start
    stopping = False
    signalled: str | None = None
    cannot_start: str | None = None

    def on_signal(signum: int, _: Any) -> None:
        nonlocal stopping, signalled
        stopping, signalled = True, signal.Signals(signum).name
        stop.set()  # the workers hear of it now; the wait below wakes too

    # Workers inherit "ignore SIGINT" (a terminal's Ctrl-C reaches the whole
    # process group): the parent decides when they stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # DEBUG: each worker says "serving" itself, and a start-up that fails is one line.
    log.debug("starting %d worker processes on %s", workers, config.bind[0])
    # Entered before the first worker starts: they all keep their metrics in one directory.
    with shared_across_workers(settings) as worker_exited:
        try:
            while not stopping:
                while len(processes) < workers:
                    heard, says = context.Pipe(duplex=False)
                    process = context.Process(target=_worker, args=(settings, host, port, sockets, stop.heard, says))
                    process.start()
                    says.close()  # the worker holds its own copy: only it writes
                    processes[process] = heard
                signal.signal(signal.SIGINT, on_signal)
                signal.signal(signal.SIGTERM, on_signal)
                wait([*(process.sentinel for process in processes), stop.heard])
                for process in [p for p in processes if not p.is_alive()]:
                    reason = _reason_heard(processes.pop(process))
                    worker_exited(process.pid)
                    if process.exitcode == _CANNOT_START:
                        cannot_start = cannot_start or reason or f"worker {process.pid} could not start"
                        stopping = True
                        stop.set()
                    elif not stopping:
                        log.warning("worker %s exited (%s); starting another", process.pid, process.exitcode)
            # The parent's copies of the listening sockets, closed at once: while
            # one is open the kernel still accepts connections nobody will answer.
            _close(sockets)
            if signalled is not None:
                log.info("stopping (%s): stopped listening; %d workers drain", signalled, len(processes))
        finally:
            stop.set()
            _close(sockets)
            for process, heard in processes.items():
                process.join(settings.shutdown_grace + config.graceful_timeout + 15)
                if process.is_alive():
                    process.terminate()
                heard.close()
                worker_exited(process.pid)
    if cannot_start is not None:
        raise StartupError(cannot_start)
    return 0


_CANNOT_START = 3
_REASON_BYTES = 4096  # a reason is one line; a pipe's buffer takes it whole, so the worker never waits


def _reason_heard(heard: Connection) -> str | None:
    """What an exited worker said about why it could not start, if anything."""
    try:
        return heard.recv_bytes().decode(errors="replace") if heard.poll() else None
    except (EOFError, OSError):
        return None  # it exited without a word
    finally:
        heard.close()


class _Stop:
    """The parent's word to its workers that they stop: a pipe whose write end only the parent holds.

    Closing it wakes every worker at once (hypercorn's multiprocessing event is
    polled every 0.1 s), and a parent that dies without a word closes it too, so
    no worker is left behind serving on its own.
    """

    def __init__(self, context: SpawnContext) -> None:
        self.heard, self._said = context.Pipe(duplex=False)  # `heard` is handed to every worker

    def set(self) -> None:
        self._said.close()  # idempotent: the signal handler and the loop may both say it


def _worker(
    settings: Settings, host: str | None, port: int | None, sockets: Sockets, stop: Connection, says: Connection
) -> None:
    """One worker process (spawned: it builds its own app and logging).

    One that cannot start does not log why: it tells the parent on `says`,
    and the parent says it once, for all its workers.
    """
    from .logs import configure_logging

    try:
        configure_logging(settings)
        trio.run(_serve_worker, settings, hypercorn_config(settings, host=host, port=port), sockets, stop)
    except (StartupError, ConfigError) as error:
        says.send_bytes(str(error).encode()[:_REASON_BYTES])
        sys.exit(_CANNOT_START)


async def _serve_worker(settings: Settings, config: Config, sockets: Sockets, stop: Connection) -> None:
    # The parent's stop, or a SIGTERM of the worker's own: a service
    # manager may signal every process of the service at once (systemd does).
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        stopped = functools.partial(
            _first_of,
            functools.partial(trio.lowlevel.wait_readable, stop.fileno()),  # readable: the parent closed its end
            functools.partial(_wait_for_signal, signals),
        )
        await _serve_sockets(create_app(settings), config, sockets, settings, stopped, own_process=True)


async def _first_of(*waits: Callable[[], Awaitable[None]]) -> None:
    """Return as soon as one of `waits` returns."""
    async with trio.open_nursery() as nursery:

        async def run_one(wait_for: Callable[[], Awaitable[None]]) -> None:
            await wait_for()
            nursery.cancel_scope.cancel()

        for wait_for in waits:
            nursery.start_soon(run_one, wait_for)
