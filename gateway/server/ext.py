"""The ASGI extensions the gateway's own server offers, by the names they have in a scope's `extensions`.

An app tests for one before it relies on it, and does without where it is
missing (another ASGI server, hypercorn's HTTP/2): each only saves work,
none changes what is sent.

    HTTP11      {"body_ready": () -> bool}.  `http.response.start` is taken
                at once (its `send` never waits, so it cannot be cancelled
                half-way); `body_ready()` says whether the next `receive`
                returns the whole body without waiting.
    DISCONNECT  {"watch": (callback) -> forget}.  The server calls
                `callback()` once, from its own task, as soon as the client
                has gone (at once if it already has): the app needs no task
                waiting on `receive` to hear of it.  `forget()` undoes it.
    BATCH       {"hold": () -> async context manager}.  What is sent inside
                leaves in one write when the block ends (a cancelled sender
                writes nothing).
    STREAM      {"write": async (bytes) -> None}.  A piece of the started
                response's body, sent as `http.response.body` with
                `more_body: True` would send it, without the message and
                without passing through the app's wrappers of `send`: the
                path of every streamed event.  A wrapper that must see the
                body's pieces (none of the gateway's does: they act on
                `http.response.start` and the last body) removes it from the
                scope it passes on.

`extension(scope, name)` is how an app asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["BATCH", "DISCONNECT", "HTTP11", "STREAM", "extension"]

HTTP11 = "gateway.http11"
DISCONNECT = "gateway.disconnect"
BATCH = "gateway.batch"
STREAM = "gateway.stream"


def extension(scope: Mapping[str, Any], name: str) -> Any:
    """The extension `name` the server offers in this scope, or None."""
    extensions = scope.get("extensions")
    return extensions.get(name) if extensions else None
