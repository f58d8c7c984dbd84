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


def validate_event(event: dict[str, Any]) -> None:
    kind = event["type"]
    name = EVENT_SCHEMAS[kind]
    candidate = event
    if kind.startswith("response.reasoning_text."):
        candidate = dict(event, type=kind.replace("reasoning_text", "reasoning"))
    _cached_validator(name).validate(candidate)


def validate_response(response: dict[str, Any]) -> None:
    _cached_validator("ResponseResource").validate(response)
