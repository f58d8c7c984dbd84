"""Creating a response: `POST /v1/responses`, served straight on ASGI beside the framework.

    respond         a parsed request's turn, with the transport it asked
                    for: an SSE stream, a JSON answer, or a background job
                    (its queued snapshot, or its events followed live)
    ResponsesRoute  the hot path: the body read once (bounded), decompressed,
                    parsed by the intake, the turn prepared, the transport
                    body streamed; refused requests answered by the renderer
    SocketRoute     the same path as a WebSocket (its turns, in order, on
                    one connection), and a WebSocket at any other path refused

`respond` is also what a `submit_tool_outputs` continuation runs.  No
framework request objects here: the route runs for every response created.
"""

from __future__ import annotations

from typing import Any

from . import intake, render
from .errors import GatewayError, NotFound, RequestTooLarge
from .intake import RequestContext
from .lifespan import Shared
from .server.ext import BATCH, extension
from .transport import asgi as asgi_transport
from .transport.follow import EventReplay, follow_job
from .transport.json import JsonBody, turn_answer
from .transport.sse import DeferredHeadBody, TurnEventStream
from .transport.websocket import serve_asgi_websocket
from .turn import prepare_turn
from .wire import CreateResponseRequest

__all__ = ["ResponsesRoute", "SocketRoute", "respond"]


async def respond(shared: Shared, req: CreateResponseRequest, ctx: RequestContext, where: str) -> DeferredHeadBody:
    """A Responses request's turn, with the transport it asked for.

    Raises:
        GatewayError: the request cannot be served (as `prepare_turn`; a
            background request while the gateway shuts down: `ShuttingDown`).
    """
    kind = "background" if req.background else "sse" if req.stream else "json"
    tools = ctx.gateway_tools((req.model_extra or {}).get("gateway_tools"))
    turn = await prepare_turn(
        shared.resources, req, transport=kind, caller=ctx.caller, gateway_tools=tools, request_id=ctx.request_id,
        arrived=ctx.arrived,
    )
    if req.background:
        job = await shared.runner.start(turn)
        return EventReplay(follow_job(job, -1)) if req.stream else JsonBody(job.record.response)
    return TurnEventStream(turn, heartbeats=shared.heartbeats) if req.stream else turn_answer(turn, where)


class ResponsesRoute:
    """`POST /v1/responses` (and `/responses`) on ASGI: read once, turn, transport."""

    def __init__(self, shared: Shared, body_timeout: float) -> None:
        self._shared = shared
        self._settings = shared.resources.settings
        self._body_timeout = body_timeout

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        settings = self._settings
        ctx = RequestContext.of(scope)
        where = f"POST {scope.get('path')} {ctx.request_id or ''}".rstrip()
        try:
            raw = await intake.read_body(receive, settings.max_request_body_bytes, self._body_timeout, scope)
            if raw is None:
                return  # the client left
            encoding = intake.header(scope.get("headers", ()), b"content-encoding")
            limit, ratio = settings.max_request_body_bytes, settings.max_decompression_ratio
            req = intake.create_request(intake.decode_body(raw, encoding, limit, max_ratio=ratio))
            answer = await respond(self._shared, req, ctx, where)
        except GatewayError as error:
            if isinstance(error, RequestTooLarge):
                await intake.discard_body(receive)
            await render.send_error(send, error, where=where)
            return
        await asgi_transport.stream(answer, scope, receive, send)


class SocketRoute:
    """Every WebSocket that passed the edge, on ASGI: `/v1/responses` (and `/responses`) serves
    WebSocket mode; any other path is refused with 404 in OpenAI's shape."""

    def __init__(self, shared: Shared, paths: frozenset[str]) -> None:
        self._shared = shared
        self._paths = paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        ctx = RequestContext.of(scope)
        path = scope.get("path", "")
        if path in self._paths:
            batch = extension(scope, BATCH)
            await serve_asgi_websocket(self._shared.resources, ctx, receive, send, batch["hold"] if batch else None)
        elif (await receive())["type"] == "websocket.connect":
            unknown = NotFound(f"No WebSocket is served at {path}.", code="unknown_url")
            await render.deny_websocket(scope, send, unknown, f"WEBSOCKET {path} {ctx.request_id or ''}".rstrip())
