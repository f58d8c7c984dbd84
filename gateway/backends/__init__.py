"""Backends: adapters that turn a chat request into batches of decoded chunks.

    ChatBackend     the interface the turn engine uses: `open_chat_stream(body)`
                    gives a `ChatChunks` (batches of decoded chunks, `DONE` at
                    the end of a batch when the backend sent `[DONE]`);
                    `count_tokens(body)` the exact prompt tokens of the same body
    NativeRequest   the same request in a backend's own API, as the client sent
                    it (Anthropic Messages): an adapter that speaks that API
                    sends it rather than its mapping of the chat body
    Passthrough     the interface `/v1/{path}` uses: a request forwarded as it is
    openai.py       `OpenAICompatibleBackend`, both interfaces over HTTP

An adapter owns reaching its server (URLs, auth, timeouts, pools), decoding
its stream, and mapping its library's failures to `BackendError`s.  A new
kind of backend is one more module here; nothing else changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from .http1 import WaitClock
from .native import NativeRequest
from .openai import OpenAICompatibleBackend

__all__ = [
    "Backend",
    "ChatBackend",
    "ChatChunks",
    "ChatOpening",
    "NativeRequest",
    "OpenAICompatibleBackend",
    "Passthrough",
    "PassthroughBackend",
    "ReadWatch",
    "WaitClock",
]


class ReadWatch(Protocol):
    """A ticker that looks at each of many streams when it says (the process's `Heartbeats`):
    a round's answer may hand it the bound on its reads, rather than keep a timer per read.

    `add(stream, due)` looks at `stream.beat(now, stall_timeout)` from `due` on, until the
    ticket it returns is cancelled or `beat` returns None."""

    def add(self, stream: Any, due: float) -> Any: ...


class ChatChunks(Protocol):
    """One backend round's answer: batches of decoded chunks.

    Raises (from iteration):
        BackendError: the backend failed, timed out or sent something that
            is not a chunk.
    """

    backend: str | None  # which backend answered (its name and URL, no secrets), for the outcome

    @property
    def waited(self) -> float:
        """Seconds the round has waited on its backend so far (connecting, sending, its reads):
        what it adds to a response is its duration less this, and a read that waited has let
        the client's writer run meanwhile."""
        ...

    @property
    def saw_done(self) -> bool:
        """The backend ended with `[DONE]` (not by closing its body)."""
        ...

    def __aiter__(self) -> AsyncIterator[list[Any]]: ...

    # An answer may also offer `watched_by(watch: ReadWatch) -> ticket | None` (looked up by
    # name): its reads' timeout then kept by `watch`, the ticket cancelled when the round ends.


class ChatOpening(Protocol):
    """A chat request a backend began before its round (`begin_chat`), until the round takes it."""

    def close(self) -> None:
        """Let the request go unanswered, when no round took it (nothing once one did)."""
        ...


class ChatBackend(Protocol):
    """What the turn engine calls a backend through.

    A backend may also offer `begin_chat(body, *, headers=None, native=None)
    -> ChatOpening | None` (an optional capability, looked up by name): the
    request is sent at once, without waiting for anything, and the round that
    follows passes the opening to `open_chat_stream(..., opening=)`, which
    reads its answer.  None: it could not be begun so (no kept-alive
    connection free, say); `open_chat_stream` sends it as usual.
    """

    def open_chat_stream(
        self, body: dict[str, Any], *, headers: Mapping[str, str] | None = None, native: NativeRequest | None = None
    ) -> contextlib.AbstractAsyncContextManager[ChatChunks]:
        """Start a streaming chat completion (`headers`: added to the request, such as `traceparent`;
        `native`: the same request in an API the adapter may speak itself).

        Raises:
            BackendStatusError: the backend answered with an error status.
            BackendError: it could not be reached or timed out.
        """
        ...

    async def count_tokens(
        self, body: dict[str, Any], *, headers: Mapping[str, str] | None = None, native: NativeRequest | None = None
    ) -> int:
        """The prompt tokens `body` (a chat request, or `native`) makes, counted by the backend
        itself (its tokenizer, or a completion's usage): exact, never an estimate.

        Raises:
            BackendStatusError: the backend refused the request (a 4xx is the client's).
            BackendError: it could not be reached, timed out, or cannot count
                (`token_count_unavailable`, 502).
        """
        ...


class Passthrough(Protocol):
    """A forwarded request's answer: status, headers, and the body as it arrives."""

    status: int
    headers: dict[str, str]
    # Seconds the body may go without data (comments are not data): the reader's to enforce (the
    # body's own reads may keep no timer), stopping the read in progress with `abort`.
    data_timeout: float | None

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    def abort(self) -> None:
        """Stop the body: the read in progress, and any later one, raises `BackendError`."""
        ...


class PassthroughBackend(Protocol):
    def open_passthrough(
        self, method: str, path: str, query: bytes, headers: Mapping[str, str], body: bytes
    ) -> contextlib.AbstractAsyncContextManager[Passthrough]:
        """Forward any other `/v1/{path}` request as it is (`path`: normalised, percent-encoded).

        Raises:
            BackendError: it could not be reached or timed out.
        """
        ...


class Backend(ChatBackend, PassthroughBackend, Protocol):
    """A backend that serves both: what the app is given."""
