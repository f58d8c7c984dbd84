"""The body every transport answers with: its status and headers decided after it starts, then its writes.

The HTTP layer (on ASGI, `transport.asgi`) runs a body's send loop through
`serve`, which may set the body up around it (a streamed body's nursery)
and end it at once when the client leaves (`watch`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType

import trio

from .leaving import Watch

__all__ = ["DeferredHeadBody", "SendPath", "Write"]


# The HTTP layer's send loop over a body (`head()`, the status line, every write, the end).
Write = Callable[["DeferredHeadBody"], Awaitable[None]]


class SendPath:
    """A send loop (a `Write`) whose steps a body may also take from its own task.

    A streamed body whose producer has bytes while the loop is idle sends
    them itself (`start`, then `write`), rather than wake the loop's task for
    every event; the body sees to it that the two never send at once.
    `asgi.SendLoop` is one; a plain `Write` callable (a test's, an
    embedder's) gets every write through its loop.
    """

    __slots__ = ()
    ended = False  # the response's end has been sent

    async def __call__(self, body: DeferredHeadBody) -> None:
        raise NotImplementedError

    async def start(self, status: int, headers: dict[str, str]) -> None:
        """The status line and headers."""
        raise NotImplementedError

    async def write(self, data: bytes, *, last: bool = False) -> None:
        """Body bytes; `last`: the response ends with them."""
        raise NotImplementedError


class DeferredHeadBody:
    """A response body that decides its status and headers after starting: every transport's body.

    The HTTP layer has the body run its send loop (`serve`), which awaits
    `head()` and only then sends the status line, then every write it
    iterates: the body may first wait (bounded) for its upstream's answer,
    or run a turn to its end.  Set up and torn down around the send loop by
    `async with`, unless the body serves otherwise.
    """

    stalled = False  # the client stopped reading: the connection is dropped, unfinished
    # The bytes the iteration just gave are its last: they go with the response's end, in one
    # write (a body that cannot tell leaves it False, and its end goes on its own).
    finished = False

    async def serve(self, write: Write, watch: Watch | None = None) -> None:
        """Run the send loop `write(self)`; with `watch`, all of it ends at once when the client leaves."""
        if watch is None:
            async with self:
                await write(self)
            return
        async with trio.open_nursery() as nursery:  # owned here: the disconnect watch beside the send loop
            forget = watch(nursery)
            try:
                async with self:
                    await write(self)
            finally:
                if forget is not None:
                    forget()
            nursery.cancel_scope.cancel()

    async def __aenter__(self) -> DeferredHeadBody:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass

    async def head(self) -> tuple[int, dict[str, str]]:
        raise NotImplementedError

    def __aiter__(self) -> AsyncIterator[bytes]:
        raise NotImplementedError
