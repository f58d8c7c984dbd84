"""The OpenAI-compatible adapter: any server that speaks `/v1/chat/completions`.

It owns how such a server is reached: URL layout, auth, timeouts,
connection limits, reading and decoding the SSE body into chunk batches,
redacting its own secrets from whatever comes back, and the conversion of
httpx2's failures into `BackendError`s (done here, once).  It also counts a
chat request's prompt tokens exactly, the best way the server offers (see
`OpenAICompatibleBackend.count_tokens`).  It knows nothing about the
Responses API or about how events reach the client.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import httpx2
import orjson
import trio

from ..config import Settings
from ..errors import (
    BackendError,
    BackendStatusError,
    BackendStreamError,
    BackendTimeout,
    BackendUnavailable,
    GatewayError,
)
from ..ops.redact import Redactor, public_url
from ..streams.chunks import ChunkDecoder
from .http1 import FixedRequest, Http1Response, Http1Transport, SentRequest, WaitClock
from .native import NativeRequest

if TYPE_CHECKING:
    from . import ReadWatch

__all__ = [
    "COUNT_UNAVAILABLE",
    "ChatStream",
    "OpenAICompatibleBackend",
    "PassthroughResponse",
    "backend_error_from",
    "map_backend_errors",
    "naming_errors",
]

_MAX_ERROR_BODY = 64 * 1024
_MAX_FIXED_REQUESTS = 64  # relayed requests' heads kept, one per method and URL
_MAX_COUNT_ANSWER = 16 * 1024 * 1024  # a tokenizer's answer lists every token of the prompt

# The error code of a backend that cannot count a prompt's tokens exactly (502).
COUNT_UNAVAILABLE = "token_count_unavailable"

# Request headers a passthrough forwards; everything else (hop-by-hop,
# host, the client's own authorization for the gateway) stays here.
_FORWARD_REQUEST_HEADERS = frozenset(
    {"content-type", "accept", "accept-language", "user-agent", "openai-beta", "x-request-id"}
)
_DROP_RESPONSE_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "server", "date"}
)


# A large read is decoded in steps of 1, 4 and 16 KiB (about 5, 20 and 80 chunks of text).
_FIRST_STEP = 1024
_LAST_STEP = 64 * 1024


class ChatStream:
    """A successful streaming chat completion, as batches of decoded chunks.

    Each batch holds the chunks one network read completed (decoded JSON
    values, not yet judged: the translator decides what a chunk may be),
    ending with `DONE` when the backend sent `[DONE]`.  Iteration stops after
    `[DONE]` (the rest of the body is read first, bounded, so the connection
    can be reused) or when the backend closes the body; `saw_done` tells
    which.

    The read timeout counts data, not bytes: comments, keep-alives or a
    trickle of bytes that completes no chunk do not extend it.  The
    adapter's secrets (its key) are redacted before anything is decoded: a
    backend that echoes request headers into an error cannot leak them.

    Raises (from iteration):
        BackendTimeout: no chunk for `data_timeout` seconds.
        BackendStreamError: the backend sent something that is not a chunk
            (not JSON, or an oversized event), after the chunks before it.
        BackendUnavailable: the connection was lost.
    """

    def __init__(self, response: Http1Response | httpx2.Response, *, data_timeout: float, redactor: Redactor) -> None:
        self.status = response.status_code
        self._chunks = response.stream.__aiter__()  # type: ignore[union-attr]
        self._redact = redactor.stream()
        self._decoder = ChunkDecoder()
        self._timeout = data_timeout
        self._dry_since: float | None = trio.current_time()  # since when reads have made no chunk
        self._pending_error: GatewayError | None = None
        self.backend: str | None = None  # which backend this is (its adapter's label)
        self._ended = False
        self._held = b""  # the rest of a large early read, decoded at the next step
        self._step = _FIRST_STEP
        # The request's waits on the backend: the gateway's own transport adds them up as it
        # reads; on another (httpx2's), each read is timed here.
        waits = getattr(response.stream, "waits", None)
        self._waits: WaitClock = waits if isinstance(waits, WaitClock) else WaitClock()
        self._timed = not isinstance(waits, WaitClock)

    @property
    def saw_done(self) -> bool:
        return self._decoder.saw_done

    def watched_by(self, watch: ReadWatch) -> Any:
        """Hand the read timeout to `watch` (the process's ticker): the reads then keep no timer
        of their own, and one that waits past it ends the same way, with `BackendTimeout`.  The
        ticket, for the round to cancel at its end; None when the transport cannot (httpx2's,
        TLS), and its reads keep their timers."""
        watched = getattr(self._chunks, "watched", None)
        due = watched() if watched is not None else None
        return watch.add(self._chunks, due) if due is not None else None

    @property
    def waited(self) -> float:
        return self._waits.waited

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> list[Any]:
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        if self._ended:
            raise StopAsyncIteration
        decoder = self._decoder
        if decoder.finished:
            self._ended = True
            if decoder.saw_done:
                await self._drain()
            raise StopAsyncIteration
        while True:
            # try/except rather than map_backend_errors(): this runs per read.
            # A silent backend is cut off by the transport's read timeout (the
            # same length); bytes that make no chunk are caught by the clock
            # check below, without a cancel scope per read.
            try:
                if self._held:
                    data, self._held = self._held, b""
                elif self._timed:
                    began = trio.current_time()
                    try:
                        data = await self._chunks.__anext__()
                    finally:
                        self._waits.waited += trio.current_time() - began
                else:
                    data = await self._chunks.__anext__()
                if len(data) > self._step and self._step < _LAST_STEP:
                    # One read can bring hundreds of chunks (a fast backend, a
                    # stream's start): decoding them all would hold the first
                    # tokens back, so the first such reads are taken in growing
                    # steps (the decoder takes any cut); later ones go whole.
                    data, self._held = data[: self._step], data[self._step :]
                    self._step *= 4
            except StopAsyncIteration:
                self._ended = True
                batch = decoder.decode(self._redact.flush()) + decoder.flush()
                if not batch:
                    raise
                return self._deliver(batch)
            except httpx2.TransportError as exc:
                raise backend_error_from(exc) from exc
            batch = decoder.decode(self._redact.feed(data))
            if batch:
                return self._deliver(batch)
            now = trio.current_time()
            if self._dry_since is None:
                self._dry_since = now
            elif now - self._dry_since > self._timeout:
                self._ended = True
                raise BackendTimeout(f"the backend sent no data for {self._timeout:g} s")

    def _deliver(self, batch: list[Any]) -> list[Any]:
        self._dry_since = None  # counted again from the next read that makes no chunk
        last = batch[-1]
        if isinstance(last, GatewayError):
            # What came before the bad data is delivered first; the error next.
            self._ended = True
            if len(batch) == 1:
                raise last
            self._pending_error = last
            return batch[:-1]
        return batch

    async def _drain(self) -> None:
        """Read the body's end after `[DONE]` so the connection can be reused.

        Usually the chunked terminator arrived with `[DONE]` and this returns
        at once; if it must wait for the network, it gives up after a moment
        and the connection is simply closed.
        """
        if getattr(self._chunks, "finished", False):  # (the transport's body: read to its end)
            return
        with trio.move_on_after(_DRAIN_GRACE):
            try:
                async for _ in self._chunks:
                    pass
            except httpx2.TransportError:
                pass


_DRAIN_GRACE = 0.05


def retry_after_of(value: str | None) -> float | None:
    """Seconds a `Retry-After` header asks for (a number; a date is not worth parsing here)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None


def backend_error_from(exc: httpx2.TransportError) -> BackendError:
    """The `BackendError` for an httpx2 transport failure.

    The messages name what failed without echoing internal addresses or
    library text to the client.
    """
    if isinstance(exc, httpx2.TimeoutException):
        kind = "connecting to" if isinstance(exc, httpx2.ConnectTimeout) else "waiting for"
        return BackendTimeout(f"timed out {kind} the backend")
    if isinstance(exc, httpx2.ConnectError):
        return BackendUnavailable("could not connect to the backend")
    if isinstance(exc, (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError)):
        return BackendUnavailable("the connection to the backend was lost")
    return BackendUnavailable("the backend could not be reached")


# Marks the readiness checks' requests, so that a backend's logs can tell them from clients'.
PROBE_HEADERS = {"x-gateway-probe": "readiness"}


@contextlib.contextmanager
def naming_errors(name: str, url: str) -> Iterator[None]:
    """Errors of the backend `name` (at `url`, without credentials) raised inside say which backend:
    its name in the client's message, its name and URL in the operator's log (`cause`)."""
    try:
        yield
    except BackendError as error:
        _name_error(error, name, url)
        raise


def _name_error(error: BackendError, name: str, url: str) -> None:
    if error.cause is None:
        detail = f"answered HTTP {error.backend_status}" if isinstance(error, BackendStatusError) else error.message
        original = error.__cause__
        if original is not None and not isinstance(error, BackendStatusError):
            detail += f" ({type(original).__name__}: {original})"
        error.cause = f"backend {name!r} at {url}: {detail}"
        if not isinstance(error, BackendStatusError) and error.message.endswith("the backend"):
            error.message = f"{error.message} '{name}'"


@contextlib.contextmanager
def map_backend_errors() -> Iterator[None]:
    """Convert httpx2 exceptions raised inside the block into `BackendError`s."""
    try:
        yield
    except httpx2.TransportError as exc:
        raise backend_error_from(exc) from exc


class PassthroughResponse:
    """A backend's answer to a passthrough request: status, headers and body, secrets redacted.

    Iterating gives the body's bytes as they arrive.  Its reader bounds each
    read (`data_timeout`) and stops one it no longer wants with `abort`: the
    transport's own body is stopped directly, without a timer or a cancel
    scope per read; a body read through the client, read by read in a scope.

    Raises (from iteration):
        BackendUnavailable: the connection was lost mid-body, or the body was stopped.
    """

    def __init__(
        self,
        status: int,
        headers: Iterable[tuple[str, str]],
        chunks: AsyncIterator[bytes],
        redactor: Redactor,
        *,
        data_timeout: float | None,
        backend: str = "the backend",
        label: str | None = None,
        closing: Http1Response | httpx2.Response,
        abort: Callable[[], None] | None = None,
    ) -> None:
        """`headers`: the answer's, names lower-case (a repeated one joined); `chunks`: its body as
        it arrives, already decoded; `data_timeout`: seconds the backend may go without sending
        data (its read timeout, STREAM_TIMEOUT); `backend`: which one answered (its name and
        URL), for the log; `label`: the same, for the outcome; `closing`: the answer `aclose` ends
        (its connection back to the pool, or closed); `abort`: stops the body's reads (the
        transport's `_Body.abort`), None when they must be stopped by cancelling them."""
        self.status = status
        self.backend = backend
        self.backend_label = label
        self.headers = {name: redactor.redact(value) for name, value in headers if name not in _DROP_RESPONSE_HEADERS}
        self._chunks = chunks
        self._redact = redactor.stream()
        self._ended = False
        self._closing = closing
        self.data_timeout = data_timeout
        self._abort = abort
        self._stopped = False
        self._reading: trio.CancelScope | None = None  # around a read, when there is no `abort`
        waits = getattr(closing.stream, "waits", None)  # (the gateway's own transport adds them up)
        self._waits: WaitClock = waits if isinstance(waits, WaitClock) else WaitClock()
        self._timed = not isinstance(waits, WaitClock)

    @property
    def waited(self) -> float:
        """Seconds the request has waited on the backend so far (connecting, sending, reading)."""
        return self._waits.waited

    async def aclose(self) -> None:
        await self._closing.aclose()

    def close_now(self) -> bool:
        """Close without waiting, when the answer allows it (the transport's own, whose close only
        returns its connection to the pool or closes it); False when `aclose` must be awaited."""
        closing = self._closing
        if isinstance(closing, Http1Response):
            closing.stream.close()
            return True
        return False

    def abort(self) -> None:
        """Stop the body: the read in progress, and any later one, raises `BackendUnavailable`."""
        self._stopped = True
        if self._abort is not None:
            self._abort()
        elif self._reading is not None:
            self._reading.cancel()

    def __aiter__(self) -> PassthroughResponse:
        return self

    async def __anext__(self) -> bytes:
        while not self._ended:
            try:
                if self._abort is not None:  # (the hot path: no scope)
                    data = await self._chunks.__anext__()
                else:
                    if self._stopped:
                        raise BackendUnavailable("the relayed body was stopped")
                    began = trio.current_time()
                    try:
                        with trio.CancelScope() as self._reading:
                            data = await self._chunks.__anext__()
                    finally:
                        if self._timed:
                            self._waits.waited += trio.current_time() - began
                    self._reading = None
                    if self._stopped:
                        raise BackendUnavailable("the relayed body was stopped")
            except StopAsyncIteration:
                self._ended = True
                data = self._redact.flush()
                if data:
                    return data
                break
            except httpx2.TransportError as exc:
                raise backend_error_from(exc) from exc
            data = self._redact.feed(data)
            if getattr(self._chunks, "finished", False):  # the last bytes: with what the redactor kept
                self._ended = True
                rest = self._redact.flush()
                if rest:
                    data += rest
            if data:
                return data
        raise StopAsyncIteration

    @property
    def finished(self) -> bool:
        """The body has been given whole: the next step ends the iteration."""
        return self._ended


class OpenAICompatibleBackend:
    """Any server that speaks OpenAI's `/v1/chat/completions`.

    One transport (`Http1Transport`: the connection pool, parsed by
    httptools) serves both paths.  Chat streams call the transport directly:
    they need none of the client's auth, redirect, cookie or decoding
    layers.  Passthrough requests use the client.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        redactor: Redactor | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
        name: str = "default",
    ) -> None:
        """The backend the settings name, or (a named backend of the config file) the one
        `base_url` names, with its own key, headers and timeouts; `name` is how errors and
        readiness name it."""
        self.name = name
        self._redactor = redactor if redactor is not None else Redactor.from_settings(settings)
        self._transport = Http1Transport(max_connections=settings.upstream_max_connections, keepalive_expiry=30.0)
        read = read_timeout if read_timeout is not None else settings.stream_timeout
        timeout = httpx2.Timeout(
            connect=connect_timeout if connect_timeout is not None else settings.connect_timeout,
            read=read,
            write=read,
            pool=None,  # waiting for a free connection is bounded by the limit, not a timer
        )
        self._timeout = timeout.as_dict()  # (as a request's extension)
        self._timeout_config = timeout  # (as a FixedRequest takes it)
        self._fixed_requests: dict[tuple[str, str], FixedRequest] = {}  # relayed requests' heads, by method and URL
        self._data_timeout = read
        self._client = httpx2.AsyncClient(transport=self._transport, timeout=timeout, follow_redirects=False)
        if base_url is None:
            self._v1 = settings.backend_v1
            api_key = settings.openai_api_key
        else:
            root = base_url.rstrip("/")
            self._v1 = root if root.endswith("/v1") else root + "/v1"
        self._chat_url = httpx2.URL(self._v1 + "/chat/completions")
        self._root = self._v1.removesuffix("/v1")  # where vLLM and llama.cpp serve their tokenizers
        # How this server counts tokens, once one way has answered: "vllm", "llamacpp" or "completion".
        self.counts_by: str | None = None
        self._windows: dict[str, int | None] = {}  # each model's context window, once the server said
        self.url = public_url(self._v1)
        self.label = f"{name}@{self.url}"  # which backend answered, in a log line (no spaces, no secrets)
        self._auth = {**(headers or {}), **({"authorization": f"Bearer {api_key}"} if api_key else {})}
        self._refuses_reasoning_content: set[Any] = set()  # models that said so by name
        self._chat_headers = {
            **self._auth,
            "content-type": "application/json",
            "accept": "text/event-stream",
            "accept-encoding": "identity",  # the stream is read raw, so it must not be compressed
        }
        self._chat = FixedRequest("POST", self._chat_url, self._chat_headers, timeout)  # its head, built once

    async def aclose(self) -> None:
        await self._client.aclose()  # and its transport

    async def probe(self) -> None:
        """Whether the backend answers HTTP at all (`GET /v1/models`; any status will do).

        Raises:
            BackendError: it could not be reached, or timed out.
        """
        with naming_errors(self.name, self.url), map_backend_errors():
            response = await self._client.get(self._v1 + "/models", headers={**self._auth, **PROBE_HEADERS})
            await response.aclose()

    def begin_chat(
        self, body: dict[str, Any], *, headers: Mapping[str, str] | None = None, native: NativeRequest | None = None
    ) -> SentRequest | None:
        """Send the chat request now, on a kept-alive connection, without waiting for anything
        (see `ChatBackend`); None when it cannot be sent so.  Never raises: a connection that
        fails shows when the answer is read."""
        message = self._chat.message(orjson.dumps(self._outgoing(body)), headers)
        if message is None:
            return None
        connect, _, write = self._chat.timeouts
        return self._transport.send_now(self._chat.origin, message, connect_timeout=connect, write_timeout=write)

    def _outgoing(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat request as this server is sent it."""
        if body.get("model") in self._refuses_reasoning_content:
            body = _without_reasoning_content(body)
        return _without_signatures(body)

    @contextlib.asynccontextmanager
    async def open_chat_stream(
        self,
        body: dict[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
        native: NativeRequest | None = None,
        opening: SentRequest | None = None,
    ) -> AsyncIterator[ChatStream]:
        """(`native`: a request in another API, which this adapter does not speak: the chat body
        goes.  `opening`: what `begin_chat` sent for this body: its answer is read.)"""
        body = self._outgoing(body)
        model = body.get("model")
        with naming_errors(self.name, self.url):
            try:
                response = await self._start_chat(body, headers, opening)
            except BackendStatusError as error:
                stripped = _without_reasoning_content(body)
                if stripped is body or not _refuses_reasoning_content(error):
                    raise
                # This model refused `reasoning_content` in assistant messages by
                # name: it is context, not content, so this request goes without,
                # and so do the model's later ones.  Any other refusal (a context
                # that is too long) is the client's to see.
                self._refuses_reasoning_content.add(model)
                response = await self._start_chat(stripped, headers)
            try:
                stream = ChatStream(response, data_timeout=self._data_timeout, redactor=self._redactor)
                stream.backend = self.label
                yield stream
            finally:
                # Closing must finish even when the request is being cancelled (the
                # client left): that is what tells the backend to stop generating.
                with trio.CancelScope(shield=True, deadline=trio.current_time() + 2):
                    await response.aclose()

    async def _start_chat(
        self, body: dict[str, Any], headers: Mapping[str, str] | None, opening: SentRequest | None = None
    ) -> Http1Response | httpx2.Response:
        """A chat request sent (unless `opening` sent it already) and its answer's head read: a
        success, its body still to read.

        Raises:
            BackendStatusError: the backend answered an error status (its body read and closed).
            BackendError: it could not be reached, or timed out.
        """
        response: Http1Response | httpx2.Response
        try:  # (a stale keep-alive connection is retried by the transport)
            connect, read, write = self._chat.timeouts
            if opening is not None:
                response = await opening.response(read)
            else:
                payload = orjson.dumps(body)
                message = self._chat.message(payload, headers)
                if message is None:  # headers that replace the fixed ones: built the general way
                    response = await self._transport.handle_async_request(self._chat_request(payload, headers))
                else:
                    response = await self._transport.open(
                        self._chat.origin, message, connect_timeout=connect, read_timeout=read, write_timeout=write
                    )
        except httpx2.TransportError as exc:
            raise backend_error_from(exc) from exc
        if response.status_code < 400:
            return response
        try:
            error_body = self._redactor.redact_bytes(await read_bounded(response))
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await response.aclose()
        error = BackendStatusError.from_body(response.status_code, error_body)
        error.retry_after = retry_after_of(response.headers.get("retry-after"))
        raise error

    def _chat_request(self, payload: bytes, headers: Mapping[str, str] | None) -> httpx2.Request:
        merged = {**self._chat_headers, **headers} if headers else self._chat_headers
        return httpx2.Request("POST", self._chat_url, content=payload, headers=merged, extensions={"timeout": self._timeout})

    # --- counting a prompt's tokens ---------------------------------------------------

    async def count_tokens(self, body: dict[str, Any], *, headers: Mapping[str, str] | None = None, native: NativeRequest | None = None) -> int:
        """The exact number of prompt tokens the chat request `body` makes on this server (`native`
        is not this adapter's API: the chat body is counted).

        Tried in order, and the first that answers is remembered for this
        server: vLLM's `POST /tokenize` with the messages (the chat template
        applied, as a completion applies it); llama.cpp's `POST
        /apply-template` and then `POST /tokenize` of that prompt, with
        `add_special` and `parse_special` as its completions tokenize (so a
        vocabulary that adds a BOS token is counted with it); else a
        one-token completion's `usage.prompt_tokens`.  A request with images,
        audio or files is always counted by a completion: a tokenizer
        endpoint counts text only.  Never an estimate.

        Raises:
            BackendStatusError: the backend refused the request (a 4xx is the
                client's, such as a context that is too long).
            BackendError: it could not be reached, timed out, or cannot count
                (`token_count_unavailable`: its completion reported no usage).
        """
        model = body.get("model")
        if model in self._refuses_reasoning_content:
            body = _without_reasoning_content(body)
        body = _without_signatures(body)
        with naming_errors(self.name, self.url):
            try:
                return await self._count(body, headers)
            except BackendStatusError as error:
                stripped = _without_reasoning_content(body)
                if stripped is body or not _refuses_reasoning_content(error):
                    raise
                self._refuses_reasoning_content.add(model)  # as for its completions (see _open_chat_stream)
                return await self._count(stripped, headers)

    async def _count(self, body: dict[str, Any], headers: Mapping[str, str] | None) -> int:
        media = _has_media(body)
        ways = ["completion"] if media else [self.counts_by] if self.counts_by else ["vllm", "llamacpp", "completion"]
        for index, way in enumerate(ways):
            last = index == len(ways) - 1
            try:
                count = await self._count_by(way, body, headers)
            except BackendStatusError:
                if last:
                    raise
                continue  # not a way this server counts (a 404, or another server's /tokenize)
            if count is not None:
                if not media:
                    self.counts_by = way
                return count
        raise BackendError(
            f"The backend '{self.name}' cannot count tokens exactly: neither a tokenizer endpoint "
            "nor the usage of a completion gave a count.",
            code=COUNT_UNAVAILABLE,
        )

    async def _count_by(self, way: str, body: dict[str, Any], headers: Mapping[str, str] | None) -> int | None:
        """One way of counting; None when the server's answer is not that way's."""
        if way == "vllm":
            request = {"model": body.get("model"), "messages": body.get("messages"), "add_generation_prompt": True}
            request.update({name: body[name] for name in ("tools", "chat_template_kwargs") if body.get(name)})
            return _whole(_field(await self._post_json(self._root + "/tokenize", request, headers), "count"))
        if way == "llamacpp":
            # The template applied by the same code as a completion's (tools, tool_choice and all).
            prompt = _field(await self._post_json(self._root + "/apply-template", _unstreamed(body), headers), "prompt")
            if not isinstance(prompt, str):
                return None
            request = {"content": prompt, "add_special": True, "parse_special": True}
            tokens = _field(await self._post_json(self._root + "/tokenize", request, headers), "tokens")
            return len(tokens) if isinstance(tokens, list) else None
        request = {**_unstreamed(body), "stream": False, "max_tokens": 1}
        try:
            answer = await self._post_json(str(self._chat_url), request, headers)
        except BackendStatusError as error:
            if error.backend_status != 400 or "max_completion_tokens" not in error.message:
                raise
            # OpenAI's reasoning models take only the newer name for the same limit.
            del request["max_tokens"]
            answer = await self._post_json(str(self._chat_url), {**request, "max_completion_tokens": 1}, headers)
        return _whole(_field(_field(answer, "usage"), "prompt_tokens"))

    async def context_window(self, model: str) -> int | None:
        """The context window (tokens) the server runs `model` with, asked once and remembered;
        None when it does not say.

        Asked in order, the first that answers counts: vLLM's `GET /v1/models`
        (`max_model_len` of the model's entry), llama.cpp's `GET /props`
        (`n_ctx`, the context the server was started with: what a request
        must fit, not the model's training length), Ollama's `POST /api/show`
        (`num_ctx` among its parameters, else the model's `context_length`).
        A server that cannot be reached is asked again next time.
        """
        if model in self._windows:
            return self._windows[model]
        window: int | None = None
        reached = False
        for ask in (self._window_vllm, self._window_llamacpp, self._window_ollama):
            try:
                window = await ask(model)
            except BackendStatusError:
                reached = True  # (not this kind of server)
                continue
            except BackendError:
                continue
            reached = True
            if window is not None:
                break
        if reached:
            self._windows[model] = window
        return window

    async def _window_vllm(self, model: str) -> int | None:
        entries = _field(await self._json("GET", self._v1 + "/models", None, None), "data")
        if not isinstance(entries, list):
            return None
        mine = [e for e in entries if isinstance(e, dict) and e.get("id") == model] or (entries if len(entries) == 1 else [])
        return _whole(_field(mine[0], "max_model_len")) if mine else None

    async def _window_llamacpp(self, model: str) -> int | None:
        props = await self._json("GET", self._root + "/props", None, None)
        return _whole(_field(_field(props, "default_generation_settings"), "n_ctx")) or _whole(_field(props, "n_ctx"))

    async def _window_ollama(self, model: str) -> int | None:
        shown = await self._json("POST", self._root + "/api/show", {"model": model}, None)
        parameters = _field(shown, "parameters")
        if isinstance(parameters, str):
            for line in parameters.splitlines():
                name, _, value = line.strip().partition(" ")
                if name == "num_ctx" and value.strip().isdigit():
                    return int(value.strip())
        info = _field(shown, "model_info")
        if isinstance(info, dict):
            for name, value in info.items():
                if name.endswith(".context_length"):
                    return _whole(value)
        return None

    async def _post_json(self, url: str, payload: dict[str, Any], headers: Mapping[str, str] | None) -> Any:
        return await self._json("POST", url, payload, headers)

    async def _json(self, method: str, url: str, payload: dict[str, Any] | None, headers: Mapping[str, str] | None) -> Any:
        """`payload` sent (a GET without one); the answer's JSON (None when it is not JSON).

        Raises:
            BackendStatusError: an error status.
            BackendError: unreachable, timed out, or an answer too large to be a count.
        """
        merged = {**self._auth, **(headers or {}), "accept": "application/json"}
        content = None
        if payload is not None:
            merged["content-type"] = "application/json"
            content = orjson.dumps(payload)
        request = self._client.build_request(method, url, content=content, headers=merged)
        with map_backend_errors():
            response = await self._client.send(request, stream=True)
        try:
            if response.status_code >= 400:
                error = BackendStatusError.from_body(response.status_code, self._redactor.redact_bytes(await read_bounded(response)))
                error.retry_after = retry_after_of(response.headers.get("retry-after"))
                raise error
            data = bytearray()
            with map_backend_errors():
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > _MAX_COUNT_ANSWER:
                        raise BackendStreamError("the backend's answer to a token count is too large")
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await response.aclose()
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return None

    def open_passthrough(
        self, method: str, path: str, query: bytes, headers: Mapping[str, str], body: bytes
    ) -> _Passthrough:
        url = f"{self._v1}/{path.lstrip('/')}"
        if query:
            url += "?" + query.decode("latin-1")
        forwarded = {k: v for k, v in headers.items() if k.lower() in _FORWARD_REQUEST_HEADERS}
        return _Passthrough(self, method, url, forwarded, body)

    async def _relay(self, method: str, url: str, forwarded: dict[str, str], body: bytes) -> PassthroughResponse:
        """Send a relayed request; its answer once the head has arrived.

        A request with a body (a chat completion, an embedding) goes the way
        chat streams go: its head built once per URL (`FixedRequest`), the
        answer read off the transport, uncompressed (`accept-encoding:
        identity`; a backend that compresses anyway is decoded).  Anything
        else, or headers that cannot go that way, through the client.

        Raises:
            httpx2.TransportError: as the transport's.
        """
        backend, label = f"backend {self.name!r} at {self.url}", self.label
        fixed = self._fixed_requests.get((method, url)) if body else None
        if body and fixed is None:
            if len(self._fixed_requests) >= _MAX_FIXED_REQUESTS:  # paths are the client's to choose
                self._fixed_requests.clear()
            fixed = self._fixed_requests[(method, url)] = FixedRequest(
                method, url, {**self._auth, "accept-encoding": "identity"}, self._timeout_config
            )
        message = fixed.message(body, forwarded) if fixed is not None else None
        if fixed is None or message is None:
            request = self._client.build_request(method, url, content=body or None, headers={**forwarded, **self._auth})
            sent = await self._client.send(request, stream=True)
            return PassthroughResponse(
                sent.status_code, sent.headers.items(), sent.aiter_bytes(), self._redactor,
                data_timeout=self._data_timeout, backend=backend, label=label, closing=sent,
            )
        connect, read, write = fixed.timeouts
        answer = await self._transport.open(fixed.origin, message, connect_timeout=connect, read_timeout=read, write_timeout=write)
        if self._data_timeout:
            # The body's reads need no timer of their own: the relay's data deadline (the same
            # length, counted from the last data rather than the last byte) bounds them all.
            answer.stream.read_timeout = math.inf
        chunks: AsyncIterator[bytes] = answer.stream
        head = _joined(answer.raw_headers)
        if head.get("content-encoding", "identity").strip().lower() != "identity":
            chunks = httpx2.Response(answer.status_code, headers=answer.raw_headers, stream=answer.stream).aiter_bytes()
        return PassthroughResponse(
            answer.status_code, head.items(), chunks, self._redactor,
            data_timeout=self._data_timeout, backend=backend, label=label, closing=answer, abort=answer.stream.abort,
        )


class _Passthrough:
    """One relayed request (`open_passthrough`): sent on entry, its answer closed on exit.

    (A class rather than a generator's context manager: it is on the path of every relayed request.)
    """

    __slots__ = ("_backend", "_method", "_url", "_headers", "_body", "_response")

    def __init__(self, backend: OpenAICompatibleBackend, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        self._backend = backend
        self._method, self._url, self._headers, self._body = method, url, headers, body
        self._response: PassthroughResponse | None = None

    async def __aenter__(self) -> PassthroughResponse:
        backend = self._backend
        try:
            try:
                self._response = await backend._relay(self._method, self._url, self._headers, self._body)
            except httpx2.TransportError as exc:
                raise backend_error_from(exc) from exc
        except BackendError as error:
            _name_error(error, backend.name, backend.url)
            raise
        return self._response

    async def __aexit__(self, *exc_info: object) -> None:
        response, self._response = self._response, None
        if response is not None and not response.close_now():
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 2):
                await response.aclose()


def _joined(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Raw response headers by lower-case name, a repeated one's values joined (as httpx2's)."""
    head: dict[str, str] = {}
    for name, value in raw:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        head[key] = f"{head[key]}, {text}" if key in head else text
    return head


def _without_signatures(body: dict[str, Any]) -> dict[str, Any]:
    """The body without `reasoning_signature` (an Anthropic backend's, in a history that moved
    here): no Chat Completions server knows the field, and strict ones refuse unknown fields."""
    messages = body.get("messages") or ()
    if not any("reasoning_signature" in message for message in messages if isinstance(message, dict)):
        return body
    cleaned = [
        {k: v for k, v in message.items() if k != "reasoning_signature"} if isinstance(message, dict) else message
        for message in messages
    ]
    return {**body, "messages": cleaned}


def _unstreamed(body: dict[str, Any]) -> dict[str, Any]:
    """The chat body without what only a generation needs (streaming, its length)."""
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options", "max_tokens", "max_completion_tokens")}


def _has_media(body: dict[str, Any]) -> bool:
    """Whether a message carries a part that is not text (an image, audio, a file)."""
    return any(
        isinstance(part, dict) and part.get("type") != "text"
        for message in body.get("messages") or ()
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
    )


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else None


def _whole(value: Any) -> int | None:
    """A token count, if `value` is one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _refuses_reasoning_content(error: BackendStatusError) -> bool:
    return error.backend_status in (400, 422) and "reasoning_content" in error.message


def _without_reasoning_content(body: dict[str, Any]) -> dict[str, Any]:
    """`body` itself when no message carries reasoning_content, else a copy without it."""
    messages = body.get("messages") or []
    if not any("reasoning_content" in m for m in messages):
        return body
    cleaned = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
    return {**body, "messages": cleaned}


async def read_bounded(response: Http1Response | httpx2.Response) -> bytes:
    """An error body, at most its first bytes (a backend's error page can be large)."""
    data = bytearray()
    with map_backend_errors():
        async for chunk in response.stream:  # type: ignore[union-attr]
            data += chunk
            if len(data) >= _MAX_ERROR_BODY:
                break
    return bytes(data[:_MAX_ERROR_BODY])
