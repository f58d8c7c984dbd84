"""Running the gateway as a program: one process, or worker processes sharing the listening sockets.

`run` is what `gateway serve` calls.  SIGTERM and SIGINT stop it in order:
every process stops accepting at once (with `--workers N` the parent closes
its copy of the listening sockets as the signal arrives, and the workers
hear of it through a pipe, not a poll), then each drains as the serve loop
does (`gateway.server.loop`) and exits 0.  A worker that dies is replaced;
one that cannot start hands its reason to the parent, which stops the
others and raises it once, as `StartupError`.

hypercorn's own `run` cannot be used for `--workers N`: its workers
construct hypercorn's own TCP server, so the serve loop's rules would be
lost there.  What each process serves comes from `build`, a module-level
function (it crosses to spawned processes by name): it sets up the
process (logging) and returns the app and its hooks.  Nothing here knows
the gateway's app.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext
from typing import Any

import trio

from ..config import ConfigError, Settings
from .hypercorn import GatewayConfig, Sockets, hypercorn_config
from .loop import Hooks, StartupError, close_sockets, open_sockets, serve, serve_sockets

__all__ = ["Build", "run"]

log = logging.getLogger("gateway")

# What a process serves: set up for `settings` (logging), the app and its hooks.
Build = Callable[[Settings], tuple[Any, Hooks]]


def run(
    settings: Settings,
    build: Build,
    *,
    host: str | None = None,
    port: int | None = None,
    workers: int = 1,
    check: Callable[[list[str]], None] | None = None,
    exited: Callable[[int], None] = lambda pid: None,
) -> int:
    """Serve until SIGTERM or SIGINT (then stop in order); the process's exit code.

    `check(addresses)` may refuse the bound addresses (raising `StartupError`)
    before anything listens; `exited(pid)` is told of each worker that exits.

    Raises:
        StartupError: it could not start.
        ValueError: `workers` is below 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    if workers == 1:
        trio.run(functools.partial(_serve_until_signalled, settings, build, host, port, check))
        return 0
    return _run_workers(settings, build, host=host, port=port, workers=workers, check=check, exited=exited)


async def _serve_until_signalled(
    settings: Settings, build: Build, host: str | None, port: int | None, check: Callable[[list[str]], None] | None
) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        await serve(
            settings,
            functools.partial(build, settings),
            host=host,
            port=port,
            check=check,
            shutdown_trigger=functools.partial(_wait_for_signal, signals),
            own_process=True,
        )


async def _wait_for_signal(signals: AsyncIterator[int]) -> None:
    async for signum in signals:
        log.info("stopping (%s)", signal.Signals(signum).name)
        return


# --- several worker processes ---------------------------------------------------------------


def _run_workers(
    settings: Settings,
    build: Build,
    *,
    host: str | None,
    port: int | None,
    workers: int,
    check: Callable[[list[str]], None] | None,
    exited: Callable[[int], None],
) -> int:
    """Worker processes sharing the listening sockets; SIGTERM/SIGINT stop them all in order.

    A worker that dies is replaced; one that cannot start stops them all.

    Raises:
        StartupError: the sockets could not be opened, or a worker could not
            start (its reason, said once however many workers failed).
    """
    config, sockets = open_sockets(settings, host=host, port=port, check=check)
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
    try:
        while not stopping:
            while len(processes) < workers:
                heard, says = context.Pipe(duplex=False)
                process = context.Process(target=_worker, args=(settings, build, host, port, sockets, stop.heard, says))
                process.start()
                says.close()  # the worker holds its own copy: only it writes
                processes[process] = heard
            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGTERM, on_signal)
            wait([*(process.sentinel for process in processes), stop.heard])
            for process in [p for p in processes if not p.is_alive()]:
                reason = _reason_heard(processes.pop(process))
                exited(process.pid)
                if process.exitcode == _CANNOT_START:
                    cannot_start = cannot_start or reason or f"worker {process.pid} could not start"
                    stopping = True
                    stop.set()
                elif not stopping:
                    log.warning("worker %s exited (%s); starting another", process.pid, process.exitcode)
        # The parent's copies of the listening sockets, closed at once: while
        # one is open the kernel still accepts connections nobody will answer.
        close_sockets(sockets)
        if signalled is not None:
            log.info("stopping (%s): stopped listening; %d workers drain", signalled, len(processes))
    finally:
        stop.set()
        close_sockets(sockets)
        for process, heard in processes.items():
            process.join(settings.shutdown_grace + config.graceful_timeout + 15)
            if process.is_alive():
                process.terminate()
            heard.close()
            exited(process.pid)
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
    settings: Settings, build: Build, host: str | None, port: int | None, sockets: Sockets, stop: Connection, says: Connection
) -> None:
    """One worker process (spawned: `build` sets it up and makes its own app).

    One that cannot start does not log why: it tells the parent on `says`,
    and the parent says it once, for all its workers.
    """
    try:
        app, hooks = build(settings)
        trio.run(_serve_worker, settings, app, hooks, hypercorn_config(settings, host=host, port=port), sockets, stop)
    except (StartupError, ConfigError) as error:
        says.send_bytes(str(error).encode()[:_REASON_BYTES])
        sys.exit(_CANNOT_START)


async def _serve_worker(settings: Settings, app: Any, hooks: Hooks, config: GatewayConfig, sockets: Sockets, stop: Connection) -> None:
    # The parent's stop, or a SIGTERM of the worker's own: a service
    # manager may signal every process of the service at once (systemd does).
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        stopped = functools.partial(
            _first_of,
            functools.partial(trio.lowlevel.wait_readable, stop.fileno()),  # readable: the parent closed its end
            functools.partial(_wait_for_signal, signals),
        )
        await serve_sockets(app, config, sockets, settings, hooks=hooks, shutdown_trigger=stopped, own_process=True)


async def _first_of(*waits: Callable[[], Awaitable[None]]) -> None:
    """Return as soon as one of `waits` returns."""
    async with trio.open_nursery() as nursery:

        async def run_one(wait_for: Callable[[], Awaitable[None]]) -> None:
            await wait_for()
            nursery.cancel_scope.cancel()

        for wait_for in waits:
            nursery.start_soon(run_one, wait_for)
