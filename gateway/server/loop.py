"""The serve loop: listening sockets, the app's lifespan, connections, and an orderly stop.

Plain HTTP/1.1 connections, WebSockets among them, are served by the
gateway's own connections (`gateway.server.http11`, `.websocket`); HTTP/2
(and every connection with `HTTP1_SERVER=hypercorn`) by hypercorn's
protocol machinery (`gateway.server.hypercorn`).

The loop is ours (hypercorn's trio `worker_serve`, reduced to what the
gateway uses) for what hypercorn has no setting for:

- a request's line and headers must arrive within `REQUEST_HEADER_TIMEOUT`
  once its first byte has (a client trickling headers would otherwise hold a
  connection until the 75 s keep-alive timer);
- a connection whose client closed while no request was in progress is
  closed at once; a request in progress hears of it at once too (the
  process's hang-up watch, `gateway.server.hangups`);
- a write to a client that makes no progress for `CLIENT_STALL_TIMEOUT`
  resets the connection; the app sees `http.disconnect`.  Slow writes that
  progress are not cut;
- a stop (`shutdown_trigger` returns: SIGTERM, SIGINT) is in order: stop
  accepting at once, so new connections are refused rather than left
  unanswered; the app drains (`Hooks.drain`: its open streams get
  `SHUTDOWN_GRACE`); every response from then on says `Connection: close`;
  connections already open are kept for a short linger, `min(SHUTDOWN_GRACE,
  5 s)`, so that kept-alive clients (a load balancer's) learn of the drain
  from a 503 rather than a reset, unless they close first; then the app's
  shutdown runs;
- a loop that cannot start (its address cannot be listened on, the app's
  start-up failed) raises `StartupError` saying why in one line, and never
  claims to be serving.

The app is any ASGI callable; what the loop tells it beyond ASGI goes
through `Hooks`.  Nothing here knows the gateway's app.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import trio

from ..config import ConfigError, Settings
from ..errors import is_failure
from .hangups import Hangups
from .http11 import DIRECT_WRITES, PlainServer
from .hypercorn import (
    Config,
    GatewayConfig,
    LifespanFailureError,
    ShutdownError,
    Sockets,
    StartedLifespan,
    WorkerContext,
    connection_handler,
    hypercorn_config,
    raise_shutdown,
    repr_socket_addr,
    startup_message,
    wrap_app,
)

__all__ = [
    "GC_THRESHOLDS",
    "LINGER",
    "Hooks",
    "StartupError",
    "addresses",
    "close_sockets",
    "open_sockets",
    "serve",
    "serve_sockets",
    "settle_garbage_collector",
]

log = logging.getLogger("gateway")

# Once the drain begins, how long open connections are kept (at most; never
# beyond SHUTDOWN_GRACE) so that a kept-alive client's next request is
# answered 503 rather than met by a closed connection.
LINGER = 5.0


class StartupError(Exception):
    """The gateway could not start; the message is the reason, in one line (no traceback needed)."""


@dataclass(frozen=True)
class Hooks:
    """What the serve loop tells the app beyond ASGI (each optional)."""

    serving: Callable[[list[str]], Awaitable[None]] | None = None  # where it listens, before the first connection
    drain: Callable[[float], Awaitable[None]] | None = None  # a stop has begun: the app's streams get this grace


def open_sockets(
    settings: Settings, *, host: str | None = None, port: int | None = None, check: Callable[[list[str]], None] | None = None
) -> tuple[GatewayConfig, Sockets]:
    """The listening sockets for the settings' address (or `host`, `port`), bound, checked by
    `check(addresses)` (which may raise `StartupError`), then listening.

    Raises:
        StartupError: the address cannot be listened on, or `check` refused it.
    """
    config = hypercorn_config(settings, host=host, port=port)
    with _listen_errors(config):
        sockets = config.create_sockets()
    try:
        if check is not None:
            check(addresses(sockets))
        with _listen_errors(config):
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
    except BaseException:
        close_sockets(sockets)
        raise
    return config, sockets


def addresses(sockets: Sockets) -> list[str]:
    """The base URLs the sockets are bound to (`http://127.0.0.1:8080`)."""
    return [f"http://{repr_socket_addr(sock.family, sock.getsockname())}" for sock in sockets.insecure_sockets]


def close_sockets(sockets: Sockets) -> None:
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


async def serve(
    settings: Settings,
    build: Callable[[], tuple[Any, Hooks]],
    *,
    host: str | None = None,
    port: int | None = None,
    check: Callable[[list[str]], None] | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    own_process: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen (`open_sockets`), then build the app (`build()`: the app and its hooks) and serve
    it (`serve_sockets`) until cancelled or until `shutdown_trigger` returns.

    The address first: a gateway that cannot listen says only that, before the
    app is built (and logs its own warnings).

    Raises:
        StartupError: the address cannot be listened on (or `check` refused
            it), the app could not be built (a `ConfigError`), or its start-up failed.
    """
    opening = functools.partial(open_sockets, settings, host=host, port=port, check=check)
    config, sockets = await trio.to_thread.run_sync(opening)  # (it may resolve host names)
    try:
        try:
            app, hooks = build()
        except ConfigError as error:
            raise StartupError(str(error)) from None
        await serve_sockets(
            app, config, sockets, settings, hooks=hooks, shutdown_trigger=shutdown_trigger, own_process=own_process, task_status=task_status
        )
    finally:
        close_sockets(sockets)


async def serve_sockets(
    app: Any,
    config: GatewayConfig,
    sockets: Sockets,
    settings: Settings,
    *,
    hooks: Hooks = Hooks(),
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    own_process: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on listening `sockets`: its lifespan, then connections until cancelled or
    until `shutdown_trigger` returns (an orderly stop).  `task_status` gets the first bound URL.
    `own_process`: the process is the gateway's, so the garbage collector may be tuned once started.

    Raises:
        StartupError: the app's startup failed.
    """
    lifespan_state: dict[str, Any] = {}
    lifespan = StartedLifespan(wrap_app(app, config.wsgi_max_body_size, "asgi"), config, lifespan_state)
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
            await _serve_connections(app, config, sockets, settings, lifespan_state, hooks, shutdown_trigger, task_status)
            await lifespan.wait_for_shutdown()
            lifespan_nursery.cancel_scope.cancel()
    if not lifespan.started:
        raise StartupError(startup_message(failures[0]) if failures else "the app did not start")


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
# every stream: a full collection walks them all, so the oldest generation is
# looked at only after 6,000 middle ones (and then only if it grew by a
# quarter).  The younger ones stay small, because a stream's objects live
# until it ends and all survive: a middle collection walks what the young
# generations let through, so its pause grows with their thresholds (at
# 10,000 slow streams on two cores, 20,000 × 3 paused the loop 100 to 140 ms
# at a time, 5,000 × 4 at most 45 ms).  Both keep a full collection to one
# per 120 million allocations.  (The pauses and silences these were chosen
# by: `gateway bench --only heartbeats`, docs/load-lab.md.)
GC_THRESHOLDS = (5_000, 4, 6_000)


def settle_garbage_collector() -> None:
    """Move everything start-up made out of the collector's sight, and collect less often.

    `gc.freeze()` puts the objects alive now (modules, the app, settings) in a
    permanent generation that no collection walks again; only what requests
    create is collected, and less often.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def _serve_connections(
    app: Any,
    config: GatewayConfig,
    sockets: Sockets,
    settings: Settings,
    lifespan_state: dict[str, Any],
    hooks: Hooks,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    task_status: trio.TaskStatus[str],
) -> None:
    """Accept connections until shutdown; then stop listening, drain (the app's streams,
    turns and background responses finish or end well, open connections linger), and
    give what is still open `graceful_timeout` to write what is left.

    Plain HTTP/1.1 connections are the gateway's own (`http11`) unless
    `HTTP1_SERVER=hypercorn`, WebSockets included; HTTP/2 is hypercorn's."""
    context = WorkerContext(None)
    listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets.insecure_sockets]
    binds = addresses(sockets)
    connections = _OpenConnections()
    hypercorn_serve, take_over = connection_handler(
        app,
        config,
        context,
        lifespan_state,
        header_timeout=settings.request_header_timeout,
        stall_timeout=settings.client_stall_timeout,
        opened=functools.partial(_one_connection, connections),
    )
    plain: PlainServer | None = None
    handler: Callable[[trio.SocketStream], Awaitable[None]] = hypercorn_serve
    hangups: Hangups | None = None
    if settings.http1_server == "gateway" and DIRECT_WRITES:
        hangups = Hangups.open()  # (None where the platform has no epoll: the app then reads)
        plain = PlainServer(
            app,
            config,
            lifespan_state,
            header_timeout=settings.request_header_timeout,
            stall_timeout=settings.client_stall_timeout,
            date=config.date,
            hand_off=take_over,
            hangups=hangups,
        )
        handler = functools.partial(_serve_plain, plain, connections)
    # Two nurseries owned here: the hang-up watch's, which outlives every connection, and the
    # connections' (the grace period bounds it once the stop has begun).
    async with trio.open_nursery() as watching:
        if hangups is not None:
            await watching.start(hangups.run)
        async with trio.open_nursery() as server_nursery:
            log.info("serving the Responses gateway on %s (backend %s)", binds[0], settings.openai_base_url_internal)
            if hooks.serving is not None:
                await hooks.serving(binds)
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
                    linger_until = trio.current_time() + min(settings.shutdown_grace, LINGER)
                    # hypercorn adds `Connection: close` to a response once its connection
                    # has served this many requests: from now on, every response (h2: GOAWAY).
                    config.keep_alive_max_requests = 0
                    if hooks.drain is not None:
                        await hooks.drain(settings.shutdown_grace)
                    with trio.move_on_at(linger_until):  # nothing open (or all closed): no wait at all
                        await connections.wait_none()
                await context.terminated.set()  # idle connections close; busy ones get the grace period
                if plain is not None:
                    plain.terminate()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        watching.cancel_scope.cancel()  # every connection is closed: the watch too


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

