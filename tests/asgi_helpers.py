"""What every test server written as a raw ASGI app needs: lifespan answered, a body read whole."""

from __future__ import annotations

from typing import Any


async def answer_lifespan(receive: Any, send: Any) -> None:
    """Complete startup and shutdown as they come (until shutdown)."""
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return


async def read_body(receive: Any) -> bytes:
    """The request's whole body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body
