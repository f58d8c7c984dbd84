"""Streamed bodies on ASGI: the one way a deferred-head body is written, and the hot route's helpers.

`send_body` writes a `DeferredHeadBody` (its status and headers once
decided, then every write, then the end) to an ASGI `send`; Quart's
response path and the hot route both use it.

The hot route takes `POST /v1/responses` with `"stream": true` beside the
framework: no request or response objects, no request context, no
second task to read a body that has already been read.  It only ever
takes a request whole: `read_body` keeps the messages it read, and a
request the route does not serve (a JSON or background response, a body
over the limit or one that does not parse) goes to Quart with those
messages replayed (`replay`), so that its errors and behaviour stay in
one place.  While a stream runs, `stream` watches for the client leaving
and then ends it, as Quart does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from .sse import DeferredHeadBody, EventChannelBody

__all__ = ["read_body", "replay", "send_body", "stream"]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


async def read_body(receive: Receive, limit: int, timeout: float) -> tuple[list[Message], bytes | None]:
    """The request's messages as read, and its body; None for the body when it
    passed `limit` bytes, the client left, or it did not arrive within `timeout`
    (the rest is left unread)."""
    messages: list[Message] = []
    parts: list[bytes] = []
    size = 0
    with trio.move_on_after(timeout):
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return messages, None
            parts.append(chunk)
            if not message.get("more_body", False):
                return messages, parts[0] if len(parts) == 1 else b"".join(parts)
    return messages, None


def replay(messages: list[Message], receive: Receive) -> Receive:
    """A `receive` that gives `messages` again, then the server's own."""
    pending = deque(messages)

    async def replayed() -> Message:
        if pending:
            return pending.popleft()
        return await receive()

    return replayed


async def send_body(body: DeferredHeadBody, send: Send) -> None:
    """Status and headers once the body has decided them, every write, then the end."""
    async with body:
        status, headers = await body.head()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()],
            }
        )
        async for data in body:
            await send({"type": "http.response.body", "body": data, "more_body": True})
    if isinstance(body, EventChannelBody) and body.stalled:
        return  # the client stopped reading: the server closes the unfinished response's connection
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def stream(body: DeferredHeadBody, receive: Receive, send: Send) -> None:
    """`send_body`, ended at once when the client disconnects."""
    async with trio.open_nursery() as nursery:  # owned here: the body's writer and the disconnect watch
        nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
        await send_body(body, send)
        nursery.cancel_scope.cancel()


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
