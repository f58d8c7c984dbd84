"""The one dispatcher: every row of the route table (`gateway.api.ROUTES`), served one way.

A request that passed the edge reaches its row's handler as a `Call`: the
body read once (bounded in size and time, decompressed: `bodies`), the
path's parameters, the query and the headers read from the ASGI scope.
What the handler returns is written by the ASGI transport (ended at once
when the client leaves); what it raises is answered by the renderer in the
request's dialect, with its id, and logged once.

Rows `served="ahead"` are looked up by their exact method and path before
the framework; Quart's router serves the others (registered here from the
table, `register`), and its own refusals (404, 405, 413) are rendered the
same way.  A WebSocket at a row's path is served by that row; at any other
path it is refused with 404 in OpenAI's shape.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any, cast
from urllib.parse import parse_qsl

from ..api.routes import Call, Handler, Route, Socket, SocketHandler
from ..errors import GatewayError, NotFound, RequestTooLarge
from ..transport import asgi as asgi_transport
from ..transport import render
from ..turn.context import RequestContext
from .bodies import decode_body, discard_body, header, read_body
from .lifespan import Shared

__all__ = ["Dispatch", "Scope", "scope_call"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class _Lazy(Mapping[str, str]):
    """A mapping computed from the scope on first use (most handlers read neither query nor headers)."""

    def __init__(self, build: Callable[[], dict[str, str]]) -> None:
        self._build = build
        self._value: dict[str, str] | None = None

    def _get(self) -> dict[str, str]:
        if self._value is None:
            self._value = self._build()
        return self._value

    def __getitem__(self, key: str) -> str:
        return self._get()[key]

    def __iter__(self) -> Any:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


def _args(query: bytes) -> dict[str, str]:
    args: dict[str, str] = {}
    for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        args.setdefault(name, value)  # the first of a repeated name, as the framework gives it
    return args


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", ())}


def scope_call(
    shared: Shared, scope: Scope, params: Mapping[str, str], read: Callable[[], Awaitable[bytes]]
) -> Call:
    """The call a handler takes, read from the ASGI scope."""
    query = scope.get("query_string", b"")
    return Call(
        shared,
        RequestContext.of(scope),
        params,
        _Lazy(functools.partial(_args, query)),
        read,
        _Lazy(functools.partial(_headers, scope)),
        query,
        scope.get("method", ""),
    )


class Dispatch:
    """Serves the route table (see the module docstring); built once the lifespan has opened."""

    def __init__(self, shared: Shared, routes: Sequence[Route], body_timeout: float) -> None:
        self._shared = shared
        settings = shared.resources.settings
        self._limit, self._ratio = settings.max_request_body_bytes, settings.max_decompression_ratio
        self._body_timeout = body_timeout
        self._ahead: dict[tuple[str, str], Handler] = {}
        self._sockets: dict[str, SocketHandler] = {}
        for route in routes:
            for path in route.paths:
                if route.method == "WEBSOCKET":
                    self._sockets[path] = cast(SocketHandler, route.handler)
                elif route.served == "ahead":
                    self._ahead[(route.method, path)] = cast(Handler, route.handler)

    def ahead(self, scope: Scope) -> Handler | None:
        """The handler of a row served ahead of the framework, if this request is one."""
        return self._ahead.get((scope.get("method", ""), scope.get("path", "")))

    async def serve(self, handler: Handler, scope: Scope, receive: Receive, send: Send, params: Mapping[str, str] = {}) -> None:
        """One request of a row served on ASGI: body, call, handler, body written (or the error rendered)."""
        try:
            raw = await read_body(receive, self._limit, self._body_timeout, scope)
            if raw is None:
                return  # the client left
            encoding = header(scope.get("headers", ()), b"content-encoding")

            async def read() -> bytes:
                return decode_body(raw, encoding, self._limit, max_ratio=self._ratio)

            answer = await handler(scope_call(self._shared, scope, params, read))
        except GatewayError as error:
            if isinstance(error, RequestTooLarge):
                await discard_body(receive)
            await self.refuse(scope, send, error)
            return
        await asgi_transport.stream(answer, scope, receive, send)

    async def refuse(self, scope: Scope, send: Send, error: GatewayError) -> None:
        """An error answered in the request's dialect, with its id, and logged once."""
        ctx = RequestContext.of(scope)
        await render.send_error(send, error, where=ctx.where, dialect=ctx.dialect, request_id=ctx.request_id)

    async def socket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket: its row's handler, or a 404 at a path no row serves."""
        ctx = RequestContext.of(scope)
        handler = self._sockets.get(scope.get("path", ""))
        if handler is not None:
            await handler(Socket(self._shared, ctx, scope, receive, send))
        elif (await receive())["type"] == "websocket.connect":
            unknown = NotFound(f"No WebSocket is served at {scope.get('path', '')}.", code="unknown_url")
            await render.deny_websocket(scope, send, unknown, ctx.where)
