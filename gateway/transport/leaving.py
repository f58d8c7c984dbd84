"""How a streamed body hears that its client left: at once, on any server.

A response ends as soon as its client leaves (`asgi.stream`): its backend
request is closed, a tool call in progress cancelled.  On the gateway's
own server the connection tells (the `gateway.disconnect` extension: a call
back from the process's hang-up watch, no task per response); on any
other (hypercorn's HTTP/2, `hypercorn gateway.asgi:app`) a task beside the
send loop waits for `http.disconnect`.  Either way the body's nursery is
cancelled the moment the client is gone.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from ..server.ext import DISCONNECT, extension

__all__ = ["Watch", "watch_for"]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

# Starts watching for the client leaving: cancels the nursery it is given then, and returns
# what stops the watch (None: the nursery's end stops it).
Watch = Callable[[trio.Nursery], Callable[[], None] | None]


def watch_for(scope: Any, receive: Receive) -> Watch:
    """The watch for this request: the server's call back where it offers one, else a task
    that reads `receive` until `http.disconnect`."""
    offered = extension(scope, DISCONNECT) if scope is not None else None
    if offered is not None:
        return functools.partial(_called_back, offered["watch"])
    return functools.partial(_reading, receive)


def _called_back(watch: Callable[[Callable[[], None]], Callable[[], None]], nursery: trio.Nursery) -> Callable[[], None]:
    return watch(nursery.cancel_scope.cancel)


def _reading(receive: Receive, nursery: trio.Nursery) -> None:
    nursery.start_soon(_read_until_gone, receive, nursery.cancel_scope)


async def _read_until_gone(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
