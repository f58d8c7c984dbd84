"""Intake: a request's bytes and headers become a typed request and its context, once.

    RequestContext     who asks (the caller the edge identified), the request
                       id, and whether the gateway's tools are wanted (the
                       body's `gateway_tools` and the `x-gateway-tools` header)
    read_body          an ASGI request's body, bounded in size and time
    decode_body        a body as sent, decompressed (zstd, gzip, deflate),
                       bounded by size and by ratio before anything parses it
    create_request     a `POST /v1/responses` body (or a compaction request)
    ws_create_request  a WebSocket `response.create` frame
    chat_request       a `POST /v1/chat/completions` body
    tool_outputs_request  a `submit_tool_outputs` body, as the request it makes
    relay_path         a `/v1/{path}` made safe to forward
    page, int_arg      list arguments (`limit`, `order`, `after`, `before`)

Every door uses these, so each body is decoded and validated once, by the
same strict JSON parser (`wire.decode_json_object`).  Knows headers, bodies
and the wire models; nothing of turns or transports.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import trio

from .errors import GatewayError, InvalidRequest, RequestTooLarge
from .keys import ANONYMOUS, Caller
from .server.ext import HTTP11, extension
from .wire import CreateResponseRequest, decode_json_object, validate_create_request

__all__ = [
    "RATIO_FLOOR",
    "RequestContext",
    "chat_request",
    "create_request",
    "decode_body",
    "discard_body",
    "flag_arg",
    "gateway_tools_wanted",
    "header",
    "int_arg",
    "page",
    "read_body",
    "relay_path",
    "tool_outputs_request",
    "ws_create_request",
]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


@dataclass(frozen=True)
class RequestContext:
    """What the edge learnt of a request, for the turn it starts."""

    caller: Caller = ANONYMOUS
    request_id: str | None = None
    tools_header: str = ""  # x-gateway-tools
    arrived: float | None = None  # trio time the edge saw the request (None: a WebSocket's frames)

    @classmethod
    def of(cls, scope: Any) -> RequestContext:
        """The context of an ASGI scope the edge has seen (its notes in `scope["gateway"]`)."""
        notes = scope.get("gateway") or {}
        caller = notes.get("caller", ANONYMOUS)
        header = next((v for n, v in scope.get("headers", ()) if n == b"x-gateway-tools"), b"")
        arrived = notes.get("arrived") if scope.get("type") == "http" else None
        return cls(
            caller if isinstance(caller, Caller) else ANONYMOUS, notes.get("request_id"), header.decode("latin-1"), arrived
        )

    def gateway_tools(self, flag: Any = None) -> bool:
        """Whether the gateway's tools are wanted, given the body's `gateway_tools` field."""
        return gateway_tools_wanted(flag, self.tools_header)


def gateway_tools_wanted(flag: Any, header: str = "") -> bool:
    """`"gateway_tools": false|"none"` in a body, or `x-gateway-tools: none`, opt out of the gateway's tools."""
    return flag not in (False, "none") and header.lower() not in ("none", "off", "false")


# --- bodies ---------------------------------------------------------------------------------


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


# --- requests -------------------------------------------------------------------------------


def create_request(body: bytes) -> CreateResponseRequest:
    """A `POST /v1/responses` (or `/v1/responses/compact`) body as a typed request.

    Raises:
        InvalidRequest: malformed JSON, JSON nested too deeply, or a field of
            the wrong type; `param` names the field.
    """
    return validate_create_request(decode_json_object(body))


# What a WebSocket `response.create` may carry that the socket itself decides:
# clients (Codex, the Agents SDKs) send `stream` and `stream_options` in every
# frame, and OpenAI ignores them; a background response cannot run on a socket.
_WS_IGNORED = ("stream", "stream_options")


def ws_create_request(frame: bytes) -> tuple[CreateResponseRequest, dict[str, Any]]:
    """A WebSocket `response.create` frame as a typed request, and the frame's fields.

    Raises:
        InvalidRequest: not a JSON object (`invalid_json`), another event type
            (`invalid_event_type`), `background` (not in WebSocket mode), or
            a field of the wrong type.
    """
    message = decode_json_object(frame)
    if message.get("type") != "response.create":
        raise InvalidRequest("Send response.create events.", param="type", code="invalid_event_type")
    if "background" in message:
        raise InvalidRequest("'background' is not allowed in WebSocket mode.", param="background", code="invalid_request")
    body = {k: v for k, v in message.items() if k != "type" and k not in _WS_IGNORED}
    return validate_create_request(body), body


# What a submit_tool_outputs continuation takes over from the response it continues.
_CARRIED_SETTINGS = (
    "model", "instructions", "tools", "tool_choice", "text", "reasoning", "temperature", "top_p",
    "max_output_tokens", "parallel_tool_calls", "store", "metadata",
)


def tool_outputs_request(body: bytes, previous: Mapping[str, Any]) -> CreateResponseRequest:
    """A `submit_tool_outputs` body (the required_action protocol) as the request that continues
    `previous` (a stored response): its tool outputs as input, its settings carried over.

    Raises:
        InvalidRequest: no `tool_outputs`, an entry without `tool_call_id`, an output that is
            not a string, or `stream` that is not a boolean.
    """
    data = decode_json_object(body)
    outputs = data.get("tool_outputs")
    if not isinstance(outputs, list) or not outputs:
        raise InvalidRequest.missing("tool_outputs")
    items = []
    for index, entry in enumerate(outputs):
        if not isinstance(entry, dict) or not isinstance(entry.get("tool_call_id"), str):
            raise InvalidRequest.missing(f"tool_outputs[{index}].tool_call_id")
        output = entry.get("output", "")
        if not isinstance(output, str):
            raise InvalidRequest("'output' must be a string.", param=f"tool_outputs[{index}].output", code="invalid_type")
        items.append({"type": "function_call_output", "call_id": entry["tool_call_id"], "output": output})
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean.", param="stream", code="invalid_type")
    carried = {key: previous[key] for key in _CARRIED_SETTINGS if previous.get(key) is not None}
    return validate_create_request({**carried, "previous_response_id": previous["id"], "input": items, "stream": stream})


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


def chat_request(body: bytes) -> dict[str, Any]:
    """A `POST /v1/chat/completions` body (decoded, `messages` present).

    Raises:
        InvalidRequest: not a JSON object, or no `messages` list.
    """
    data = decode_json_object(body)
    if not isinstance(data.get("messages"), list):
        raise InvalidRequest.missing("messages")
    return data


# --- paths and queries ----------------------------------------------------------------------


def relay_path(path: str) -> str:
    """The part of `/v1/{path}` a relayed request may forward, ready for a URL.

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


def int_arg(args: Mapping[str, str], name: str, default: int, *, low: int | None = None, high: int | None = None) -> int:
    """A whole-number query argument.

    Raises:
        InvalidRequest: not a number (`invalid_type`), or out of range (`invalid_value`).
    """
    raw = args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"Invalid value for '{name}': expected an integer.", param=name, code="invalid_type") from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidRequest(f"Invalid value for '{name}': out of range.", param=name, code="invalid_value")
    return value


def flag_arg(args: Mapping[str, str], name: str) -> bool:
    """A yes/no query argument (`?stream=true`)."""
    return args.get(name, "").lower() in ("true", "1")


def page(items: list[dict[str, Any]], args: Mapping[str, str]) -> dict[str, Any]:
    """One page of a list in OpenAI's cursor shape (`limit` 1-100, `order`, `after`, `before`).

    Raises:
        InvalidRequest: an argument out of range, or a cursor naming no item of the list.
    """
    limit = int_arg(args, "limit", 20, low=1, high=100)
    order = args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("Invalid value for 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value")
    ordered = items if order == "asc" else list(reversed(items))
    ids = [item.get("id") for item in ordered]
    start, end = 0, len(ordered)
    for name in ("after", "before"):
        cursor = args.get(name)
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
