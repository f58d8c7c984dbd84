"""A request's body, read once: bounded in size and in time, decompressed (zstd, gzip, deflate)
bounded by size and by ratio before anything parses it.  The dispatcher and the edge use these;
nothing here knows a route."""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import trio

from ..errors import GatewayError, InvalidRequest, RequestTooLarge
from ..server.ext import HTTP11, extension

__all__ = ["RATIO_FLOOR", "decode_body", "discard_body", "header", "read_body"]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


def _body_ready(scope: Any) -> bool:
    """The gateway's own server holds the whole body already (its `gateway.http11` extension)."""
    offered = extension(scope, HTTP11)
    return offered is not None and offered["body_ready"]()


async def read_body(receive: Receive, limit: int, timeout: float, scope: Any = None) -> bytes | None:
    """The request's body, whole; None when the client left before sending it all.

    With the request's `scope`, a body the server already holds whole is
    taken without a timer (no cancel scope on the path of every request).

    Raises:
        RequestTooLarge: it passes `limit` bytes.
        InvalidRequest: it did not arrive within `timeout` (`body_timeout`).
    """
    parts: list[bytes] = []
    size = 0
    if scope is not None and _body_ready(scope):
        message = await receive()
        if message["type"] != "http.request":  # the client left
            return None
        chunk: bytes = message.get("body", b"")
        if len(chunk) > limit:
            raise RequestTooLarge(f"The request body exceeds the limit of {limit} bytes.")
        if not message.get("more_body", False):
            return chunk
        parts.append(chunk)  # (not whole after all: the rest is read as on any server)
        size = len(chunk)
    with trio.move_on_after(timeout):
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestTooLarge(f"The request body exceeds the limit of {limit} bytes.")
            parts.append(chunk)
            if not message.get("more_body", False):
                return parts[0] if len(parts) == 1 else b"".join(parts)
    raise InvalidRequest(f"The request body did not arrive within {timeout:g} s.", code="body_timeout")


# A compressed body may always inflate this far; beyond it, at most `max_ratio` times
# its own size (JSON compresses 5-20 times; a bomb, a thousand).
RATIO_FLOOR = 8 * 1024 * 1024


def decode_body(raw: bytes, encoding: str, limit: int, *, max_ratio: float) -> bytes:
    """`raw` as sent with `Content-Encoding: encoding`, decompressed, never holding more than it may
    inflate to.

    Raises:
        RequestTooLarge: it inflates past `limit`, or past `max_ratio` times its size once
            past `RATIO_FLOOR` (refused as soon as the bound is reached, before parsing).
        InvalidRequest: an unknown encoding, or bytes that are not what the header says.
    """
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
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


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str:
    """One header's value (latin-1), or ''."""
    return next((v for n, v in headers if n == name), b"").decode("latin-1")


async def discard_body(receive: Receive, limit: int = 1 << 20, timeout: float = 10.0) -> None:
    """Read (and drop) the rest of a refused request's body, at most `limit` bytes: answering
    while the server is still parsing the request races its own handling of what follows."""
    seen = 0
    with trio.move_on_after(timeout):
        while seen <= limit:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            seen += len(message.get("body", b""))
