"""HTTP pieces the routes share: request bodies, paging, SSE bodies for stored responses, passthrough.

Owns how a request body is read (decompressed, bounded), how lists are
paged, how stored or running responses become SSE bodies, the WebSocket
error envelope, and the body that relays `/v1/{path}` to the backend.
Nothing here decides the Responses protocol.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from urllib.parse import quote
from typing import Any, cast

import orjson
import trio
from quart import Response, current_app, request

from .backends import PassthroughBackend
from .transport.background import TERMINAL, BackgroundJob
from .drain import Drain
from .errors import BackendTimeout, GatewayError, InvalidRequest, RequestTooLarge, ShuttingDown, error_json, report
from .store import StoredResponse
from .transport.sse import DeferredHeadBody
from .streams.sse import encode_done, encode_event
from .streams.usage import UsageMeter

__all__ = [
    "PassthroughBody",
    "body_bytes",
    "event_stream",
    "follow_job",
    "follow_store",
    "int_arg",
    "once",
    "page",
    "passthrough_path",
    "ws_error",
]

log = logging.getLogger("gateway")


def event_stream(body: Any) -> Response:
    response = Response(body, status=200, content_type="text/event-stream")
    response.headers["cache-control"] = "no-cache"
    response.timeout = None
    return response


async def once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def follow_job(job: BackgroundJob, after: int) -> AsyncIterator[bytes]:
    """A running job's events after `after`, live, until it ends (the job goes on if the client leaves)."""
    index = 0
    while True:
        changed = job.changed_event()
        new = job.events[index:]
        index += len(new)
        data = b"".join(encode_event(e) for e in new if e.get("sequence_number", 0) > after)
        if data:
            yield data
        if job.finished.is_set() and index >= len(job.events):
            break
        await changed.wait()
    yield encode_done()


STORE_POLL = 0.5


async def follow_store(
    load: Callable[[str], Awaitable[StoredResponse | None]], response_id: str, after: int
) -> AsyncIterator[bytes]:
    """Follow a response another instance is running, through the store's saves.

    `load` reads the record (ending it first when its instance died).
    """
    while True:
        record = await load(response_id)
        if record is None:
            break
        new = [e for e in record.events if e.get("sequence_number", 0) > after]
        if new:
            after = new[-1]["sequence_number"]
            yield b"".join(encode_event(e) for e in new)
        if record.response.get("status") in TERMINAL:
            break
        await trio.sleep(STORE_POLL)
    yield encode_done()


def passthrough_path(path: str) -> str:
    """The part of `/v1/{path}` a passthrough may forward, ready for a URL.

    `path` arrives decoded (`%2e%2e` is already `..`).  Dot-segments are
    resolved and empty segments dropped; a path that would leave `/v1`, or
    that carries control characters, is refused.  Each segment is
    percent-encoded again, so the backend's URL parser cannot read a new
    structure into it.

    Raises:
        InvalidRequest: `invalid_path`.
    """
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise InvalidRequest("The request path contains control characters.", code="invalid_path")
    segments: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not segments:
                raise InvalidRequest("The request path leaves /v1.", code="invalid_path")
            segments.pop()
            continue
        segments.append(segment)
    if not segments:
        raise InvalidRequest("The request path names nothing under /v1.", code="invalid_path")
    return "/".join(quote(segment, safe="") for segment in segments)


def ws_error(status: int, code: str, message: str, *, param: str | None = None, type: str | None = None) -> dict[str, Any]:
    """The spec's WebSocket error envelope (`type`: the error's own, else by status)."""
    kind = type or ("invalid_request_error" if status < 500 else "server_error")
    return {"type": "error", "status": status, "error": {"type": kind, "code": code, "message": message, "param": param}}


def int_arg(name: str, default: int, *, low: int | None = None, high: int | None = None) -> int:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"Invalid value for '{name}': expected an integer.", param=name, code="invalid_type") from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidRequest(f"Invalid value for '{name}': out of range.", param=name, code="invalid_value")
    return value


def page(items: list[dict[str, Any]]) -> dict[str, Any]:
    """One page of a list in OpenAI's cursor shape (limit, order, after, before)."""
    limit = int_arg("limit", 20, low=1, high=100)
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("Invalid value for 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value")
    ordered = items if order == "asc" else list(reversed(items))
    ids = [item.get("id") for item in ordered]
    start, end = 0, len(ordered)
    for name in ("after", "before"):
        cursor = request.args.get(name)
        if cursor:
            if cursor not in ids:
                raise InvalidRequest(f"No item with id '{cursor}' in this list.", param=name, code="invalid_value")
            if name == "after":
                start = ids.index(cursor) + 1
            else:
                end = ids.index(cursor)
    window = ordered[start:end]
    data = window[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].get("id") if data else None,
        "last_id": data[-1].get("id") if data else None,
        "has_more": len(window) > limit,
    }


async def body_bytes() -> bytes:
    """The request body, decompressed when the client sent it compressed (Codex sends zstd).

    Raises:
        RequestTooLarge: the decompressed body passes the configured limit or ratio.
        InvalidRequest: an unknown or corrupt encoding.
    """
    data = await request.get_data(as_text=False)
    raw = data if isinstance(data, bytes) else data.encode()
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return raw
    settings = getattr(current_app, "settings")
    return decompress(raw, encoding, settings.max_request_body_bytes, max_ratio=settings.max_decompression_ratio)


# A compressed body may always inflate this far; beyond it, at most `max_ratio` times
# its own size (JSON compresses 5-20 times; a bomb, a thousand).
RATIO_FLOOR = 8 * 1024 * 1024


def decompress(raw: bytes, encoding: str, limit: int, *, max_ratio: float) -> bytes:
    """`raw` decompressed, never holding more than it may inflate to.

    Raises:
        RequestTooLarge: it inflates past `limit`, or past `max_ratio` times its size once
            past `RATIO_FLOOR` (refused as soon as the bound is reached, before parsing).
        InvalidRequest: an unknown encoding, or bytes that are not what the header says.
    """
    import zlib

    allowed = min(limit, max(RATIO_FLOOR, int(len(raw) * max_ratio)))
    out: bytes | None
    try:
        if encoding == "zstd":
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(raw) as reader:
                out = reader.read(allowed + 1)
        elif encoding in ("gzip", "deflate"):
            out = _inflate(raw, 31 if encoding == "gzip" else 15, allowed + 1)
        else:
            raise InvalidRequest(
                f"Unsupported Content-Encoding '{encoding}': use zstd, gzip, deflate or none.",
                param="content-encoding",
                code="unsupported_encoding",
            )
    except GatewayError:
        raise
    except Exception:  # zlib.error, zstandard.ZstdError: the bytes are not what the header says
        raise InvalidRequest(
            f"The request body is not valid {encoding} data.", param="content-encoding", code="invalid_encoding"
        ) from None
    if out is None or len(out) > allowed:
        if allowed < limit:  # a small body that inflates out of all proportion
            raise RequestTooLarge(
                f"The compressed request body inflates more than {max_ratio:g} times its size "
                f"(MAX_DECOMPRESSION_RATIO) past {RATIO_FLOOR} bytes."
            )
        raise RequestTooLarge(f"The decompressed request body exceeds the limit of {limit} bytes.")
    return out


def _inflate(raw: bytes, window: int, most: int) -> bytes | None:
    """gzip or deflate, a MiB at a time (zlib's own growth of one large output buffer would hold
    twice the bound); None once it reaches `most` bytes."""
    import zlib

    inflater = zlib.decompressobj(window)
    pieces: list[bytes] = []
    size = 0
    data = raw
    while size < most:
        piece = inflater.decompress(data, min(1 << 20, most - size))
        pieces.append(piece)
        size += len(piece)
        data = inflater.unconsumed_tail
        if inflater.eof or (not piece and not data):
            break
    return None if size >= most else b"".join(pieces)


_SHUTTING_DOWN = "The gateway shut down before the backend's answer finished; send the request again."


class PassthroughBody(DeferredHeadBody):
    """Relays one `/v1/{path}` request to the backend, streaming the answer.

    The body is watched as it passes (`UsageMeter`): `on_close` hears the
    tokens it reported (None when it reported none; 0 for an error answer
    that generated nothing).  A backend that sends no data (in an event
    stream, comments and keep-alives are not data) for its read timeout
    (`STREAM_TIMEOUT`) ends the body: an event stream with an `error`
    event (`backend_timeout`) and `[DONE]` after the last whole event.  A
    drain that runs out of time stops it the same way (`server_shutting_down`);
    before the backend answered, the client gets a 503.
    """

    def __init__(
        self,
        backend: PassthroughBackend,
        method: str,
        path: str,
        query: bytes,
        headers: dict[str, str],
        body: bytes,
        *,
        on_close: Callable[[int | None], Awaitable[None]] | None = None,
        drain: Drain | None = None,
    ) -> None:
        """`on_close` runs once the body is done, with the tokens it reported (a stream slot to
        give back, a reservation to settle)."""
        self._backend = backend
        self._on_close = on_close
        self._drain = drain
        self._path = path
        self._args = (method, path, query, headers, body)
        self._cm: Any = None
        self._upstream: Any = None
        self._error: bytes | None = None
        self._status = 502
        self._chunks: Any = None
        self._meter: UsageMeter | None = None
        self._events = False  # the answer is an event stream
        self._read: trio.CancelScope | None = None  # around the read in progress
        self._stopped = False
        self._ending = b""  # what an event stream needs before a last event (a blank line)
        self._data_timeout: float | None = None
        self._data_at = 0.0  # when data last came

    async def __aenter__(self) -> PassthroughBody:
        if self._drain is not None:
            self._drain.track(self)
        cm = self._backend.open_passthrough(*self._args)
        try:
            with trio.CancelScope() as self._read:
                if self._stopped:
                    self._read.cancel()
                self._upstream = await cm.__aenter__()
        except GatewayError as error:
            report(error, f"relaying /v1/{self._path}")
            self._error, self._status = error_json(error), error.status
        else:
            if self._read.cancelled_caught:
                stopping = ShuttingDown(_SHUTTING_DOWN)
                self._error, self._status, self._upstream = error_json(stopping), stopping.status, None
                return self
            self._cm = cm
            self._chunks = self._upstream.__aiter__()
            self._events = "text/event-stream" in str(self._upstream.headers.get("content-type", ""))
            self._meter = UsageMeter(events=self._events)
            self._data_timeout = getattr(self._upstream, "data_timeout", None)
            self._data_at = trio.current_time()
        finally:
            self._read = None
        return self

    def cancel(self) -> None:
        """Stop (a drain out of time): the read in progress ends, and so does the body."""
        self._stopped = True
        if self._read is not None:
            self._read.cancel()

    async def head(self) -> tuple[int, dict[str, str]]:
        if self._upstream is None:
            return self._status, {"content-type": "application/json"}
        if self._upstream.status >= 500:  # the backend's own answer, passed on: the log says whose
            log.warning(
                "relayed /v1/%s: %s answered %d", self._path, getattr(self._upstream, "backend", "the backend"), self._upstream.status
            )
        return self._upstream.status, self._upstream.headers

    def __aiter__(self) -> PassthroughBody:
        return self

    async def __anext__(self) -> bytes:
        if self._error is not None:
            answer, self._error = self._error, None
            return answer
        if self._chunks is None:
            raise StopAsyncIteration
        ending: GatewayError | None = None
        if self._stopped:
            ending = ShuttingDown(_SHUTTING_DOWN)
        else:
            data: bytes | None = None
            with trio.CancelScope() as self._read:  # cancelled by a drain out of time, or the data deadline
                if self._data_timeout:
                    self._read.deadline = self._data_at + self._data_timeout
                data = await self._next_chunk()
            self._read = None
            if data is not None:
                assert self._meter is not None
                if self._meter.feed(data):
                    self._data_at = trio.current_time()
                if self._events:
                    self._ending = b"" if data.endswith((b"\n\n", b"\r\n\r\n")) else b"\n\n"
                return data
            if self._stopped:
                ending = ShuttingDown(_SHUTTING_DOWN)
            else:
                log.warning(
                    "the backend sent no data for %g s on a relayed /v1/%s; the body is ended", self._data_timeout, self._path
                )
                ending = BackendTimeout(f"the backend sent no data for {self._data_timeout:g} s")
        self._chunks = None
        if not self._events:
            raise StopAsyncIteration
        return self._ending + b"data: " + error_json(ending) + b"\n\n" + encode_done()

    async def _next_chunk(self) -> bytes:
        try:
            return cast(bytes, await self._chunks.__anext__())
        except StopAsyncIteration:
            raise
        except Exception as error:  # the backend dropped mid-body; nothing more can be said
            log.warning("passthrough body from the backend was cut (%s)", type(error).__name__)
            raise StopAsyncIteration from None

    def tokens(self) -> int | None:
        """The tokens the answer reported; 0 for an error answer that reported none."""
        reported = self._meter.tokens if self._meter is not None else None
        if reported is None and (self._upstream is None or self._upstream.status >= 400):
            return 0  # refused or never reached: nothing was generated
        return reported

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._drain is not None:
                self._drain.untrack(self)
            if self._cm is not None:
                await self._cm.__aexit__(exc_type, exc, tb)
        finally:
            if self._on_close is not None:
                with trio.CancelScope(shield=True):
                    await self._on_close(self.tokens())
