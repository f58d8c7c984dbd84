"""Request bodies parsed into the wire models, once, by the strict JSON parser
(`wire.decode_json_object`): a Responses create (or compaction) body, a WebSocket
`response.create` frame, a `submit_tool_outputs` body, a chat completion body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidRequest
from . import CreateResponseRequest, decode_json_object, validate_create_request

__all__ = ["chat_request", "create_request", "tool_outputs_request", "ws_create_request"]


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


def chat_request(body: bytes) -> dict[str, Any]:
    """A `POST /v1/chat/completions` body (decoded, `messages` present).

    Raises:
        InvalidRequest: not a JSON object, or no `messages` list.
    """
    data = decode_json_object(body)
    if not isinstance(data.get("messages"), list):
        raise InvalidRequest.missing("messages")
    return data
