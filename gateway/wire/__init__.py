"""Wire models: what clients may send, in one place.

Inbound models accept unknown fields (clients send more than the spec names)
and are only as strict as needed to give a clear 400 naming the parameter.
Outbound objects are plain dicts built by the translator: the hot path does
not validate per event.  `TypeAdapter`s are built once, at import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import orjson
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError

from ..errors import InvalidRequest

__all__ = [
    "AssistantPart",
    "CreateResponseRequest",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "InputItem",
    "ItemReference",
    "MessageItem",
    "OtherItem",
    "MAX_JSON_DEPTH",
    "ReasoningItem",
    "RelayedBody",
    "decode_json_object",
    "model_of",
    "nested_deeper_than",
    "parse_create_request",
    "read_relayed_body",
    "validate_create_request",
]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- content parts -----------------------------------------------------------


class InputText(_Open):
    type: Literal["input_text"]
    text: str


class InputImage(_Open):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class InputFile(_Open):
    type: Literal["input_file"]
    filename: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    file_id: str | None = None


class OutputText(_Open):
    type: Literal["output_text", "text", "summary_text", "reasoning_text"]
    text: str


class Refusal(_Open):
    type: Literal["refusal"]
    refusal: str


class OtherPart(_Open):
    type: str


def _part_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind == "input_text":
        return "input_text"
    if kind == "input_image":
        return "input_image"
    if kind == "input_file":
        return "input_file"
    if kind in ("output_text", "text", "summary_text", "reasoning_text"):
        return "output_text"
    if kind == "refusal":
        return "refusal"
    return "other"


ContentPart = Annotated[
    Union[
        Annotated[InputText, Tag("input_text")],
        Annotated[InputImage, Tag("input_image")],
        Annotated[InputFile, Tag("input_file")],
        Annotated[OutputText, Tag("output_text")],
        Annotated[Refusal, Tag("refusal")],
        Annotated[OtherPart, Tag("other")],
    ],
    Discriminator(_part_tag),
]
AssistantPart = OutputText | Refusal


# --- input items -------------------------------------------------------------


class MessageItem(_Open):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(_Open):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = ""
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Open):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class ReasoningItem(_Open):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ContentPart] = []
    content: list[ContentPart] | None = None
    encrypted_content: str | None = None


class ItemReference(_Open):
    type: Literal["item_reference"] | None = "item_reference"
    id: str


class OtherItem(_Open):
    type: str


def _item_tag(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("type")
        if kind is None:
            return "message" if "role" in value else "item_reference" if "id" in value else "message"
    else:
        kind = getattr(value, "type", None)
    if kind in ("message", "function_call", "function_call_output", "reasoning", "item_reference"):
        return kind
    return "other"


InputItem = Annotated[
    Union[
        Annotated[MessageItem, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
        Annotated[ReasoningItem, Tag("reasoning")],
        Annotated[ItemReference, Tag("item_reference")],
        Annotated[OtherItem, Tag("other")],
    ],
    Discriminator(_item_tag),
]


# --- the request ---------------------------------------------------------------


# "minimal" is not in the spec's enum but OpenAI accepts it and clients send it.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


ReasoningSummary = Literal["concise", "detailed", "auto"]


class ReasoningParam(_Open):
    effort: ReasoningEffort | None = None
    summary: ReasoningSummary | None = None
    generate_summary: ReasoningSummary | None = None  # OpenAI's deprecated name for `summary`
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    mode: str | None = None


class TextParam(_Open):
    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class StreamOptionsParam(_Open):
    include_obfuscation: bool | None = None


class PromptCacheOptionsParam(_Open):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: str | None = None
    prewarm: bool | None = None
    comparison_response_id: str | None = None


class ImageOptionsParam(_Open):
    context_compression: Literal["auto", "enabled", "disabled"] | None = None


class AccessProgramsParam(_Open):
    cyber: str | None = None


class BackgroundOptionsParam(_Open):
    completion_window: Literal["soonest", "2h", "8h"] | None = None
    continuation_id: str | None = None


class CreateResponseRequest(_Open):
    """`CreateResponseBody` of the Open Responses specification and OpenAI's additions, leniently.

    What becomes of each field (forwarded, done by the gateway, echoed or
    refused) is decided in one table, `gateway.turn.plan.REQUEST_FIELDS`.
    """

    model: str | None = None
    input: str | list[InputItem] | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    text: TextParam | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    parallel_tool_calls: bool | None = None
    stream: bool | None = False
    stream_options: StreamOptionsParam | None = None
    background: bool | None = False
    max_output_tokens: int | None = Field(None, ge=16)
    max_tool_calls: int | None = Field(None, ge=1)
    reasoning: ReasoningParam | None = None
    safety_identifier: str | None = Field(None, max_length=64)
    prompt_cache_key: str | None = Field(None, max_length=64)
    truncation: Literal["auto", "disabled"] | None = None
    instructions: str | list[InputItem] | None = None
    store: bool | None = True
    service_tier: str | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    user: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptionsParam | None = None
    image: ImageOptionsParam | None = None
    access_programs: AccessProgramsParam | None = None
    background_options: BackgroundOptionsParam | None = None
    context_management: Any = None  # read by `turn.plan.compaction_threshold`, which names what is wrong
    # Refused whenever they ask for something (see REQUEST_FIELDS); any shape is read as asking.
    prompt: Any = None
    moderation: Any = None


_REQUEST = TypeAdapter(CreateResponseRequest)


# How deeply a request's JSON may nest.  Far below what the encoder allows
# (orjson stops at 254 levels): parts of a request are echoed inside events
# and stored records, a few levels further down.  Real tool schemas stay
# within a dozen levels.
MAX_JSON_DEPTH = 64


def _encoder_depth() -> int:
    """The deepest nesting orjson encodes (254 today), found once at import."""
    low, high = 1, 4096
    while low < high:
        mid = (low + high + 1) // 2
        nested: list[Any] = []
        for _ in range(mid - 1):
            nested = [nested]
        try:
            orjson.dumps(nested)
        except TypeError:
            high = mid - 1
        else:
            low = mid
    return low


_MARGIN = _encoder_depth() - MAX_JSON_DEPTH


def decode_json_object(body: bytes | str) -> dict[str, Any]:
    """A request body as a JSON object, nested at most `MAX_JSON_DEPTH` levels.

    Raises:
        InvalidRequest: not JSON (`invalid_json`), not an object, or nested
            too deeply (`nesting_too_deep`, `param` names the field).
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    if isinstance(body, bytes) and body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return data  # too few brackets to nest that deep (most requests): nothing to measure
    # The encoder measures depth in C, much faster than a walk in
    # Python: wrapped in `_MARGIN` more levels, the body encodes exactly
    # when it nests at most MAX_JSON_DEPTH levels.
    wrapped: Any = data
    for _ in range(_MARGIN):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except TypeError:
        path = _too_deep(data, MAX_JSON_DEPTH - 1) or []
        param = _path_name(path[:4]) or "body"
        raise InvalidRequest(
            f"Invalid value for '{param}': JSON may nest at most {MAX_JSON_DEPTH} levels.",
            param=param,
            code="nesting_too_deep",
        ) from None
    return data


def _too_deep(value: dict[str, Any] | list[Any], levels: int) -> list[Any] | None:
    """The path to a container more than `levels` below `value`, or None.

    Recursion is bounded by `levels`; the path is built only on the way out.
    """
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        if isinstance(child, (dict, list)):
            if levels == 0:
                return [key]
            path = _too_deep(child, levels - 1)
            if path is not None:
                path.insert(0, key)
                return path
    return None


def nested_deeper_than(value: Any, levels: int) -> bool:
    """Whether containers in `value` nest more than `levels` deep (`value` itself is level 1)."""
    if not isinstance(value, (dict, list)):
        return False
    return levels < 1 or _too_deep(value, levels - 1) is not None


def _path_name(path: list[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def parse_create_request(body: bytes) -> CreateResponseRequest:
    """Decode and validate a `POST /v1/responses` body.

    Raises:
        InvalidRequest: malformed JSON, JSON nested too deeply, or a field
            of the wrong type; the error's `param` names the field
            (`input[2].content`).
    """
    return validate_create_request(decode_json_object(body))


def validate_create_request(data: dict[str, Any]) -> CreateResponseRequest:
    """Validate a decoded `POST /v1/responses` body (or a WebSocket `response.create`).

    Raises:
        InvalidRequest: a field of the wrong type; `param` names it.
    """
    try:
        # Strict: "0.5" is not a number and "yes" is not a boolean, as for OpenAI.
        return _REQUEST.validate_python(data, strict=True)
    except ValidationError as exc:
        raise invalid_request_from_pydantic(exc) from None


def invalid_request_from_pydantic(exc: ValidationError) -> InvalidRequest:
    """One clear 400 from pydantic's errors, without pydantic's wording of internals."""
    err = _most_specific(exc.errors())
    param = _param_name(err["loc"])
    kind = err["type"]
    if kind == "missing":
        return InvalidRequest.missing(param)
    if kind in ("extra_forbidden",):
        message = f"Unknown parameter: '{param}'."
        code = "unknown_parameter"
    else:
        message = f"Invalid value for '{param}': {err['msg']}."
        code = "invalid_value" if kind in _VALUE_ERRORS else "invalid_type"
    return InvalidRequest(message, param=param, code=code)


def _most_specific(errors: list[Any]) -> Any:
    # Each member of a union reports its own failure; the deepest location
    # is the one that names what the client got wrong.
    return max(errors, key=lambda e: len(_param_parts(e["loc"])))


_VALUE_ERRORS = frozenset(("greater_than_equal", "less_than_equal", "greater_than", "less_than", "literal_error", "string_too_long", "string_too_short", "too_long", "too_short"))
_UNION_MEMBER_NAMES = frozenset(("str", "int", "float", "bool", "none", "dict", "list"))


def _param_parts(loc: tuple[Any, ...]) -> list[Any]:
    parts: list[Any] = []
    after_index = False
    for part in loc:
        if isinstance(part, int):
            parts.append(part)
            after_index = True
            continue
        if after_index or part in _UNION_MEMBER_NAMES or "[" in part:
            # a union member's tag (after a list index) or a union branch name
            after_index = False
            continue
        parts.append(part)
    return parts


def _param_name(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in _param_parts(loc):
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "body"


def model_of(body: bytes) -> str | None:
    """The `model` a JSON request body names, if any: a relayed request's route (a key's model
    check reads the body with `read_relayed_body`, strictly, instead)."""
    if not body.lstrip().startswith(b"{") or b'"model"' not in body:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


@dataclass
class RelayedBody:
    """A `/v1/{path}` request body as the gateway read it, and what it forwards."""

    data: bytes  # the bytes forwarded
    content_type: str | None  # the content type of `data` when the gateway re-encoded it
    fields: dict[str, Any]  # the JSON object or form fields it holds ({} when not read)
    model: str | None  # the model it names


def read_relayed_body(raw: bytes, content_type: str, *, strict: bool) -> RelayedBody:
    """Read a relayed request's body.

    Not strict: the body is forwarded unchanged, and its model read when it
    is a JSON object.  Strict (a key whose models are limited): the body must
    be one the gateway reads whole -- a single strict JSON object (no BOM,
    `NaN`, lone surrogate or trailing data), a multipart form or a URL-encoded
    form -- and is forwarded re-encoded from what was read, so that the
    backend's parser sees exactly the model that was checked, however the
    client spelled it (escapes, a field given twice, multipart quirks).

    Raises:
        InvalidRequest: (strict) a body the gateway cannot read whole, or a
            `model` given twice or not as a string (`invalid_model_field`).
    """
    if not strict:
        return RelayedBody(raw, None, {}, model_of(raw))
    if not raw:
        return RelayedBody(raw, None, {}, None)
    mimetype, _, params = content_type.partition(";")
    mimetype = mimetype.strip().lower()
    if mimetype == "multipart/form-data":
        return _relayed_multipart(raw, content_type)
    if mimetype == "application/x-www-form-urlencoded":
        return _relayed_urlencoded(raw)
    try:
        data = decode_json_object(raw)
    except InvalidRequest:
        raise InvalidRequest(
            "This key may use only some models, so its request body must be a single JSON object "
            "(no byte order mark, NaN, lone surrogate or trailing data) or a form.",
            code="invalid_json",
        ) from None
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("Invalid value for 'model': expected a string.", param="model", code="invalid_model_field")
    return RelayedBody(orjson.dumps(data), "application/json", data, model)


def _one_model(values: list[Any]) -> str | None:
    if len(values) > 1:
        raise InvalidRequest("'model' is given more than once.", param="model", code="invalid_model_field")
    if values and not isinstance(values[0], str):
        raise InvalidRequest("Invalid value for 'model': expected a text field.", param="model", code="invalid_model_field")
    return values[0] if values else None


def _relayed_multipart(raw: bytes, content_type: str) -> RelayedBody:
    import io
    import secrets

    from werkzeug.formparser import FormDataParser
    from werkzeug.http import parse_options_header

    _, options = parse_options_header(content_type)
    unreadable = InvalidRequest("The multipart form could not be read.", code="invalid_form")
    boundary = options.get("boundary")
    if not boundary or f"--{boundary}--".encode("latin-1") not in raw:  # unclosed: werkzeug reads what it can
        raise unreadable
    try:
        _, form, files = FormDataParser().parse(io.BytesIO(raw), "multipart/form-data", len(raw), options)
    except Exception:  # werkzeug's own errors: the form is malformed
        raise unreadable from None
    model = _one_model([*form.getlist("model"), *files.getlist("model")])
    boundary = "gateway-" + secrets.token_hex(16)  # ours: the client's may occur in the fields
    out = bytearray()
    for name, value in form.items(multi=True):
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{_form_quote(name)}"\r\n\r\n'.encode()
        out += value.encode() + b"\r\n"
    for name, upload in files.items(multi=True):
        kind = _form_quote(upload.content_type or "application/octet-stream")
        filename = _form_quote(upload.filename or "file")
        out += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{_form_quote(name)}"; filename="{filename}"\r\n'
            f"Content-Type: {kind}\r\n\r\n"
        ).encode()
        out += upload.read() + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    fields = {name: value for name, value in form.items()}
    return RelayedBody(bytes(out), f"multipart/form-data; boundary={boundary}", fields, model)


def _form_quote(text: str) -> str:
    """A name or filename inside a quoted multipart header parameter (RFC 7578: percent-encoded)."""
    return text.replace("%", "%25").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


def _relayed_urlencoded(raw: bytes) -> RelayedBody:
    from urllib.parse import parse_qsl, urlencode

    try:
        pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("The URL-encoded form could not be read.", code="invalid_form") from None
    model = _one_model([value for name, value in pairs if name == "model"])
    return RelayedBody(urlencode(pairs).encode(), "application/x-www-form-urlencoded", dict(pairs), model)
