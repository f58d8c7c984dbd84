"""HTTP/1.1 response framing for the load generator: the head and the three kinds of body.

It owns the parsing of a response's status line and headers (`parse_head`), the choice of body
framing (`decoder_for`) and the incremental body decoders, chunked (`ChunkedDecoder`,
RFC 9112 section 7.1), `content-length` and until-close. Everything here is synchronous and
raises `ValueError` on bytes that are not valid framing. It knows nothing of sockets, SSE, time
or the load test's error kinds: the client feeds it bytes and names the failures.

Why not an HTTP library: the load generator shares a small machine with the server it
measures, so its cost per stream must be tiny: the framing is parsed here, by a few byte
comparisons per read, and nothing else is.
"""

from __future__ import annotations

import re

__all__ = ["BodyDecoder", "ChunkedDecoder", "LengthDecoder", "UntilCloseDecoder", "decoder_for", "parse_head"]

_MAX_CHUNK_LINE = 4096

# A chunk-size line: hex digits, optional extensions (ignored), CRLF or bare LF.
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r?\n")

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedDecoder:
    """Incremental decoder of a `transfer-encoding: chunked` body (RFC 9112 section 7.1).

    `feed(data)` returns the payload bytes decoded so far; `done` turns true after the last
    chunk and its trailer section; bytes after that are kept in `leftover`. Bare LF line ends
    are accepted. Raises `ValueError` on malformed framing.
    """

    __slots__ = ("done", "leftover", "_state", "_remaining", "_pending")

    def __init__(self) -> None:
        self.done = False
        self.leftover = b""
        self._state = _SIZE
        self._remaining = 0
        self._pending = b""  # an incomplete size/trailer line, or a lone CR after a chunk

    def feed(self, data: bytes) -> bytes:
        state = self._state
        if state == _DONE:
            self.leftover += data
            return b""
        if self._pending:
            data = self._pending + data
            self._pending = b""
        out: list[bytes] = []
        remaining = self._remaining
        pos = 0
        end = len(data)
        while pos < end:
            if state == _SIZE:
                match = _SIZE_LINE.match(data, pos)
                if match is None:
                    if data.find(b"\n", pos) >= 0:
                        raise ValueError(f"bad chunk size line {data[pos : pos + 40]!r}")
                    if end - pos > _MAX_CHUNK_LINE:
                        raise ValueError("chunk size line too long")
                    self._pending = data[pos:]
                    break
                size = int(match[1], 16)
                pos = match.end()
                if not size:
                    state = _TRAILER
                    continue
                stop = pos + size
                # The usual case, a whole chunk in this read, takes one turn of the loop.
                if stop + 1 < end and data[stop] == 0x0D and data[stop + 1] == 0x0A:
                    out.append(data[pos:stop])
                    pos = stop + 2
                    continue
                state = _DATA
                remaining = size
            elif state == _DATA:
                take = min(remaining, end - pos)
                out.append(data[pos : pos + take])
                pos += take
                remaining -= take
                if not remaining:
                    state = _DATA_END
            elif state == _DATA_END:
                if data[pos] == 0x0A:  # bare LF
                    pos += 1
                elif data[pos] == 0x0D:
                    if pos + 1 == end:
                        self._pending = data[pos:]
                        break
                    if data[pos + 1] != 0x0A:
                        raise ValueError("chunk data not followed by CRLF")
                    pos += 2
                else:
                    raise ValueError("chunk data longer than its size")
                state = _SIZE
            else:  # _TRAILER: field lines until an empty line
                newline = data.find(b"\n", pos)
                if newline < 0:
                    if end - pos > _MAX_CHUNK_LINE:
                        raise ValueError("trailer line too long")
                    self._pending = data[pos:]
                    break
                line = data[pos:newline]
                pos = newline + 1
                if line == b"" or line == b"\r":
                    state = _DONE
                    self.done = True
                    self.leftover = data[pos:]
                    break
        self._state = state
        self._remaining = remaining
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    def eof(self) -> None:
        """The connection closed; raises `ValueError` unless the body was complete."""
        if not self.done:
            raise ValueError("connection closed inside a chunked body")


class LengthDecoder:
    """A body of `content-length` bytes."""

    __slots__ = ("done", "leftover", "_remaining")

    def __init__(self, length: int) -> None:
        self._remaining = length
        self.done = length == 0
        self.leftover = b""

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.leftover += data
            return b""
        if len(data) < self._remaining:
            self._remaining -= len(data)
            return data
        body, self.leftover = data[: self._remaining], data[self._remaining :]
        self._remaining = 0
        self.done = True
        return body

    def eof(self) -> None:
        if not self.done:
            raise ValueError("connection closed before content-length bytes")


class UntilCloseDecoder:
    """A body delimited by the server closing the connection (HTTP/1.0 style)."""

    __slots__ = ("done", "leftover")

    def __init__(self) -> None:
        self.done = False
        self.leftover = b""

    def feed(self, data: bytes) -> bytes:
        return data

    def eof(self) -> None:
        self.done = True


BodyDecoder = ChunkedDecoder | LengthDecoder | UntilCloseDecoder


def parse_head(head: bytes) -> tuple[int, dict[bytes, bytes], bool]:
    """(status, headers by lower-case name, whether the connection may be kept alive) of a
    response head without its final blank line. Raises `ValueError` for a bad status or header
    line."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    status = int(parts[1])
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError(f"bad header line {line[:80]!r}")
        key = name.strip().lower()
        value = value.strip()
        # Repeated headers are joined as RFC 9110 allows for list-valued fields.
        headers[key] = headers[key] + b", " + value if key in headers else value
    connection = headers.get(b"connection", b"").lower()
    if parts[0] == b"HTTP/1.0":
        keep_alive = b"keep-alive" in connection
    else:
        keep_alive = b"close" not in connection
    return status, headers, keep_alive


def decoder_for(status: int, headers: dict[bytes, bytes]) -> BodyDecoder | None:
    """The body framing; None when the body runs until the connection closes. Raises
    `ValueError` for a transfer-encoding other than chunked or a bad content-length."""
    if status in (204, 304):
        return LengthDecoder(0)
    encoding = headers.get(b"transfer-encoding")
    if encoding is not None:
        if encoding.lower().rsplit(b",", 1)[-1].strip() != b"chunked":
            raise ValueError(f"unsupported transfer-encoding {encoding!r}")
        return ChunkedDecoder()
    length = headers.get(b"content-length")
    if length is not None:
        if not length.isdigit():
            raise ValueError(f"bad content-length {length!r}")
        return LengthDecoder(int(length))
    return None
