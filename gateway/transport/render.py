"""The one place an error becomes what a client receives, on every transport.

    answer            an error as a JSON answer: status, body, and headers
                      (`Retry-After` for a rate limit), for any transport
                      that writes bodies (JSON answers, Quart's handlers)
    send_error        the same, whole, on an ASGI `send` (the edge, the
                      Responses route)
    deny_websocket    a refused WebSocket handshake
    ws_error          the WebSocket mode's error envelope: status, `type`,
                      `code`, `message`, `param`
    from_framework    an error the web framework raised (404, 405, 413) as a
                      `GatewayError`
    dialect_of        which shape a request's errors take: OpenAI's, or
                      Anthropic's (`{"type": "error", "error": {type,
                      message}}`) for the Messages API and any request that
                      carries `anthropic-version`

Every 5xx is reported here with its cause (see `errors.report`), so that
no route, transport or framework hook can answer one without a log line.
The message a client sees is the error's own; libraries' text never is.
Knows the ASGI message shapes and the error envelope; nothing of routes.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Literal

import orjson
import trio

from ..errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    RateLimited,
    RequestTooLarge,
    anthropic_error_body,
    error_json,
    report,
)

__all__ = [
    "Dialect",
    "answer",
    "deny_websocket",
    "dialect_of",
    "error_headers",
    "from_framework",
    "retry_after",
    "send_error",
    "ws_error",
]

Dialect = Literal["openai", "anthropic"]

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

_CLOSE_GRACE = 10.0  # bounds the shielded body send (it only ever waits on a slow client)


def retry_after(error: GatewayError) -> str | None:
    """The `Retry-After` value a refusal carries: whole seconds, at least one."""
    if isinstance(error, RateLimited):
        return str(max(1, math.ceil(error.retry_after)))
    return None


def error_headers(error: GatewayError, *, close: bool = False) -> dict[str, str]:
    """The headers of `error` answered as JSON: its content type, `Retry-After` for a rate limit,
    `Connection: close` when the connection is to end after it."""
    headers = {"content-type": "application/json"}
    wait = retry_after(error)
    if wait is not None:
        headers["retry-after"] = wait
    if close:
        headers["connection"] = "close"  # h11 then closes once the response is sent
    return headers


def dialect_of(route: Dialect, headers: Iterable[tuple[bytes, bytes]]) -> Dialect:
    """The shape of a request's errors: its route's (Anthropic's for the Messages API), and
    Anthropic's for a request that carries `anthropic-version` (Anthropic's clients always
    send it)."""
    if route == "anthropic" or any(name == b"anthropic-version" for name, _ in headers):
        return "anthropic"
    return "openai"


def _body(error: GatewayError, dialect: Dialect, request_id: str | None) -> bytes:
    if dialect == "anthropic":
        return orjson.dumps(anthropic_error_body(error.status, error.message, request_id, error.details))
    return error_json(error)


def answer(
    error: GatewayError, where: str = "", *, dialect: Dialect = "openai", request_id: str | None = None
) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of an error answered as JSON; a 5xx is reported with its cause
    (`where`: the request it answers; `request_id` goes into an Anthropic-shaped body)."""
    report(error, where)
    return error.status, _body(error, dialect, request_id), error_headers(error)


async def send_error(
    send: Send,
    error: GatewayError,
    *,
    close: bool = False,
    where: str = "",
    dialect: Dialect = "openai",
    request_id: str | None = None,
) -> None:
    """An error as a whole JSON response on an ASGI `send` (`close`: end the connection after it).

    The status line is sent shielded: hypercorn, seeing an app end whose start
    it had not recorded, would try a 500 in the middle of a response.
    """
    report(error, where)
    body = _body(error, dialect, request_id)
    headers = [(k.encode(), v.encode()) for k, v in error_headers(error, close=close).items()]
    headers.append((b"content-length", str(len(body)).encode()))
    with trio.CancelScope(shield=True):
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        with trio.move_on_after(_CLOSE_GRACE):
            await send({"type": "http.response.body", "body": body, "more_body": False})


async def deny_websocket(scope: Message, send: Send, error: GatewayError, where: str = "") -> None:
    """Refuse a WebSocket handshake with an HTTP error response (or a close where the server cannot)."""
    report(error, where)
    if "websocket.http.response" in (scope.get("extensions") or {}):
        body = error_json(error)
        headers = [(k.encode(), v.encode()) for k, v in error_headers(error).items()]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "websocket.http.response.start", "status": error.status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1013})


def ws_error(error: GatewayError) -> dict[str, Any]:
    """The WebSocket mode's error envelope (the spec's), with the error's own type and code."""
    return {
        "type": "error",
        "status": error.status,
        "error": {"type": error.type, "code": error.code, "message": error.message, "param": error.param},
    }


def from_framework(code: int | None, description: str | None, method: str, path: str, body_limit: int) -> GatewayError:
    """An HTTP error the web framework raised (no route, wrong method, body too large) in OpenAI's shape."""
    if code == 413:
        return RequestTooLarge(f"The request body exceeds the limit of {body_limit} bytes.")
    if code == 404:
        return NotFound(f"Unknown path: {method} {path}", code="unknown_url")
    mapped = InvalidRequest(
        f"Method {method} is not allowed on {path}" if code == 405 else description or "bad request",
        code="method_not_allowed" if code == 405 else None,
    )
    mapped.status = code or 400
    return mapped
