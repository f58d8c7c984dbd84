"""Serving the app with hypercorn's trio worker, in-process or as workers.

`serve` is the embedding entry point: run it in the caller's nursery with
`nursery.start`, which returns the bound base URL.  `run` is what the CLI
calls: one process, or several hypercorn worker processes sharing the socket.
"""

from __future__ import annotations

import functools
import logging
import sys

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from .app import GatewayApp, create_app
from .config import Settings

__all__ = ["hypercorn_config", "run", "serve"]

log = logging.getLogger("gateway")


def hypercorn_config(settings: Settings, *, host: str | None = None, port: int | None = None) -> Config:
    config = Config()
    host = settings.api_adapter_host if host is None else host
    port = settings.api_adapter_port if port is None else port
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.worker_class = "trio"
    config.accesslog = None  # the app logs one line per request itself
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
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway until cancelled.

    Use as `url = await nursery.start(serve, settings)`; `url` is the bound
    base URL such as `http://127.0.0.1:43123` (port 0 binds a free port).
    """
    app = app if app is not None else create_app(settings)
    config = hypercorn_config(settings, host=host, port=port)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(hypercorn_serve, app, config, mode="asgi"))
        url = binds[0]
        log.info("serving the Responses gateway on %s (backend %s)", url, settings.openai_base_url_internal)
        task_status.started(url)


def run(settings: Settings, *, host: str | None = None, port: int | None = None, workers: int = 1) -> None:
    """Blocking entry point for `gateway serve`."""
    if workers <= 1:
        try:
            trio.run(functools.partial(serve, settings, host=host, port=port))
        except KeyboardInterrupt:
            pass
        return
    from hypercorn.run import run as hypercorn_run

    config = hypercorn_config(settings, host=host, port=port)
    config.workers = workers
    config.application_path = "gateway.asgi:app"
    log.info("starting %d worker processes on %s", workers, config.bind[0])
    sys.exit(hypercorn_run(config))
