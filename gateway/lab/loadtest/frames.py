"""SSE frames, found and classified by bytes: the per-stream counts of the load generator.

It owns `FrameScanner`, which cuts a decoded body into frames at blank lines and counts events,
keep-alives, text events, the terminal event and `[DONE]`, with each event's time; and one
classifier per API, the only part that knows an API's event names: the Responses API's events,
Chat Completions chunks and Anthropic's Messages events. `DIALECTS` pairs each API with its
classifier and with what must end a successful stream. It knows nothing of sockets or HTTP
framing: it is fed body bytes with the time they arrived.

No JSON is parsed per event, because the load generator's cost per stream must stay tiny next
to the server it measures: each frame is classified by a few byte comparisons (the `event:`
line, `"content":"`, `"text_delta"`, a leading `:` for comments, `[DONE]`). Frames of one read
share that read's timestamp. Only a failure frame is parsed, to read its code (`failures.py`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass

from .failures import MAX_ERROR_BODY, frame_failure

__all__ = [
    "DIALECTS",
    "TERMINAL_NAMES",
    "Classifier",
    "Dialect",
    "FrameScanner",
    "classify_chat",
    "classify_messages",
    "classify_responses",
]

# A server that never sends a blank line would otherwise grow the frame buffer without bound.
_MAX_FRAME = 16 * 1024 * 1024
# Error frames parsed per stream while none has given a code (the gateway sends an `error` event
# and then `response.failed`); a server repeating codeless error frames costs no more than this.
_MAX_FAILURE_FRAMES = 4

# What a classifier says of one frame; `FrameScanner.terminal` keeps the last terminal kind.
# A keep-alive is an SSE comment, or Anthropic's `ping` event: counted as a heartbeat, not an event.
_OTHER, _KEEP_ALIVE, _DONE_FRAME, _TEXT, _COMPLETED, _INCOMPLETE, _STOPPED, _FAILED = range(8)
TERMINAL_NAMES = {_COMPLETED: "response.completed", _INCOMPLETE: "response.incomplete", _STOPPED: "message_stop"}

# Event names after `event: `; the trailing newline keeps prefixes of longer names from matching.
_RESPONSES_EVENT_KINDS: tuple[tuple[bytes, int], ...] = (
    (b"response.output_text.delta\n", _TEXT),
    (b"response.output_text.delta\r", _TEXT),
    (b"response.completed\n", _COMPLETED),
    (b"response.completed\r", _COMPLETED),
    (b"response.incomplete\n", _INCOMPLETE),
    (b"response.incomplete\r", _INCOMPLETE),
    (b"response.failed\n", _FAILED),
    (b"response.failed\r", _FAILED),
    (b"error\n", _FAILED),
    (b"error\r", _FAILED),
)
# For servers that send `data:` lines without `event:` lines.
_RESPONSES_TYPE_KINDS: tuple[tuple[bytes, int], ...] = (
    (b'"type":"response.output_text.delta"', _TEXT),
    (b'"type":"response.completed"', _COMPLETED),
    (b'"type":"response.incomplete"', _INCOMPLETE),
    (b'"type":"response.failed"', _FAILED),
    (b'"type":"error"', _FAILED),
)

# Anthropic's Messages events (it names every event). A `content_block_delta` is text only when
# its delta is a `text_delta` (not `input_json_delta`, `thinking_delta`, `signature_delta`).
_MESSAGES_DELTA = b"content_block_delta"
_MESSAGES_TEXT_DELTA = b'"text_delta"'  # inside a JSON string its quotes would be escaped
_MESSAGES_EVENT_KINDS: tuple[tuple[bytes, int], ...] = (
    (b"ping\n", _KEEP_ALIVE),
    (b"ping\r", _KEEP_ALIVE),
    (b"message_stop\n", _STOPPED),
    (b"message_stop\r", _STOPPED),
    (b"error\n", _FAILED),
    (b"error\r", _FAILED),
)


def _is_done(buf: bytearray, start: int) -> bool:
    return buf.startswith(b"data: [DONE]", start) or buf.startswith(b"data:[DONE]", start)


def classify_responses(buf: bytearray, start: int, end: int) -> int:
    """The kind of the Responses API frame `buf[start:end]`, by its `event:` line, or by its
    `"type"` when the server sends `data:` lines only."""
    first = buf[start]
    if first == 0x3A:  # ":"
        return _KEEP_ALIVE
    if first == 0x65 and buf.startswith(b"event:", start):  # "e"
        name = _event_name(buf, start)
        for prefix, kind in _RESPONSES_EVENT_KINDS:
            if buf.startswith(prefix, name):
                return kind
        return _OTHER
    if _is_done(buf, start):
        return _DONE_FRAME
    for needle, kind in _RESPONSES_TYPE_KINDS:
        if buf.find(needle, start, end) >= 0:
            return kind
    return _OTHER


def classify_chat(buf: bytearray, start: int, end: int) -> int:
    """The kind of the Chat Completions frame `buf[start:end]`: text, `[DONE]`, an error chunk."""
    if buf[start] == 0x3A:
        return _KEEP_ALIVE
    # Text chunks are most frames, so they are recognised first; an error chunk has no
    # `"content":` and `[DONE]` is not JSON.
    at = buf.find(b'"content":', start, end)
    if at >= 0:
        at += 10
        if buf[at] == 0x20:
            at += 1
        # `"content":""` (the role chunk) and `"content":null` carry no text.
        if buf[at] == 0x22 and buf[at + 1] != 0x22:
            return _TEXT
        return _OTHER
    if _is_done(buf, start):
        return _DONE_FRAME
    if buf.startswith(b'data: {"error"', start) or buf.startswith(b'data:{"error"', start):
        return _FAILED
    if buf.startswith(b"event: error", start):
        return _FAILED
    return _OTHER


def classify_messages(buf: bytearray, start: int, end: int) -> int:
    """The kind of the Messages API frame `buf[start:end]`, by its `event:` line: a
    `content_block_delta` with a `text_delta`, `message_stop` (the terminal event), `error`, and
    `ping` (a keep-alive). A frame without an `event:` line is a comment or nothing known."""
    first = buf[start]
    if first == 0x3A:
        return _KEEP_ALIVE
    if first == 0x65 and buf.startswith(b"event:", start):
        name = _event_name(buf, start)
        # Text deltas are most frames, so they are recognised first.
        if buf.startswith(_MESSAGES_DELTA, name):
            return _TEXT if buf.find(_MESSAGES_TEXT_DELTA, name, end) >= 0 else _OTHER
        for prefix, kind in _MESSAGES_EVENT_KINDS:
            if buf.startswith(prefix, name):
                return kind
    return _OTHER


def _event_name(buf: bytearray, start: int) -> int:
    """Where the name of the `event:` line at `start` begins (after one optional space)."""
    name = start + 6
    if buf[name] == 0x20:
        name += 1
    return name


Classifier = Callable[[bytearray, int, int], int]


@dataclass(frozen=True)
class Dialect:
    """An API's event vocabulary: how its frames are classified, and what ends a successful
    stream, `[DONE]` (`ends_with_done`) or a terminal event (`TERMINAL_NAMES`), as `ending`
    says it in a `no_terminal` error."""

    classify: Classifier
    ends_with_done: bool
    ending: str


DIALECTS: dict[str, Dialect] = {
    "responses": Dialect(classify_responses, False, "response.completed/incomplete"),
    "chat": Dialect(classify_chat, True, "[DONE]"),
    "messages": Dialect(classify_messages, False, "message_stop"),
}


class FrameScanner:
    """Cuts a body into SSE frames at blank lines and keeps the per-stream counters."""

    __slots__ = (
        "_buf",
        "_classify",
        "_sep",
        "_t_start",
        "_last_event",
        "gaps",
        "first_event",
        "first_text",
        "events",
        "heartbeats",
        "terminal",
        "failed",
        "done",
        "error_code",
        "error_message",
        "_failure_frames",
    )

    def __init__(self, classify: Classifier, t_start: float) -> None:
        self._buf = bytearray()
        self._classify = classify
        self._sep = b""  # decided on the first line end: b"\n\n" or b"\r\n\r\n"
        self._t_start = t_start
        self._last_event = 0.0
        self.gaps = array("d")
        self.first_event: float | None = None
        self.first_text: float | None = None
        self.events = 0
        self.heartbeats = 0
        self.terminal = 0
        self.failed = False
        self.done = False
        self.error_code: str | None = None
        self.error_message = ""
        self._failure_frames = 0

    def feed(self, data: bytes, now: float) -> None:
        """Count the frames completed by `data`, which arrived at `now` (`time.perf_counter()`).
        Raises `ValueError` when a frame grows beyond 16 MiB without ending."""
        buf = self._buf
        buf += data
        sep = self._sep
        if not sep:
            newline = buf.find(b"\n")
            if newline < 0:
                return
            sep = self._sep = b"\r\n\r\n" if newline and buf[newline - 1] == 0x0D else b"\n\n"
        step = len(sep)
        classify = self._classify
        start = 0
        while True:
            end = buf.find(sep, start)
            if end < 0:
                break
            while start < end and buf[start] in (0x0A, 0x0D):  # stray blank lines
                start += 1
            if start < end:
                kind = classify(buf, start, end)
                if kind == _KEEP_ALIVE:
                    self.heartbeats += 1
                elif kind == _DONE_FRAME:
                    self.done = True
                else:
                    if self.events:
                        self.gaps.append(now - self._last_event)
                    else:
                        self.first_event = now - self._t_start
                    self._last_event = now
                    self.events += 1
                    if kind == _TEXT:
                        if self.first_text is None:
                            self.first_text = now - self._t_start
                    elif kind == _FAILED:
                        self.failed = True
                        if self.error_code is None and self._failure_frames < _MAX_FAILURE_FRAMES:
                            self._read_failure(bytes(buf[start : min(end, start + MAX_ERROR_BODY)]))
                    elif kind != _OTHER:
                        self.terminal = kind
            start = end + step
        if start:
            del buf[:start]
        if len(buf) > _MAX_FRAME:
            raise ValueError(f"an SSE frame exceeded {_MAX_FRAME} bytes")

    def _read_failure(self, frame: bytes) -> None:
        """Keep the first code and message of an `error`/`response.failed` frame or chat error
        chunk. Only failure frames get here, so parsing their JSON costs nothing on success."""
        self._failure_frames += 1
        code, message = frame_failure(frame)
        self.error_code = code
        if not self.error_message:
            self.error_message = message
