"""Writing a transport's body on ASGI: the one way every body reaches a client.

    send_body     a `DeferredHeadBody` (its status and headers once decided,
                  then every write, then the end) on an ASGI `send`
    stream        the same, ended at once when the client disconnects (the
                  routes served beside the framework; how it hears of it:
                  `transport.leaving`)
    as_response   the same body as a Quart response, and `BodyConnection`,
                  the Quart connection class that writes it with `send_body`

This is the one bridge between the transports and Quart: a route returns
`as_response(body)`, and Quart's response path hands the body back here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from quart import Response
from quart_trio.asgi import TrioASGIHTTPConnection

from ..server.ext import STREAM, extension
from .body import DeferredHeadBody, SendPath
from .leaving import watch_for

__all__ = ["BodyConnection", "SendLoop", "as_response", "send_body", "stream"]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


async def send_body(body: DeferredHeadBody, send: Send) -> None:
    """Status and headers once the body has decided them, every write, then the end."""
    await body.serve(SendLoop(send))


async def stream(body: DeferredHeadBody, scope: Any, receive: Receive, send: Send) -> None:
    """`send_body`, ended at once when the client disconnects (`transport.leaving`); the body's
    pieces go straight to the server where it offers that (`gateway.stream`)."""
    offered = extension(scope, STREAM)
    await body.serve(SendLoop(send, offered["write"] if offered else None), watch_for(scope, receive))


class SendLoop(SendPath):
    """The send loop over a body on an ASGI `send`: its status line once decided, every write,
    then the end; and the same messages for a body that sends from its own task (`SendPath`).
    `piece`: the server's way to send the body's pieces between the head and the end without a
    message each (the `gateway.stream` extension), where it offers one."""

    __slots__ = ("_send", "_piece", "ended")

    def __init__(self, send: Send, piece: Callable[[bytes], Awaitable[None]] | None = None) -> None:
        self._send = send
        self._piece = piece
        self.ended = False

    async def start(self, status: int, headers: dict[str, str]) -> None:
        await self._send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()],
            }
        )

    async def write(self, data: bytes, *, last: bool = False) -> None:
        if last:
            self.ended = True
        elif self._piece is not None:  # (every event's path)
            await self._piece(data)
            return
        await self._send({"type": "http.response.body", "body": data, "more_body": not last})

    async def __call__(self, body: DeferredHeadBody) -> None:
        status, headers = await body.head()
        await self.start(status, headers)
        async for data in body:
            if body.finished:
                await self.write(data, last=True)
                return
            await self.write(data)
        if body.stalled:
            return  # the client stopped reading: the server closes the unfinished response's connection
        await self.write(b"", last=True)


def as_response(body: DeferredHeadBody) -> Response:
    """A Quart response carrying `body`, for `BodyConnection` to write (status and headers as it decides)."""
    response: Any = Response(status=200)
    response.response = body
    response.timeout = None  # long streams are never cut by the framework
    return response


class BodyConnection(TrioASGIHTTPConnection):
    """Quart's HTTP connection, writing a transport's body with `send_body` (Quart's own otherwise)."""

    async def _send_response(self, send: Any, response: Any) -> None:
        body = getattr(response, "response", None)
        if isinstance(body, DeferredHeadBody):
            await send_body(body, send)
        else:
            await super()._send_response(send, response)
