"""Validation of emitted events and responses against the Open Responses spec.

Loads ../shared/spec/openresponses-openapi.json (or tests/openresponses-openapi.json
when the shared folder is not beside the checkout) once.  Two documented
adjustments, both artefacts of the spec's generator rather than intent:
- `JsonSchemaResponseFormat.schema` is typed `null`; the echoed schema is an object.
- OpenAI's reasoning event names (`response.reasoning_text.*`) are validated
  with the spec's `response.reasoning.*` schemas.
"""

from __future__ import annotations

import copy
import json
import pathlib
from functools import cache
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

HERE = pathlib.Path(__file__).parent
CANDIDATES = [
    HERE.parent.parent / "shared" / "spec" / "openresponses-openapi.json",
    HERE / "openresponses-openapi.json",
]

EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedStreamingEvent",
    "response.queued": "ResponseQueuedStreamingEvent",
    "response.in_progress": "ResponseInProgressStreamingEvent",
    "response.completed": "ResponseCompletedStreamingEvent",
    "response.failed": "ResponseFailedStreamingEvent",
    "response.incomplete": "ResponseIncompleteStreamingEvent",
    "response.output_item.added": "ResponseOutputItemAddedStreamingEvent",
    "response.output_item.done": "ResponseOutputItemDoneStreamingEvent",
    "response.content_part.added": "ResponseContentPartAddedStreamingEvent",
    "response.content_part.done": "ResponseContentPartDoneStreamingEvent",
    "response.output_text.delta": "ResponseOutputTextDeltaStreamingEvent",
    "response.output_text.done": "ResponseOutputTextDoneStreamingEvent",
    "response.refusal.delta": "ResponseRefusalDeltaStreamingEvent",
    "response.refusal.done": "ResponseRefusalDoneStreamingEvent",
    "response.reasoning.delta": "ResponseReasoningDeltaStreamingEvent",
    "response.reasoning.done": "ResponseReasoningDoneStreamingEvent",
    "response.reasoning_text.delta": "ResponseReasoningDeltaStreamingEvent",
    "response.reasoning_text.done": "ResponseReasoningDoneStreamingEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaStreamingEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneStreamingEvent",
    "error": "ErrorStreamingEvent",
}


def spec_path() -> pathlib.Path:
    for candidate in CANDIDATES:
        if candidate.exists():
            return candidate
    raise FileNotFoundError("openresponses-openapi.json not found beside the checkout or in tests/")


@cache
def _registry() -> tuple[Registry, dict[str, Any]]:
    document = json.loads(spec_path().read_text())
    document = copy.deepcopy(document)
    schemas = document["components"]["schemas"]
    schemas["JsonSchemaResponseFormat"]["properties"]["schema"] = {"anyOf": [{"type": "object"}, {"type": "null"}]}
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    return Registry().with_resource("spec", resource), schemas


def _validator(name: str) -> jsonschema.Draft202012Validator:
    registry, _ = _registry()
    return jsonschema.Draft202012Validator({"$ref": f"spec#/components/schemas/{name}"}, registry=registry)


@cache
def _cached_validator(name: str) -> jsonschema.Draft202012Validator:
    return _validator(name)


# OpenAI's MCP extensions (not in the Open Responses spec), in OpenAI's published shapes.
_STR = {"type": "string"}
_NULLABLE_STR = {"anyOf": [{"type": "string"}, {"type": "null"}]}
_ITEM_EVENT = {"type": "object", "required": ["type", "sequence_number", "item_id", "output_index"]}
EXTENSION_EVENTS: dict[str, dict[str, Any]] = {
    "response.mcp_call_arguments.delta": {**_ITEM_EVENT, "required": [*_ITEM_EVENT["required"], "delta"]},
    "response.mcp_call_arguments.done": {**_ITEM_EVENT, "required": [*_ITEM_EVENT["required"], "arguments"]},
    "response.mcp_call.in_progress": _ITEM_EVENT,
    "response.mcp_call.completed": _ITEM_EVENT,
    "response.mcp_call.failed": _ITEM_EVENT,
    "response.mcp_list_tools.in_progress": _ITEM_EVENT,
    "response.mcp_list_tools.completed": _ITEM_EVENT,
    "response.mcp_list_tools.failed": _ITEM_EVENT,
    "response.custom_tool_call_input.delta": {**_ITEM_EVENT, "required": [*_ITEM_EVENT["required"], "delta"]},
    "response.custom_tool_call_input.done": {**_ITEM_EVENT, "required": [*_ITEM_EVENT["required"], "input"]},
}
EXTENSION_ITEMS: dict[str, dict[str, Any]] = {
    "mcp_call": {
        "type": "object",
        "required": ["id", "type", "server_label", "name", "arguments"],
        "properties": {"id": _STR, "server_label": _STR, "name": _STR, "arguments": _STR, "output": _NULLABLE_STR, "error": _NULLABLE_STR},
    },
    "mcp_list_tools": {
        "type": "object",
        "required": ["id", "type", "server_label", "tools"],
        "properties": {"id": _STR, "server_label": _STR, "tools": {"type": "array"}},
    },
    "custom_tool_call": {
        "type": "object",
        "required": ["id", "type", "call_id", "name", "input"],
        "properties": {"id": _STR, "call_id": _STR, "name": _STR, "input": _STR},
    },
    "mcp_approval_request": {
        "type": "object",
        "required": ["id", "type", "server_label", "name", "arguments"],
        "properties": {"id": _STR, "server_label": _STR, "name": _STR, "arguments": _STR},
    },
}


def _without_extensions(response: dict[str, Any]) -> dict[str, Any]:
    output = []
    for item in response.get("output") or []:
        schema = EXTENSION_ITEMS.get(item.get("type"))
        if schema is None:
            output.append(item)
        else:
            jsonschema.validate(item, schema)
    return dict(response, output=output)


def validate_event(event: dict[str, Any]) -> None:
    kind = event["type"]
    if kind in EXTENSION_EVENTS:
        jsonschema.validate(event, EXTENSION_EVENTS[kind])
        return
    if kind in ("response.output_item.added", "response.output_item.done") and event["item"]["type"] in EXTENSION_ITEMS:
        jsonschema.validate(event["item"], EXTENSION_ITEMS[event["item"]["type"]])
        return
    if "response" in event:
        event = dict(event, response=_without_extensions(event["response"]))
    name = EVENT_SCHEMAS[kind]
    candidate = event
    if kind.startswith("response.reasoning_text."):
        candidate = dict(event, type=kind.replace("reasoning_text", "reasoning"))
    _cached_validator(name).validate(candidate)


def validate_response(response: dict[str, Any]) -> None:
    _cached_validator("ResponseResource").validate(_without_extensions(response))


TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def check_events(events: list[dict[str, Any]]) -> dict[str, Any]:
    """One response's events are spec-valid, numbered 0, 1, 2, ..., and end with their one
    terminal event; returns the final response."""
    assert all(isinstance(e, dict) for e in events)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        validate_event(event)
    terminals = [e for e in events if e["type"] in TERMINAL_EVENTS]
    assert len(terminals) == 1 and terminals[0] is events[-1]
    validate_response(terminals[0]["response"])
    return dict(terminals[0]["response"])
