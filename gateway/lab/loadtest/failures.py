"""What a failed request's server said: the error's code, as a label, and its message, as a sample
safe to print.

It owns the reading of OpenAI- and Anthropic-shaped errors from a non-2xx body (`body_failure`)
and from one SSE frame (`frame_failure`). It is called only once a failure was already seen, so
parsing JSON here costs nothing on success. It knows nothing of sockets, framing or how frames
are found: it gets bytes and returns text.
"""

from __future__ import annotations

import re

import orjson

__all__ = ["MAX_ERROR_BODY", "body_failure", "error_fields", "frame_failure"]

# How much of a non-2xx body or of one error frame is kept to find the error's code: the rest of
# a large body is still read (to keep the connection) but not stored.
MAX_ERROR_BODY = 65536

_ERROR_SAMPLE = 300
_CODE_CHARS = re.compile(r"[^\w.:/-]")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def body_failure(body: bytes) -> tuple[str | None, str]:
    """(code, message) of a non-2xx response's body (at most `MAX_ERROR_BODY` bytes of it): the
    JSON error's, or no code and the start of the body as text when it is not a JSON error."""
    code, message = error_fields(_loads(body))
    if not message:
        message = _sample(body[:_ERROR_SAMPLE].decode("utf-8", "replace"))
    return code, message


def frame_failure(frame: bytes) -> tuple[str | None, str]:
    """(code, message) of an `error` or `response.failed` SSE frame, a chat error chunk, or
    Anthropic's `error` event; either may be missing."""
    return error_fields(_frame_json(frame))


def error_fields(data: object) -> tuple[str | None, str]:
    """(code, message) of an OpenAI-shaped error, either may be missing: `{"error": {...}}` (a
    JSON error body, a chat error chunk), a `response.failed` event's `response.error`, or an
    `error` event's own `code` and `message`; or an Anthropic-shaped error, `{"type": "error",
    "error": {"type": ..., "message": ...}}` (a body or an `error` event), whose error's `type`
    is its code. The code becomes a label (at most 64 characters of letters, digits and
    `_.:/-`); the message a printable sample."""
    if not isinstance(data, dict):
        return None, ""
    error = data.get("error")
    if isinstance(error, str):  # `{"error": "text"}`, as some servers send
        return None, _sample(error)
    if isinstance(error, dict) and "code" not in error and data.get("type") == "error":
        error = {**error, "code": error.get("type")}  # Anthropic's: its type is what a code says
    response = data.get("response")
    candidates = [error, response.get("error") if isinstance(response, dict) else None, data]
    code: str | None = None
    message = ""
    for candidate in candidates:
        if not isinstance(candidate, dict):
            continue
        value = candidate.get("code")
        if code is None and isinstance(value, (str, int)) and not isinstance(value, bool):
            code = _CODE_CHARS.sub("_", str(value).strip())[:64] or None
        text = candidate.get("message")
        if not message and isinstance(text, str):
            message = _sample(text)
    return code, message


def _sample(text: str) -> str:
    """`text` cut to a sample and made safe to print: control characters (a terminal's escape
    sequences among them) and line separators are shown escaped."""
    text = text[:_ERROR_SAMPLE]
    return _UNPRINTABLE.sub(lambda match: match[0].encode("unicode_escape").decode("ascii"), text)


def _loads(data: bytes) -> object:
    """JSON, or None when `data` is not (a truncated body is not)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _frame_json(frame: bytes) -> object:
    """The JSON in an SSE frame's `data:` lines (joined with LF, as the SSE spec says)."""
    data = []
    for line in frame.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    return _loads(b"\n".join(data)) if data else None
