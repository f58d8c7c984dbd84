"""The ASGI edge: what every request passes before the app, and what never passes back to the server.

Owns, for every HTTP request and WebSocket, whatever the server and the
framework leave open:

- requests with both `Content-Length` and `Transfer-Encoding` are refused
  (400, connection closed): proxies and servers that disagree on which one
  frames the body are how requests get smuggled;
- control characters in the decoded path are refused (400 `invalid_path`);
- a request that came back through this gateway is refused (508, see
  `gateway.ops.loops`), and the gateways a request passed go with its backend calls;
- the caller is identified (API keys) and counted (requests per minute)
  before any route runs; the key's rate-limit headers go with the answer
  (the operator's rows, the console's, check their own credential instead);
- concurrent WebSockets are capped (`WEBSOCKET_MAX_CONNECTIONS`): over the
  cap the handshake is answered 429;
- nothing the app raises reaches the server: before the response started
  it becomes a 500 in OpenAI's shape, after it the connection is simply
  ended; and the status line is sent shielded (hypercorn, seeing an app
  end whose start it had not recorded, would try a 500 in the middle of a
  response, and that error took the whole process down);
- the last body message is sent shielded: hypercorn closes the connection
  (`Connection: close`, HTTP/1.0) from inside that send, and quart-trio
  cancels the request's nursery as soon as the server says the stream is
  over, which would leave such connections open for ever.

Refusals are answered by `gateway.transport.render`.  It knows the ASGI message
shapes, nothing of routes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from ..errors import (
    GatewayError,
    InternalError,
    InvalidRequest,
    LoopDetected,
    ShuttingDown,
    is_failure,
)
from ..api.routes import RouteTable
from ..observe import Telemetry
from ..ops import loops
from ..server.ext import HTTP11, extension
from ..streams.translator import random_id
from ..transport.render import Dialect, deny_websocket, dialect_of, send_error
from ..turn.context import where_of
from .bodies import discard_body

__all__ = ["Edge", "TooManyWebSockets"]

log = logging.getLogger("gateway.app.edge")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# Servers and frameworks each spell the ASGI types their own way (hypercorn's
# TypedDicts, Quart's): the wrapped app is taken as any ASGI callable.
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

_CLOSE_GRACE = 10.0  # bounds the shielded last send (it only ever waits on a slow client)
# What a browser may send when its preflight does not say (OpenAI's and Anthropic's clients' headers).
_ALLOWED_HEADERS = b"authorization, content-type, x-request-id, x-api-key, anthropic-version, anthropic-beta"
_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f]")


class TooManyWebSockets(GatewayError):
    status = 429
    type = "invalid_request_error"
    code = "rate_limit_exceeded"


class Edge:
    """Wraps an ASGI app; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_websockets: int,
        telemetry: Telemetry | None = None,
        authenticate: Callable[[Scope], Awaitable[None]] | None = None,
        cors_origins: str = "",
        draining: Callable[[], bool] = lambda: False,
        metrics_token: bool = False,
        routes: RouteTable | None = None,
    ) -> None:
        """`authenticate` identifies the caller into `scope["gateway"]` or raises a
        `GatewayError` (401, 429, 503); `draining` says the gateway is shutting down;
        `metrics_token`: /metrics checks its own token (else it needs an API key like the rest);
        `routes`: the route table, which says each path's label, dialect and who may call it."""
        self._app = app
        self._max_websockets = max_websockets
        self._telemetry = telemetry or Telemetry()
        self._authenticate = authenticate
        self._cors = _Cors(cors_origins)
        self._draining = draining
        self._routes = routes if routes is not None else RouteTable(())
        anyone = self._routes.paths("anyone")
        # The probes need no API key, nor a route with its own token when one is configured.
        self._open_paths = anyone | self._routes.paths("own token") if metrics_token else anyone
        self.websockets = 0  # open now, in this process

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self._app(scope, receive, send)
            return
        try:  # the gateways this request passed through go with its backend calls
            hops = loops.arrived(scope.get("headers", ()))
        except LoopDetected as loop:
            scope.setdefault("gateway", {})["loop"] = loop  # refused below, with the other refusals
            hops = None
        try:
            if kind == "http":
                await self._http(scope, receive, send)
            else:
                await self._websocket(scope, receive, send)
        finally:
            loops.reset(hops)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        began = trio.current_time()
        request_id = _request_id(scope)
        route, dialect, operator = self._note_route(scope)
        scope["gateway"]["arrived"] = began  # what the gateway adds to a response is counted from here
        status = 500
        # Anthropic's clients read the id from `request-id` (the SDKs' `_request_id`).
        ids = [(b"x-request-id", request_id.encode())]
        if dialect == "anthropic":
            ids.append((b"request-id", request_id.encode()))

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                extra = list(ids)
                caller = (scope.get("gateway") or {}).get("caller")
                rate = getattr(caller, "rate", None)
                if rate:  # what the limiter learnt of the key's limits (OpenAI's x-ratelimit-* headers)
                    extra += [(name.encode(), value.encode()) for name, value in rate.items()]
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        headers = scope.get("headers", ())
        with self._telemetry.server_span(f"{scope.get('method', '')} {route}", headers, route=route, request_id=request_id):
            try:
                await self._guarded_http(scope, receive, send_with_id, operator)
            finally:  # inside the span: the trace records the status too
                self._telemetry.http_request(
                    route=route,
                    method=scope.get("method", ""),
                    status=status,
                    seconds=trio.current_time() - began,
                    key=(scope.get("gateway") or {}).get("key_name"),
                )

    async def _guarded_http(self, scope: Scope, receive: Receive, send: Send, operator: bool) -> None:
        allowed_origin = self._cors.origin(scope)
        if allowed_origin is not None:
            send = _with_headers(send, self._cors.headers(allowed_origin))
            if _is_preflight(scope):
                await discard_body(receive)
                await _preflight(send, scope)
                return
        refusal = _refusal(scope)
        if refusal is not None:
            # Answered before its body is read (no `100 Continue`, nothing read of a body that
            # will never be used): the server closes the connection behind it unless the body
            # had arrived whole.
            await send_error(send, refusal, close=True, where=where_of(scope), **_shape(scope))
            return
        path = scope.get("path", "")
        if path not in self._open_paths:
            refusal = await self._admit(scope, operator=operator)
            if refusal is not None:
                await send_error(send, refusal, close=isinstance(refusal, ShuttingDown), where=where_of(scope), **_shape(scope))
                return
        started = False
        atomic_start = extension(scope, HTTP11) is not None

        async def guarded_send(message: Message) -> None:
            # On the path of every body chunk: one lookup for the chunks in between.
            nonlocal started
            if message.get("more_body", False):
                await send(message)
            elif message["type"] == "http.response.body":  # the last one
                with trio.CancelScope(shield=True, deadline=trio.current_time() + _CLOSE_GRACE):
                    await send(message)
            elif message["type"] == "http.response.start":
                started = True
                if atomic_start:  # (the gateway's own server takes it at once: no scope to pay for)
                    await send(message)
                    return
                # Shielded, and without a deadline: cancelled half-way (after h11
                # took the status line, before hypercorn's stream noted it),
                # hypercorn would answer 500 in the middle of the response.
                # hypercorn shields the socket write itself; this adds only its lock.
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        try:
            await self._app(scope, receive, guarded_send)
        except BaseException as exc:
            if not is_failure(exc):
                raise
            _log_failure(scope, exc)
            if not started:
                try:
                    failed = InternalError("The gateway failed to process the request.", cause=type(exc).__name__)
                    await send_error(send, failed, close=False, where=where_of(scope), **_shape(scope))
                except Exception:  # the server itself refused: the connection is already lost
                    pass
            # After the status line nothing more can be said: the connection is ended unfinished.

    async def _admit(self, scope: Scope, *, operator: bool = False) -> GatewayError | None:
        """Why a request may not go on (shutting down, no valid key, over its rate), or None.
        `operator`: the row checks its own credential (the console's), never an API key's."""
        if self._draining():
            return ShuttingDown.refusal()
        if self._authenticate is None or operator:
            return None
        try:
            await self._authenticate(scope)
        except GatewayError as error:
            return error
        return None

    def _note_route(self, scope: Scope) -> tuple[str, Dialect, bool]:
        """The request's route label, the shape of its errors and whether its row checks the
        operator itself, looked up once (the first two noted for the app)."""
        found = self._routes.find(scope.get("path", ""))
        label, route_dialect = (found[0], found[1].dialect) if found is not None else ("other", "openai")
        dialect = dialect_of(route_dialect, scope.get("headers", ()))
        scope.setdefault("gateway", {})["dialect"] = dialect
        return label, dialect, found is not None and found[1].auth == "operator"

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._note_route(scope)
        refusal = _refusal(scope) or await self._admit(scope)
        if refusal is None and self.websockets >= self._max_websockets:
            refusal = TooManyWebSockets(
                f"This gateway holds its maximum of {self._max_websockets} WebSocket connections; try again later."
            )
        if refusal is not None:
            if (await receive())["type"] == "websocket.connect":
                await deny_websocket(scope, send, refusal, where_of(scope))
            return
        _request_id(scope)
        self.websockets += 1
        self._telemetry.websocket_opened()
        accepted = False

        async def tracking_send(message: Message) -> None:
            nonlocal accepted
            if message["type"] == "websocket.accept":
                accepted = True
            await send(message)

        try:
            await self._app(scope, receive, tracking_send)
        except BaseException as exc:
            if not is_failure(exc):
                raise
            _log_failure(scope, exc)
            try:
                if accepted:
                    await send({"type": "websocket.close", "code": 1011})
                else:  # the app has taken the handshake's connect message: answer it
                    await deny_websocket(scope, send, InternalError("The gateway failed to open the connection."), where_of(scope))
            except Exception:  # the server itself refused: the connection is already lost
                pass
        finally:
            self.websockets -= 1
            self._telemetry.websocket_closed()


class _Cors:
    """Which browser origins may call the gateway (`CORS_ALLOW_ORIGINS`)."""

    def __init__(self, setting: str) -> None:
        entries = {entry.strip().rstrip("/") for entry in setting.split(",") if entry.strip()}
        self.any = "*" in entries
        self.origins = frozenset(entries - {"*"})

    def origin(self, scope: Scope) -> str | None:
        """The value for Access-Control-Allow-Origin, or None (not a CORS request, or not allowed)."""
        if not (self.any or self.origins):
            return None
        origin = next((value for name, value in scope.get("headers", ()) if name == b"origin"), None)
        if origin is None:
            return None
        text = origin.decode("latin-1")
        if self.any:
            return "*"
        return text if text in self.origins else None

    def headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        headers = [(b"access-control-allow-origin", origin.encode()), (b"access-control-expose-headers", b"x-request-id, retry-after")]
        if origin != "*":
            headers.append((b"vary", b"Origin"))
        return headers


def _is_preflight(scope: Scope) -> bool:
    return scope.get("method") == "OPTIONS" and any(
        name == b"access-control-request-method" for name, _ in scope.get("headers", ())
    )


async def _preflight(send: Send, scope: Scope) -> None:
    requested = next((v for n, v in scope.get("headers", ()) if n == b"access-control-request-headers"), None)
    headers = [
        (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
        (b"access-control-allow-headers", requested or _ALLOWED_HEADERS),
        (b"access-control-max-age", b"600"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sending


def _request_id(scope: Scope) -> str:
    """The request's id: the client's `x-request-id` when it is a sane token, else a new one.

    Kept in `scope["gateway"]` for the turn and the log line.
    """
    given = next((value for name, value in scope.get("headers", ()) if name == b"x-request-id"), b"")
    request_id = given.decode("ascii") if given and _SANE_ID.fullmatch(given) else random_id("req")
    scope.setdefault("gateway", {})["request_id"] = request_id
    return request_id


_SANE_ID = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")


def _refusal(scope: Scope) -> GatewayError | None:
    """Why the request is refused before the app sees it, or None."""
    loop = (scope.get("gateway") or {}).get("loop")
    if loop is not None:
        return loop
    if _CONTROL_CHARACTER.search(scope.get("path", "")):
        return InvalidRequest("The request path contains control characters.", code="invalid_path")
    if scope["type"] == "http":
        names = [name for name, _ in scope.get("headers", ())]  # ASGI header names are lower case
        if b"transfer-encoding" in names and b"content-length" in names:
            return InvalidRequest(
                "A request may not carry both Content-Length and Transfer-Encoding.", code="invalid_request"
            )
    return None


def _shape(scope: Scope) -> dict[str, Any]:
    """How an error answered here is shaped: the request's dialect, with its id."""
    notes = scope.get("gateway") or {}
    return {"dialect": notes.get("dialect", "openai"), "request_id": notes.get("request_id")}



def _log_failure(scope: Scope, exc: BaseException) -> None:
    log.error("the app failed on %s %s (%s)", scope.get("method", "WEBSOCKET"), scope.get("path"), type(exc).__name__)
    log.debug("app failure", exc_info=exc)
