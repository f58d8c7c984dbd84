"""Messages a transport sends together leave in one write: `coalesced()`.

A WebSocket turn sends each event as a message of its own (the protocol
wants one event per message), and a batch of events read from the backend at
once would cost a write(2) per message.  Inside `coalesced()`, the
connection's writer (`gateway.server`) holds each message's bytes (whole
frames, in order) instead of writing them, and the block's end writes them
all with one call.  A server that does not know of it (another ASGI server,
a TLS connection) writes every message as it comes: the batch is only ever
an optimisation, never a change of what is sent.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar

__all__ = ["Batch", "coalesced", "current_batch"]


class Batch:
    """The frames held so far, and where they go at the block's end."""

    __slots__ = ("parts", "write")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.write: Callable[[bytes], Awaitable[None]] | None = None


_BATCH: ContextVar[Batch | None] = ContextVar("gateway_write_batch", default=None)


def current_batch() -> Batch | None:
    """The batch the calling task is sending in, if any (read by the connection's writer)."""
    return _BATCH.get()


@contextlib.asynccontextmanager
async def coalesced() -> AsyncIterator[None]:
    """Sends inside the block are written together when it ends (also when it fails: what was
    sent before the failure still goes out; a cancelled sender writes nothing)."""
    batch = Batch()
    token = _BATCH.set(batch)
    try:
        yield
    finally:
        _BATCH.reset(token)
        if batch.parts and batch.write is not None:
            await batch.write(b"".join(batch.parts))
