"""The application: the route table, and the app object that wires the edge, the lifespan and the routes.

Each route is wiring: the intake reads the request (`intake`), a turn or a
store operation does the work (`turn/`, `stored`), a transport body answers
(`transport/`), errors become bytes in one place (`render`).  `POST
/v1/responses` (`responses`), chat completions (`completions`) and the
Messages API (`messages`) are served straight on ASGI (`direct`); the rest
through Quart.  `lifespan` opens and closes resources; keys and limits are
the edge's.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from . import intake, render
from .backends import Backend
from .config import Settings
from .call import Call, Handler
from .completions import ROUTES as COMPLETION_ROUTES
from .conversations import ROUTES as CONVERSATION_ROUTES
from .direct import DirectRoutes
from .messages import ROUTES as MESSAGES_ROUTES
from .models import ROUTES as MODEL_ROUTES
from .drain import Drain
from .edge import Edge
from .errors import GatewayError, InternalError, NotFound
from .intake import RequestContext
from .keys import KeyStore
from .lifespan import Lifespan, Shared
from .observe import Telemetry, build_telemetry, metrics_page
from .responses import ResponsesRoute, SocketRoute, respond
from .store import ResponseStore
from .stored import ROUTES as STORED_ROUTES, StoredResponses
from .streams.translator import random_id
from .transport.asgi import BodyConnection, as_response
from .transport.json import JsonBody, compaction_answer
from .transport.passthrough import PassthroughBody
from .turn.compact import prepare_compaction
from .turn.count import count_input_tokens
from .turn.relay import prepare_relay
from .turn.tools import ToolSource

__all__ = ["GatewayApp", "create_app"]

log = logging.getLogger("gateway")
_RESPONSES = frozenset({"/v1/responses", "/responses"})  # POST: served on ASGI, beside Quart


class GatewayApp(QuartTrio):
    asgi_http_class = BodyConnection
    settings: Settings
    telemetry: Telemetry
    drain: Drain
    edge: Edge  # every connection passes it, however the app is served
    shared: Shared  # set when the lifespan opens
    responses: ResponsesRoute  # likewise
    sockets: SocketRoute  # likewise
    direct: DirectRoutes  # likewise

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.edge(scope, receive, send)

    async def dispatch(self, scope: Any, receive: Any, send: Any) -> None:
        """What passed the edge: `POST /v1/responses`, the direct routes and WebSockets on ASGI,
        everything else through Quart."""
        kind = scope["type"]
        if kind == "http":
            if scope.get("method") == "POST" and scope.get("path") in _RESPONSES:
                await self.responses(scope, receive, send)
                return
            handler = self.direct.handler(scope)
            if handler is not None:
                await self.direct.serve(handler, scope, receive, send)
                return
        elif kind == "websocket":
            await self.sockets(scope, receive, send)
            return
        await self.asgi_app(scope, receive, send)

    async def serving(self, binds: list[str], *, stalls_bounded: bool = False) -> None:
        """Told by the serve loop where it listens (see `Shared.serving`)."""
        await self.shared.serving(binds, stalls_bounded=stalls_bounded)


def aliased(register: Callable[..., Any], rule: str) -> Callable[[Any], Any]:
    """Register a route at `/v1{rule}` and at `{rule}` (clients configured without the `/v1`)."""

    def both(handler: Any) -> Any:
        register("/v1" + rule)(handler)
        return register(rule)(handler)

    return both


def _ctx() -> RequestContext:
    return RequestContext.of(request.scope)


def _where() -> str:
    return f"{request.method} {request.path} {_ctx().request_id or ''}".rstrip()


def create_app(
    settings: Settings,
    *,
    backend: Backend | None = None,
    store: ResponseStore | None = None,
    mcp: ToolSource | None = None,
    keys: KeyStore | None = None,
    clock: Callable[[], float] = time.time,
    ids: Callable[[str], str] = random_id,
) -> GatewayApp:
    """Build the gateway app from a settings object.

    `backend`, `store`, `mcp` (a running MCP manager) and `keys` (a key store)
    replace the ones the settings would build (they are then the caller's to
    run and close); `clock` and `ids` are injected into the translator (tests pin them).
    """
    app = GatewayApp(__name__)
    app.settings, app.telemetry, app.drain = settings, build_telemetry(settings), Drain()
    app.config.update(MAX_CONTENT_LENGTH=settings.max_request_body_bytes, RESPONSE_TIMEOUT=None)
    app.config["BODY_TIMEOUT"] = body_timeout = max(60.0, settings.stream_timeout)
    lifespan = Lifespan(settings, app.telemetry, app.drain, clock, ids, backend=backend, store=store, mcp=mcp, keys=keys)
    app.edge = Edge(
        app.dispatch,
        max_websockets=settings.websocket_max_connections,
        telemetry=app.telemetry,
        authenticate=lambda scope: app.shared.authenticate(scope),
        cors_origins=settings.cors_allow_origins,
        draining=app.drain.draining.is_set,
        metrics_token=bool(settings.metrics_token),
    )

    @app.before_serving
    async def _open() -> None:
        app.shared = await lifespan.open(app.nursery)
        app.responses = ResponsesRoute(app.shared, body_timeout)
        app.sockets = SocketRoute(app.shared, _RESPONSES)
        app.direct = DirectRoutes(app.shared, [*COMPLETION_ROUTES, *MESSAGES_ROUTES], body_timeout)

    @app.after_serving
    async def _close() -> None:
        await lifespan.close()

    def resources() -> Any:
        return app.shared.resources

    @app.errorhandler(Exception)
    async def _error(error: Exception) -> Response:
        """Every error a route raises, and the framework's own (404, 405, 413), answered by the renderer."""
        if isinstance(error, HTTPException):
            error = render.from_framework(
                error.code, error.description, request.method, request.path, settings.max_request_body_bytes
            )
        elif not isinstance(error, GatewayError):
            log.debug("internal error detail", exc_info=error)
            error = InternalError("The gateway failed to process the request.", cause=type(error).__name__)
        dialect = render.dialect_of(request.path, request.scope.get("headers", ()))
        status, body, headers = render.answer(error, _where(), dialect=dialect, request_id=_ctx().request_id)
        return Response(body, status=status, headers=headers)

    async def body() -> bytes:
        data = await request.get_data(as_text=False)
        raw = data if isinstance(data, bytes) else data.encode()
        encoding = request.headers.get("content-encoding", "")
        return intake.decode_body(raw, encoding, settings.max_request_body_bytes, max_ratio=settings.max_decompression_ratio)

    # --- the Responses API ------------------------------------------------------------

    stored = lambda: StoredResponses(app.shared.runner, resources().store)  # noqa: E731

    @aliased(app.post, "/responses/<response_id>/submit_tool_outputs")
    async def _submit_tool_outputs(response_id: str) -> Response:
        """The required_action protocol: the client's outputs continue the response as its next turn."""
        if settings.tool_call_protocol != "required_action":
            raise NotFound("Unknown endpoint: set TOOL_CALL_PROTOCOL=required_action to use it.", code="unknown_url")
        raw = await body()
        previous = await stored().record(response_id, _ctx().caller.owner)
        return as_response(await respond(app.shared, intake.tool_outputs_request(raw, previous.response), _ctx(), _where()))

    @aliased(app.post, "/responses/input_tokens")
    async def _input_tokens() -> Response:
        return as_response(JsonBody(await count_input_tokens(resources(), intake.create_request(await body()), _ctx())))

    @aliased(app.post, "/responses/compact")
    async def _compact() -> Response:
        turn = await prepare_compaction(resources(), intake.create_request(await body()), _ctx())
        return as_response(compaction_answer(resources(), turn, _where()))

    def resource_route(handler: Handler) -> Callable[..., Any]:
        async def view(**params: str) -> Response:
            headers = {name.lower(): value for name, value in request.headers.items()}
            call = Call(app.shared, _ctx(), params, request.args, body, headers, request.query_string)
            return as_response(await handler(call))

        return view

    # gateway.stored, .conversations, .messages (Anthropic's Messages API), .models
    for method, rule, handler in [*STORED_ROUTES, *CONVERSATION_ROUTES, *MODEL_ROUTES]:
        aliased(functools.partial(app.route, methods=[method], endpoint=f"{method} {rule}"), rule)(resource_route(handler))

    # --- the relay ------------------------------------------------------------------------

    @app.route("/v1/<path:path>", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def _relay(path: str) -> Response:
        """Any other `/v1/{path}`, relayed to the backend; a key's models and limits hold here too."""
        ctx, target = _ctx(), intake.relay_path(path)
        relay = await prepare_relay(
            resources(), ctx, request.method, target, request.query_string, dict(request.headers), await body()
        )
        return as_response(PassthroughBody(resources().backend, relay, heartbeats=app.shared.heartbeats, drain=app.drain))

    # --- the operator's routes ------------------------------------------------------------

    @app.get("/")
    async def _root() -> Response:
        return as_response(JsonBody({"message": "Responses gateway is running.", "docs": "/v1/responses"}))

    @app.get("/health")
    async def _health() -> Response:
        return as_response(JsonBody({"status": "ok", "adapter": "running"}))

    @app.get("/ready")
    async def _ready() -> Response:
        """What the last background check found (never a check per request)."""
        ready, report = app.shared.readiness.report()
        return as_response(JsonBody(report, 200 if ready else 503))

    @app.get("/metrics")
    async def _metrics() -> Response:
        body, content_type = metrics_page(app.telemetry, settings.metrics_token, request.headers.get("authorization", ""))
        return Response(body, content_type=content_type)

    return app

