"""The ASGI application: the edge, the lifespan, and the route table served by one dispatcher.

    GatewayApp   the Quart app every connection enters through the edge
                 (`edge`): rows of the route table served ahead of Quart's
                 router, WebSockets, and Quart for the rest (`dispatch`)
    create_app   the app for a settings object; its resources are opened
                 and closed with the serving (`lifespan`)

The routes themselves are `gateway.api` (the table, `api.ROUTES`, and one
module per endpoint family); errors become bytes in one place
(`transport.render`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..api import ROUTES
from ..api.routes import Handler, Route, RouteTable
from ..backends import Backend
from ..config import Settings
from ..errors import GatewayError, InternalError
from ..keys import KeyStore
from ..observe import Telemetry, build_telemetry
from ..ops.drain import Drain
from ..store import ResponseStore
from ..streams.translator import random_id
from ..transport import render
from ..transport.asgi import BodyConnection, as_response
from ..turn.context import RequestContext
from ..turn.tools import ToolSource
from .bodies import decode_body
from .dispatch import Dispatch, Scope, scope_call
from .edge import Edge
from .lifespan import Lifespan, Shared

__all__ = ["GatewayApp", "create_app"]

log = logging.getLogger("gateway")


class GatewayApp(QuartTrio):
    asgi_http_class = BodyConnection
    settings: Settings
    telemetry: Telemetry
    drain: Drain
    edge: Edge  # every connection passes it, however the app is served
    lifespan: Lifespan
    shared: Shared  # set when the lifespan opens
    dispatch: Dispatch  # likewise

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.edge(scope, receive, send)

    async def enter(self, scope: Any, receive: Any, send: Any) -> None:
        """What passed the edge: rows served ahead of the router, WebSockets, and Quart for the rest."""
        kind = scope["type"]
        if kind == "http":
            handler = self.dispatch.ahead(scope)
            if handler is not None:
                await self.dispatch.serve(handler, scope, receive, send)
                return
        elif kind == "websocket":
            await self.dispatch.socket(scope, receive, send)
            return
        await self.asgi_app(scope, receive, send)

    async def serving(self, binds: list[str], *, stalls_bounded: bool = False) -> None:
        """Told by the serve loop where it listens (see `Shared.serving`)."""
        await self.shared.serving(binds, stalls_bounded=stalls_bounded)


def create_app(
    settings: Settings,
    *,
    backend: Backend | None = None,
    store: ResponseStore | None = None,
    mcp: ToolSource | None = None,
    keys: KeyStore | None = None,
    clock: Callable[[], float] = time.time,
    ids: Callable[[str], str] = random_id,
    routes: Sequence[Route] = ROUTES,
) -> GatewayApp:
    """Build the gateway app from a settings object.

    `backend`, `store`, `mcp` (a running MCP manager) and `keys` (a key store)
    replace the ones the settings would build (they are then the caller's to
    run and close); `clock` and `ids` are injected into the translator (tests pin them);
    `routes` is the route table (the load lab measures a row served both ways).
    """
    app = GatewayApp(__name__)
    app.settings, app.telemetry, app.drain = settings, build_telemetry(settings), Drain()
    app.config.update(MAX_CONTENT_LENGTH=settings.max_request_body_bytes, RESPONSE_TIMEOUT=None)
    app.config["BODY_TIMEOUT"] = body_timeout = max(60.0, settings.stream_timeout)
    app.lifespan = lifespan = Lifespan(
        settings, app.telemetry, app.drain, clock, ids, backend=backend, store=store, mcp=mcp, keys=keys
    )
    app.edge = Edge(
        app.enter,
        max_websockets=settings.websocket_max_connections,
        telemetry=app.telemetry,
        authenticate=lifespan.authenticate,
        cors_origins=settings.cors_allow_origins,
        draining=app.drain.draining.is_set,
        metrics_token=bool(settings.metrics_token),
        routes=RouteTable(routes),
    )

    @app.before_serving
    async def _open() -> None:
        app.shared = await lifespan.open(app.nursery)
        app.dispatch = Dispatch(app.shared, routes, body_timeout)

    @app.after_serving
    async def _close() -> None:
        await lifespan.close()

    @app.errorhandler(Exception)
    async def _error(error: Exception) -> Response:
        """Every error a row raises, and the framework's own (404, 405, 413), answered by the renderer."""
        if isinstance(error, HTTPException):
            error = render.from_framework(
                error.code, error.description, request.method, request.path, settings.max_request_body_bytes
            )
        elif not isinstance(error, GatewayError):
            log.debug("internal error detail", exc_info=error)
            error = InternalError("The gateway failed to process the request.", cause=type(error).__name__)
        ctx = RequestContext.of(request.scope)
        status, body, headers = render.answer(error, ctx.where, dialect=ctx.dialect, request_id=ctx.request_id)
        return Response(body, status=status, headers=headers)

    async def body() -> bytes:
        data = await request.get_data(as_text=False)
        raw = data if isinstance(data, bytes) else data.encode()
        encoding = request.headers.get("content-encoding", "")
        return decode_body(raw, encoding, settings.max_request_body_bytes, max_ratio=settings.max_decompression_ratio)

    _register(app, routes, body)
    return app


def _register(app: GatewayApp, routes: Sequence[Route], body: Callable[[], Awaitable[bytes]]) -> None:
    """Quart's router serves every HTTP row not served ahead of it, registered from the table."""

    def view(handler: Handler) -> Callable[..., Awaitable[Response]]:
        async def serve(**params: str) -> Response:
            return as_response(await handler(scope_call(app.shared, cast(Scope, request.scope), params, body)))

        return serve

    for route in routes:
        if route.method == "WEBSOCKET" or route.served == "ahead":
            continue
        handler: Any = route.handler
        for path in route.paths:
            endpoint = f"{route.method} {path}"
            app.add_url_rule(route.rule(path), endpoint, view(handler), methods=list(route.methods))
