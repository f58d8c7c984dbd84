"""Where the gateway's app meets the server: what `gateway.serve` (embedding) and `gateway serve` run.

The server (`gateway.server`) knows sockets and ASGI, nothing of the app.
Here the app is built from the settings (in each worker process, with its
logging), a backend URL that is the gateway's own address is refused before
anything listens, the app is told where it listens and when the drain
begins (`Hooks`), and worker processes share their metrics.
"""

from __future__ import annotations

import functools
from typing import Any

import trio

from . import server
from .config import ConfigError, Settings
from .server import Hooks, StartupError

__all__ = ["hooks_of", "run", "serve"]


async def serve(
    settings: Settings,
    *,
    app: Any = None,
    host: str | None = None,
    port: int | None = None,
    shutdown_trigger: Any = None,
    own_process: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway (or `app`, any ASGI app) until cancelled, or until `shutdown_trigger`
    returns (an orderly stop).

    Use as `url = await nursery.start(serve, settings)`; `url` is the bound
    base URL such as `http://127.0.0.1:43123` (port 0 binds a free port).
    `own_process`: the process is the gateway's (`gateway serve`), so it may
    tune the garbage collector once started; an embedding program's is left alone.

    Raises:
        StartupError: the address cannot be listened on, a backend URL is the
            gateway's own address, or the app could not start (its store, say).
    """
    await server.serve(
        settings,
        functools.partial(_built, settings, app),
        host=host,
        port=port,
        check=functools.partial(refuse_self_reference, settings),
        shutdown_trigger=shutdown_trigger,
        own_process=own_process,
        task_status=task_status,
    )


def run(settings: Settings, *, host: str | None = None, port: int | None = None, workers: int = 1) -> int:
    """Blocking entry point for `gateway serve` (logging already set up); the exit code.

    Raises:
        StartupError: it could not start.
        ValueError: `workers` is below 1.
    """
    check = functools.partial(refuse_self_reference, settings)
    if workers == 1:
        return server.run(settings, _build_here, host=host, port=port, check=check)
    from .observe.metrics import shared_across_workers

    # Entered before the first worker starts: they all keep their metrics in one directory.
    with shared_across_workers(settings) as worker_exited:
        return server.run(settings, build_worker, host=host, port=port, workers=workers, check=check, exited=worker_exited)


def hooks_of(app: Any) -> Hooks:
    """What the server tells the gateway's app beyond ASGI (nothing, for another app)."""
    serving = getattr(app, "serving", None)
    drain = getattr(getattr(app, "drain", None), "run", None)
    return Hooks(
        # The gateway's serve loop bounds stalled writes itself: the app's ticker need not.
        serving=functools.partial(serving, stalls_bounded=True) if serving is not None else None,
        drain=drain,
    )


def build_worker(settings: Settings) -> tuple[Any, Hooks]:
    """A worker process's app (spawned: it sets up its own logging first).

    Raises:
        ConfigError: the log file, say, cannot be used.
    """
    from .ops.logs import configure_logging

    configure_logging(settings)
    return _build_here(settings)


def _build_here(settings: Settings) -> tuple[Any, Hooks]:
    return _built(settings, None)


def _built(settings: Settings, app: Any) -> tuple[Any, Hooks]:
    if app is None:
        from .app import create_app

        app = create_app(settings)
    return app, hooks_of(app)


def refuse_self_reference(settings: Settings, binds: list[str]) -> None:
    """A backend URL that is the gateway's own address would send every request round in circles.

    Raises:
        StartupError: naming the setting and the URL.
    """
    from .ops.loops import self_references

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
