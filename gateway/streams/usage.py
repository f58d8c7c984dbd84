"""The tokens a relayed answer reports, read off its bytes as they pass.

A body relayed as the backend sends it (the `/v1/{path}` passthrough, a
chat completion relayed as bytes) is never decoded as a whole; this meter
watches it go by and finds the `usage` it reports, so that the key's
tokens are counted like everyone else's: in an event stream, the last
`data:` event that carries one (Chat Completions with `include_usage`,
completions, Anthropic's `message_start` and `message_delta`); in a JSON
body, the top-level `usage` object, looked for in the body's tail (usage
comes last in OpenAI's and Anthropic's answers, and embeddings can be
megabytes long).  It also tells which chunks carried data, for the relay's
`STREAM_TIMEOUT`: in an event stream, comments and keep-alives are not data.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

__all__ = ["UsageMeter", "usage_tokens"]

_TAIL = 256 * 1024  # of a JSON body: where its usage is looked for
_MAX_LINE = 1 << 20  # an event line longer than this is not looked into
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')


def usage_tokens(usage: Any) -> int | None:
    """Total tokens of a usage object in OpenAI's or Anthropic's shape, or None."""
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int) and _count(total):
        return total
    parts = [usage.get(name) for name in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")]
    counted = [part for part in parts if isinstance(part, int) and _count(part)]
    return sum(counted) if counted else None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class UsageMeter:
    """Feed it each relayed chunk (`feed`, which says whether the chunk carried data); `tokens`
    once the body has ended."""

    def __init__(self, *, events: bool) -> None:
        self.events = events
        self._line: list[bytes] = []  # an event stream's unfinished line, in the pieces it came in
        self._line_size = 0
        self._tail = bytearray()  # a JSON body's last bytes
        self._usage: dict[str, Any] = {}

    def feed(self, data: bytes) -> bool:
        """Watch one chunk go by; whether it carried data (any bytes, or in an event stream a
        `data:` line)."""
        if not self.events:
            self._tail += data
            if len(self._tail) > 2 * _TAIL:
                del self._tail[:-_TAIL]
            return bool(data)
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1  # the chunk's whole lines end here
        if not end:
            # It ends no line: set aside (joined once, when the line ends), unless the line is
            # already past what is looked into.  Linear in the bytes, however long the line.
            if self._line_size <= _MAX_LINE:
                self._line.append(data)
                self._line_size += len(data)
            return False
        if self._line and self._line_size <= _MAX_LINE:
            head = b"".join(self._line)
            buf, cut = head + data, len(head) + end
            self._line, self._line_size = [], 0
        elif self._line:  # a line too long to look into: its end is not a line of its own
            skip = min(_found_or(data.find(b"\n"), end), _found_or(data.find(b"\r"), end)) + 1
            buf, cut = data[skip:], end - skip
            self._line, self._line_size = [], 0
        else:
            buf, cut = data, end
        if cut < len(buf):
            self._line, self._line_size = [buf[cut:]], len(buf) - cut
        carried = buf.startswith(b"data:", 0, cut) or buf.find(b"\ndata:", 0, cut) >= 0 or buf.find(b"\rdata:", 0, cut) >= 0
        # Only an event whose usage is an object is read: streams that ask for usage carry
        # `"usage":null` in every chunk, and parsing each would cost the relay a JSON decode per
        # event.  One pass over the lines finds the first (none, almost always).
        first = _USAGE_OBJECT.search(buf, 0, cut)
        if first is not None:
            line_end = -1  # of the last line looked into
            for found in _USAGE_OBJECT.finditer(buf, first.start(), cut):
                at = found.start()
                if at < line_end:
                    continue  # (another usage object on a line already read)
                start = max(buf.rfind(b"\n", 0, at), buf.rfind(b"\r", 0, at)) + 1
                line_end = min(_found_or(buf.find(b"\n", at, cut), cut), _found_or(buf.find(b"\r", at, cut), cut))
                if buf.startswith(b"data:", start):
                    self._take(buf[start + 5 : line_end].strip())
        return carried

    def _take(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        usage = event.get("usage")
        if usage is None and isinstance(event.get("message"), dict):  # Anthropic's message_start
            usage = event["message"].get("usage")
        if isinstance(usage, dict):
            # Anthropic reports input tokens at the start and output tokens at the end: keep both.
            self._usage.update({k: v for k, v in usage.items() if _count(v)})
            if "total_tokens" not in usage:
                self._usage.pop("total_tokens", None)

    @property
    def usage(self) -> dict[str, int] | None:
        """The usage the body reported, as `input_tokens`, `output_tokens` and `total_tokens` (None
        when it reported none, so far)."""
        found = self._usage if self.events else _json_usage(bytes(self._tail))
        total = usage_tokens(found) if found else None
        if total is None or not isinstance(found, dict):
            return None
        given = lambda *names: next((found[n] for n in names if _count(found.get(n))), 0)  # noqa: E731
        return {
            "input_tokens": int(given("prompt_tokens", "input_tokens")),
            "output_tokens": int(given("completion_tokens", "output_tokens")),
            "total_tokens": total,
        }

    @property
    def tokens(self) -> int | None:
        """The tokens the body reported, or None when it reported none (so far)."""
        usage = self.usage
        return usage["total_tokens"] if usage is not None else None


def _found_or(index: int, default: int) -> int:
    return default if index < 0 else index


def _json_usage(tail: bytes) -> Any:
    """The last `"usage": {...}` object in `tail`, decoded, or None."""
    at = tail.rfind(b'"usage"')
    while at >= 0:
        start = tail.find(b"{", at)
        end = _object_end(tail, start) if start >= 0 else -1
        if end > 0 and not tail[at + 7 : start].strip(b" \t\r\n:"):
            try:
                return orjson.loads(tail[start:end])
            except orjson.JSONDecodeError:
                pass
        at = tail.rfind(b'"usage"', 0, at)
    return None


def _object_end(data: bytes, start: int) -> int:
    """The index after the JSON object that opens at `start`, or -1."""
    depth = 0
    in_string = False
    escaped = False
    for index in range(start, len(data)):
        byte = data[index]
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte == 0x7B:
            depth += 1
        elif byte == 0x7D:
            depth -= 1
            if depth == 0:
                return index + 1
    return -1
