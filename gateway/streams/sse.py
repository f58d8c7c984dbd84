"""Server-sent events: an incremental decoder and the encoder.

The decoder works on bytes: it splits lines on CR, LF and CRLF only (never on
U+2028 or other Unicode separators, which may appear inside JSON strings;
UTF-8 never puts CR or LF bytes inside a multi-byte character, so splitting
bytes is safe), handles a CR at the end of one read and an LF at the start
of the next, and caps the size of one event.  It knows nothing about what
the events mean.

Its cost is linear in the bytes fed, however long a line is: a read that
ends no line is set aside, not joined to what came before, and a line is
put together once, when its end arrives (joining the tail at every read
made a 16 MiB line cost seconds of CPU, and stalled every stream of the
process meanwhile).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

__all__ = [
    "OBFUSCATED",
    "SSEDecoder",
    "SSEEvent",
    "SSETooLarge",
    "encode_comment",
    "encode_done",
    "encode_event",
    "event_json",
    "obfuscated",
]

_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSETooLarge(ValueError):
    """One event grew past the decoder's limit."""


@dataclass(slots=True)
class SSEEvent:
    event: str | None
    data: bytes


class SSEDecoder:
    """Feed bytes with `decode`, get complete events; `flush` at end of input."""

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._max = max_event_bytes
        self._buffer = b""  # the unfinished line (and, on the hot path, the unfinished event)
        self._more: list[bytes] = []  # reads that ended no line, after `_buffer`: joined once, at its end
        self._more_size = 0
        self._at_start = True
        self._data: list[bytes] = []
        self._size = 0
        self._event: str | None = None

    def decode(self, chunk: bytes) -> list[SSEEvent]:
        """Events completed by `chunk`.

        Limits, the same however the input is cut: no line longer than
        `max_event_bytes`, no event whose data adds up to more.

        Raises:
            SSETooLarge: a limit was passed.
        """
        if self._buffer and self._set_aside(chunk):
            return []
        buffer = self._joined(chunk) if self._more else self._buffer + chunk if self._buffer else chunk
        if self._at_start:
            if len(buffer) < 3 and b"\xef\xbb\xbf".startswith(buffer):
                self._buffer = buffer  # may still be a byte order mark
                return []
            self._at_start = False
            if buffer.startswith(b"\xef\xbb\xbf"):  # one leading BOM is not content
                buffer = buffer[3:]
        events: list[SSEEvent] = []
        if b"\r" not in buffer:
            # The common case (LF only): a plain split is several times faster,
            # and a whole event that is one `data: ` line needs no line parsing.
            if self._data or self._event is not None:
                rest = self._lines(buffer, events)  # in the middle of an event: line by line
            else:
                frames = buffer.split(b"\n\n")
                rest = frames.pop()
                limit = self._max
                for frame in frames:
                    if frame[:6] == b"data: " and len(frame) < limit and frame.find(b"\n") < 0:
                        events.append(SSEEvent(None, frame[6:]))
                    else:
                        for line in frame.split(b"\n"):
                            self._line(line, events)
                        self._dispatch(events)  # the blank line that ended the frame
                if b"\n" in rest:  # complete lines of an event not yet ended
                    rest = self._lines(rest, events)
        else:
            start = 0
            end = len(buffer)
            for match in _LINE_END.finditer(buffer):
                # A CR as the very last byte may be the first half of a CRLF.
                if match.group() == b"\r" and match.end() == end:
                    break
                self._line(buffer[start : match.start()], events)
                start = match.end()
            rest = buffer[start:]
        if len(rest) - rest.endswith(b"\r") > self._max:
            raise SSETooLarge(f"a line exceeded {self._max} bytes")
        self._buffer = rest
        return events

    def decode_data(self, chunk: bytes) -> list[bytes]:
        """The data of the events completed by `chunk` (their names dropped): `decode`'s, the
        same however the input is cut.

        The hot path of a chat stream: when every complete event in the
        buffer is a single `data: ` line, LF-ended, the payloads are cut out
        by one split and checked by one count, without an object per event.

        Raises:
            SSETooLarge: as `decode`.
        """
        payloads = self._data_lines(chunk)
        return payloads if payloads is not None else [event.data for event in self.decode(chunk)]

    def _data_lines(self, chunk: bytes) -> list[bytes] | None:
        """`decode_data`'s hot path; None (nothing changed) where it does not apply."""
        if self._buffer and self._set_aside(chunk):
            return []
        if self._more:
            self._buffer = self._joined(b"")
        buffer = self._buffer + chunk if self._buffer else chunk
        if self._at_start or self._data or self._event is not None or b"\r" in buffer:
            return None
        end = buffer.rfind(b"\n\n") + 2
        if end < 8 or end > self._max or buffer[:6] != b"data: ":
            return None
        whole = buffer[:end]
        payloads = whole[6:-2].split(b"\n\ndata: ")
        if whole.count(b"\n") != 2 * len(payloads):  # an event of other lines, or other fields
            return None
        rest = buffer[end:]
        if b"\n" in rest:
            # Complete lines of an event not yet ended: after the last blank line there is
            # none, so they only begin the next event (no event completes here).
            rest = self._lines(rest, [])
        if len(rest) > self._max:  # (no CR in the buffer)
            raise SSETooLarge(f"a line exceeded {self._max} bytes")
        self._buffer = rest
        return payloads

    def _set_aside(self, chunk: bytes) -> bool:
        """Keep `chunk` aside, unjoined, when it only continues an unfinished line (no CR or LF
        in it, and none just before it that an LF could complete).

        Raises:
            SSETooLarge: the line passed the limit.
        """
        buffer = self._buffer
        if not buffer or self._at_start or b"\n" in chunk or b"\r" in chunk:
            return False
        last = self._more[-1] if self._more else buffer
        if last[-1:] == b"\r":
            return False
        self._more.append(chunk)
        self._more_size += len(chunk)
        if len(buffer) + self._more_size > self._max:
            raise SSETooLarge(f"a line exceeded {self._max} bytes")
        return True

    def _joined(self, chunk: bytes) -> bytes:
        """The unfinished tail and `chunk`, as one piece (each byte set aside is joined once)."""
        if self._more:
            buffer = b"".join([self._buffer, *self._more, chunk])
            self._more, self._more_size = [], 0
            return buffer
        return self._buffer + chunk if self._buffer else chunk

    def flush(self) -> list[SSEEvent]:
        """End of input: a last event without its blank line still counts."""
        self._buffer = self._joined(b"")
        events: list[SSEEvent] = []
        if self._at_start and b"\xef\xbb\xbf".startswith(self._buffer):
            self._buffer = b""
        if self._buffer:
            line, self._buffer = self._buffer.rstrip(b"\r"), b""
            self._line(line, events)
        self._dispatch(events)
        return events

    def _lines(self, text: bytes, events: list[SSEEvent]) -> bytes:
        """Each complete LF-ended line of `text`; returns the unfinished rest."""
        lines = text.split(b"\n")
        rest = lines.pop()
        for line in lines:
            self._line(line, events)
        return rest

    def _line(self, line: bytes, events: list[SSEEvent]) -> None:
        if not line:
            self._dispatch(events)
            return
        if len(line) > self._max:
            raise SSETooLarge(f"a line exceeded {self._max} bytes")
        if line[0] == 0x3A:  # ':' comment
            return
        field, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._size += len(value) + 1
            if self._size > self._max:
                raise SSETooLarge(f"an event exceeded {self._max} bytes")
            self._data.append(value)
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
        # id, retry and unknown fields do not matter to a relay of chat chunks.

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._data:
            data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
            events.append(SSEEvent(self._event, data))
        self._data = []
        self._size = 0
        self._event = None


def encode_event(event: dict) -> bytes:
    """One Responses event as a whole SSE frame: `event:` equals `data.type`.

    orjson escapes nothing that could break a line: it never emits a raw CR
    or LF inside a JSON document.
    """
    return b"event: %b\ndata: %b\n\n" % (event["type"].encode(), event_json(event))


def event_json(event: dict) -> bytes:
    """One event as JSON, always.

    Requests are refused when they nest too deeply, but an event can still
    carry what a backend or an MCP server sent (a tool schema).  Rather
    than fail the stream, parts nested beyond what the encoder takes are
    cut, and values it cannot encode become strings.
    """
    try:
        return orjson.dumps(event)
    except TypeError:
        return orjson.dumps(_cut_deep(event, _SAFE_DEPTH), default=str)


_SAFE_DEPTH = 100
_CUT = "[nested too deeply]"


def _cut_deep(value: object, levels: int) -> object:
    if isinstance(value, dict):
        return {key: _cut_deep(item, levels - 1) for key, item in value.items()} if levels else _CUT
    if isinstance(value, list):
        return [_cut_deep(item, levels - 1) for item in value] if levels else _CUT
    return value


def encode_comment(text: str = "keep-alive") -> bytes:
    return b": " + text.encode() + b"\n\n"


def encode_done() -> bytes:
    return b"data: [DONE]\n\n"


# The delta events that carry `obfuscation` when a stream asks for it (`stream_options.include_obfuscation`).
OBFUSCATED = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
    }
)
_PAD_TO = 32  # a delta and its padding together fill a multiple of this many characters
_PAD_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def obfuscated(event: dict, noise: bytes) -> dict:
    """`event` with an `obfuscation` field, if it is a delta event: characters drawn from
    `noise` (random bytes, at least `_PAD_TO` of them) padding its delta to the next multiple of
    `_PAD_TO` characters (one to `_PAD_TO` of them), so that the event's size says less of the
    text.  A copy: the event as kept (stored, replayed) is unchanged.  Pure: the caller brings the
    randomness."""
    if event.get("type") not in OBFUSCATED:
        return event
    delta = event.get("delta")
    size = _PAD_TO - (len(delta) % _PAD_TO if isinstance(delta, str) else 0)
    pad = bytes(_PAD_ALPHABET[b % len(_PAD_ALPHABET)] for b in noise[:size]).decode("ascii")
    return {**event, "obfuscation": pad}
