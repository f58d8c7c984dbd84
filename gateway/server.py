"""Serving the app: hypercorn's protocol machinery under a serve loop of our own.

`serve` is the embedding entry point: run it in the caller's nursery with
`nursery.start`, which returns the bound base URL.  `run` is what the CLI
calls: one process, or several worker processes sharing the listening
sockets.

The loop is ours (hypercorn's `worker_serve`, reduced to what the gateway
uses) for what hypercorn has no setting for:

- a request's line and headers must arrive within `REQUEST_HEADER_TIMEOUT`
  once its first byte has (a client trickling headers holds a connection,
  and hypercorn's only timer is the 75 s keep-alive one);
- SIGTERM and SIGINT shut down in order: the app's shutdown runs (running
  background responses are recorded as cancelled) and the process exits 0;
- a gateway that cannot start (its store cannot be opened) says why in one
  line instead of a traceback, and never claims to be serving.
"""

from __future__ import annotations

import functools
import logging
import math
import signal
import sys
from collections.abc import Awaitable, Callable
from multiprocessing import get_context
from multiprocessing.connection import wait
from multiprocessing.synchronize import Event as EventType
from typing import Any

import h11
import trio
from hypercorn.config import Config, Sockets
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import (
    LifespanFailureError,
    ShutdownError,
    check_multiprocess_shutdown_event,
    raise_shutdown,
    repr_socket_addr,
    wrap_app,
)

from .app import GatewayApp, create_app
from .config import ConfigError, Settings

__all__ = ["StartupError", "hypercorn_config", "run", "serve"]

log = logging.getLogger("gateway")


class StartupError(Exception):
    """The gateway could not start; the message says why (no traceback needed)."""


def hypercorn_config(settings: Settings, *, host: str | None = None, port: int | None = None) -> Config:
    config = Config()
    host = settings.api_adapter_host if host is None else host
    port = settings.api_adapter_port if port is None else port
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.worker_class = "trio"
    config.accesslog = None  # the app logs one line per response itself
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 75
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
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway until cancelled, or until `shutdown_trigger` returns (an orderly stop).

    Use as `url = await nursery.start(serve, settings)`; `url` is the bound
    base URL such as `http://127.0.0.1:43123` (port 0 binds a free port).

    Raises:
        StartupError: the app could not start (its store, say).
    """
    app = app if app is not None else create_app(settings)
    config = hypercorn_config(settings, host=host, port=port)
    sockets = config.create_sockets()
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)
    await _serve_sockets(app, config, sockets, settings, shutdown_trigger, task_status=task_status)


async def _serve_sockets(
    app: Any,
    config: Config,
    sockets: Sockets,
    settings: Settings,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """One worker: the app's lifespan, then connections until shutdown.

    Mirrors hypercorn's trio `worker_serve` without QUIC, TLS or statsd,
    with `_GatewayTCPServer` for connections.
    """
    app = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan_state: dict[str, Any] = {}
    lifespan = _Lifespan(app, config, lifespan_state)
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
        await lifespan.wait_for_startup()
        if not lifespan.started:
            await lifespan_over.wait()  # startup failed: its reason is on its way
            lifespan_nursery.cancel_scope.cancel()
        else:
            await _serve_connections(app, config, sockets, settings, lifespan_state, shutdown_trigger, task_status)
            await lifespan.wait_for_shutdown()
            lifespan_nursery.cancel_scope.cancel()
    if not lifespan.started:
        raise StartupError(_startup_message(failures[0]) if failures else "cannot start")


async def _serve_connections(
    app: Any,
    config: Config,
    sockets: Sockets,
    settings: Settings,
    lifespan_state: dict[str, Any],
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    task_status: trio.TaskStatus[str],
) -> None:
    context = WorkerContext(None)
    async with trio.open_nursery() as server_nursery:
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets.insecure_sockets]
        binds = [f"http://{repr_socket_addr(sock.family, sock.getsockname())}" for sock in sockets.insecure_sockets]
        handler = functools.partial(
            _GatewayTCPServer, app, config, context, ConnectionState(lifespan_state.copy()), settings.request_header_timeout
        )
        log.info("serving the Responses gateway on %s (backend %s)", binds[0], settings.openai_base_url_internal)
        task_status.started(binds[0])
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
        finally:
            await context.terminated.set()
            server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout


class _Lifespan(Lifespan):
    """hypercorn's lifespan, telling a startup that completed from one that failed."""

    started = False

    async def asgi_send(self, message: Any) -> None:
        if message["type"] == "lifespan.startup.complete":
            self.started = True
        await super().asgi_send(message)


class _GatewayTCPServer(TCPServer):
    """hypercorn's connection handler, with a deadline for each request's headers."""

    def __init__(self, app: Any, config: Config, context: Any, state: Any, header_timeout: float, stream: Any) -> None:
        super().__init__(app, config, context, state, stream)
        self._header_timeout = header_timeout

    async def _read_data(self) -> None:
        headers_since: float | None = None  # when the first byte of a request whose headers are incomplete came
        while True:
            deadline = math.inf if headers_since is None else headers_since + self._header_timeout
            if self.config.read_timeout:
                deadline = min(deadline, trio.current_time() + self.config.read_timeout)
            try:
                with trio.fail_at(deadline):
                    data = await self.stream.receive_some(2**16)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break
            except trio.TooSlowError:
                # Nothing is being served on this connection: stop its keep-alive
                # timer (the connection's task group waits for it) and close.
                await self.idle_task.stop()
                await self._close()
                break
            await self.protocol.handle(_raw(data))
            if data == b"":
                break
            if self._awaiting_headers():
                if headers_since is None:
                    headers_since = trio.current_time()
            else:
                headers_since = None
        await self.protocol.handle(_closed())

    def _awaiting_headers(self) -> bool:
        """A request has begun but its line and headers are not complete (HTTP/1.1 only)."""
        protocol = getattr(self.protocol, "protocol", None)
        if not isinstance(protocol, H11Protocol):
            return False
        connection = protocol.connection
        if not isinstance(connection, h11.Connection):
            return False  # upgraded to a WebSocket
        return connection.their_state is h11.IDLE and bool(connection.trailing_data[0])


def _raw(data: bytes | bytearray) -> Any:
    from hypercorn.events import RawData

    return RawData(bytes(data))


def _closed() -> Any:
    from hypercorn.events import Closed

    return Closed()


def _startup_message(error: BaseException) -> str:
    text = str(error)
    # hypercorn's wording: "Lifespan failure in startup. '<the app's message>'"
    detail = text.split(". ", 1)[1].strip("'") if ". " in text else text
    return f"cannot start: {detail}"


def run(settings: Settings, *, host: str | None = None, port: int | None = None, workers: int = 1) -> int:
    """Blocking entry point for `gateway serve`; the process's exit code.

    SIGTERM and SIGINT stop it in order (exit 0).

    Raises:
        StartupError: it could not start.
    """
    if workers <= 1:
        trio.run(functools.partial(_serve_until_signalled, settings, host, port))
        return 0
    return _run_workers(settings, host=host, port=port, workers=workers)


async def _serve_until_signalled(settings: Settings, host: str | None, port: int | None) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

        async def signalled() -> None:
            async for signum in signals:
                log.info("stopping (%s)", signal.Signals(signum).name)
                return

        await serve(settings, host=host, port=port, shutdown_trigger=signalled)


# --- several worker processes ---------------------------------------------------------------


def _run_workers(settings: Settings, *, host: str | None, port: int | None, workers: int) -> int:
    """Worker processes sharing the listening sockets; SIGTERM/SIGINT stop them all in order.

    A worker that dies is replaced; one that cannot start stops them all.
    """
    config = hypercorn_config(settings, host=host, port=port)
    sockets = config.create_sockets()
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)
    context = get_context("spawn")
    stop = context.Event()
    processes: list[Any] = []
    stopping = False

    def on_signal(*_: Any) -> None:
        nonlocal stopping
        stopping = True
        stop.set()

    # Workers inherit "ignore SIGINT": the parent decides when they stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log.info("starting %d worker processes on %s", workers, config.bind[0])
    exitcode = 0
    try:
        while not stopping:
            while len(processes) < workers:
                process = context.Process(target=_worker, args=(settings, host, port, sockets, stop))
                process.start()
                processes.append(process)
            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGTERM, on_signal)
            wait([process.sentinel for process in processes])
            for process in [p for p in processes if not p.is_alive()]:
                processes.remove(process)
                if process.exitcode == _CANNOT_START:
                    exitcode, stopping = 2, True
                    stop.set()
                elif not stopping:
                    log.warning("worker %s exited (%s); starting another", process.pid, process.exitcode)
    finally:
        stop.set()
        for process in processes:
            process.join(config.graceful_timeout + 15)
            if process.is_alive():
                process.terminate()
        for sock in sockets.insecure_sockets:
            sock.close()
    return exitcode


_CANNOT_START = 3


def _worker(settings: Settings, host: str | None, port: int | None, sockets: Sockets, stop: EventType) -> None:
    """One worker process (spawned: it builds its own app and logging)."""
    from .logs import configure_logging

    configure_logging(settings)
    config = hypercorn_config(settings, host=host, port=port)
    try:
        trio.run(
            functools.partial(
                _serve_sockets,
                create_app(settings),
                config,
                sockets,
                settings,
                functools.partial(check_multiprocess_shutdown_event, stop, trio.sleep),
            )
        )
    except (StartupError, ConfigError) as error:
        log.error("%s", error)
        sys.exit(_CANNOT_START)
